"""A ``python -m rowbatch.consumer run --config FILE`` child process, watched from the outside the
way an operator would (``/readyz``, ``/metrics``, ``/proc/<pid>``) and always killed by pid at the
end. Used by the process-level tests and by the benchmarks."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.proc import log_tail
from harness.service import REPO_ROOT

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", re.MULTILINE)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))  # a JSON string is a valid TOML basic string
    raise TypeError(f"no TOML for {value!r}")


def to_toml(data: Mapping[str, Any], prefix: str = "") -> str:
    """Enough TOML for a consumer config: scalars and nested tables."""
    lines = [f"[{prefix}]"] if prefix else []
    tables = {k: v for k, v in data.items() if isinstance(v, Mapping)}
    lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in data.items() if k not in tables]
    text = "\n".join(lines) + "\n"
    for key, table in tables.items():
        text += "\n" + to_toml(table, f"{prefix}.{json.dumps(key)}" if prefix else json.dumps(key))
    return text


@dataclass(frozen=True)
class CpuTimes:
    user_s: float
    sys_s: float

    @property
    def total_s(self) -> float:
        return self.user_s + self.sys_s


def cpu_times(pid: int) -> CpuTimes:
    """User and system CPU seconds of a process (all its threads) from ``/proc/<pid>/stat``."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) "
    return CpuTimes(int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS)


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` (now), ``VmHWM`` (peak RSS so far) and the two parts of ``VmRSS``:
    ``RssAnon`` (memory the process allocated) and ``RssFile`` (pages of mapped files, mostly
    shared libraries' code and data: shared, and reclaimable by the kernel), from
    ``/proc/<pid>/status``."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = dict(
        re.findall(r"^(VmRSS|VmHWM|RssAnon|RssFile):\s+(\d+) kB$", text, flags=re.MULTILINE)
    )
    return {key: int(found[key]) for key in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}


def parse_metrics(body: str) -> dict[str, float]:
    """Prometheus text: each sample name summed over its labels (``name{...}`` also kept)."""
    out: dict[str, float] = {}
    for name, labels, value in _SAMPLE.findall(body):
        try:
            number = float(value)
        except ValueError:
            continue
        out[name] = out.get(name, 0.0) + number
        if labels:
            out[name + labels] = number
    return out


class ConsumerDied(AssertionError):
    """The consumer exited before what the caller was waiting for."""


@dataclass
class ConsumerProcess:
    """One consumer child on its own metrics ``port``, logging to ``log_path``. ``env``: its
    environment (default: this one's without ``ROWBATCH_*``, so only the file configures it).
    ``stop`` (always call it) kills it by pid."""

    name: str
    config_path: Path
    log_path: Path
    port: int
    env: dict[str, str] | None = None
    command: tuple[str, ...] = ("run",)
    """The consumer's command and its options (``("table", "--shard", "0/4")``)."""
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        env = self.env
        if env is None:
            env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rowbatch.consumer",
                *self.command,
                "--config",
                str(self.config_path),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def returncode(self) -> int | None:
        assert self.proc is not None
        return self.proc.poll()

    def log(self) -> str:
        return log_tail(self.log_path)

    def check_alive(self, what: str) -> None:
        code = self.returncode()
        if code is not None:
            raise ConsumerDied(
                f"consumer {self.name} exited with {code} before {what}; log tail:\n{self.log()}"
            )

    def _get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as exc:  # e.g. 503 from /readyz
            exc.close()
            return exc.code, ""
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get("/readyz")[0] == 200

    def metrics(self) -> dict[str, float] | None:
        """Every sample on ``/metrics`` (see :func:`parse_metrics`); None when unreachable."""
        status, body = self._get("/metrics")
        return parse_metrics(body) if status == 200 else None

    def metric(self, name: str) -> float | None:
        """One sample (summed over its labels); None when absent or unreachable."""
        return (self.metrics() or {}).get(name)

    def rows_written(self) -> float:
        return self.metric("rowbatch_rows_written_total") or 0.0

    def cpu(self) -> CpuTimes:
        return cpu_times(self.pid)

    def memory_kib(self) -> dict[str, int]:
        return memory_kib(self.pid)

    def send(self, sig: signal.Signals) -> None:
        self.check_alive(f"{sig.name}")
        os.kill(self.pid, sig)

    def wait(self, timeout_s: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM and wait for a clean exit; the exit code (None if it had to be killed)."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            return None

    def stop(self) -> None:
        """Kill by pid if still running, reap it, close the log."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
        if self._log is not None:
            self._log.close()
            self._log = None
