"""What every bench run that starts its own services shares: the record's header (command,
start, commit, machine), the log kept for the ``.txt`` beside the JSON, the machine's CPU
ticks, an error in one line, and signals that end the run through its ``with`` blocks."""

from __future__ import annotations

import dataclasses
import platform
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import machine
from harness.service import REPO_ROOT


def git(*args: str) -> str:
    """``git args`` in the checkout, its output stripped ("" when git fails)."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def header(
    bench: str, argv: Sequence[str], started_at: str, here: machine.Machine
) -> dict[str, Any]:
    """The record's header: ``python -m bench <bench> argv``, when, which commit (and how many
    files differ from it), on what machine."""
    status = git("status", "--porcelain")
    return {
        "command": shlex.join([Path(sys.executable).name, "-m", "bench", bench, *argv]),
        "started_at": started_at,
        "git_commit": git("rev-parse", "HEAD"),
        "git_uncommitted_files": len(status.splitlines()) if status else 0,
        "machine": {"node": platform.node(), **dataclasses.asdict(here)},
    }


def stop_cleanly_on_signals() -> None:
    """SIGTERM, and SIGINT even where a background shell set it to be ignored, end the run
    through its ``with`` blocks: every service and process it started is stopped by its
    process id."""

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.default_int_handler)


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


class Log:
    """What the run prints, kept for the ``.txt`` beside the JSON."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)


def machine_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int]:
    """The machine's busy and total CPU ticks since boot (``/proc/stat``'s ``cpu`` line; busy:
    all but idle and iowait); (0, 0) where it cannot be read."""
    try:
        with stat.open() as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    total = sum(fields[:8])  # guest times are counted in user already
    return total - sum(fields[3:5]), total
