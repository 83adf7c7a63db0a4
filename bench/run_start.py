"""What every bench run that starts its own services shares: the record's header (command,
start, commit, machine), the log kept for the ``.txt`` beside the JSON, the machine's CPU
ticks, an error in one line, and signals that end the run through its ``with`` blocks."""

from __future__ import annotations

import dataclasses
import json
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
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


def open_log(
    title: str,
    head: Mapping[str, Any],
    here: machine.Machine,
    run_dir: Path,
    notes: Sequence[str] = (),
) -> Log:
    """The run's log, opened with its header: what, the command, the commit, the host,
    ``notes`` (each a line), and where its services keep their files."""
    say = Log()
    lines = [
        f"{title}, {head['started_at']}",
        f"  command   {head['command']}",
        f"  commit    {head['git_commit']} ({head['git_uncommitted_files']} files uncommitted)",
        f"  host      {head['machine']['node']}: {here.header()}",
        *(f"  note      {note}" for note in notes),
        f"  run dir   {run_dir}",
    ]
    say("\n".join(lines))
    return say


def write_record(
    record_of: Callable[[dict[str, Any]], dict[str, Any]],
    head: Mapping[str, Any],
    here: machine.Machine,
    started: float,
    out: Path,
    say: Log,
) -> None:
    """The run's JSON (``record_of`` the header, its machine as it is now at the end) at
    ``out`` and its log beside it (``.txt``); ``started``: ``time.monotonic()`` at the start."""
    done = machine.finish(here)
    record = record_of({**head, "machine": {"node": platform.node(), **dataclasses.asdict(done)}})
    record["elapsed_s"] = round(time.monotonic() - started, 1)
    say(f"\n  host after {done.header()}\nTotal {record['elapsed_s']:.0f} s; results in {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    out.with_suffix(".txt").write_text("\n".join(say.lines) + "\n", encoding="utf-8")
