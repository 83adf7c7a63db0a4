"""Consumer processes for the benchmarks: ``python -m consumer run --config FILE`` children with
their own metrics port and log, read from the outside the way an operator would (``/metrics``,
``/proc/<pid>``), and always killed by pid at the end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from harness.proc import free_port, log_tail
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
    """``VmRSS`` (now) and ``VmHWM`` (peak RSS so far) from ``/proc/<pid>/status``."""
    text = Path(f"/proc/{pid}/status").read_text()
    found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB$", text, flags=re.MULTILINE))
    return {key: int(found[key]) for key in ("VmRSS", "VmHWM")}


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


class ConsumerDied(RuntimeError):
    pass


@dataclass
class ConsumerProcess:
    """One ``python -m consumer run`` child."""

    name: str
    config_path: Path
    log_path: Path
    port: int
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "consumer", "run", "--config", str(self.config_path)],
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

    def check_alive(self, what: str) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise ConsumerDied(
                f"consumer {self.name} exited with {code} before {what}; "
                f"log tail:\n{log_tail(self.log_path)}"
            )

    def _get(self, path: str) -> tuple[int, str]:
        url = f"http://127.0.0.1:{self.port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return int(answer.status), answer.read().decode()
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, ""
        except OSError:
            return 0, ""

    def ready(self) -> bool:
        return self._get("/readyz")[0] == 200

    def metrics(self) -> dict[str, float]:
        status, body = self._get("/metrics")
        return parse_metrics(body) if status == 200 else {}

    def rows_written(self) -> float:
        return self.metrics().get("rowbatch_rows_written_total", 0.0)

    def cpu(self) -> CpuTimes:
        return cpu_times(self.pid)

    def memory_kib(self) -> dict[str, int]:
        return memory_kib(self.pid)

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


def wait_for(
    predicate: Callable[[], bool],
    timeout_s: float,
    what: str,
    alive: list[ConsumerProcess] | None = None,
    every_s: float = 0.1,
) -> float:
    """Poll until ``predicate()``; the seconds it took. Fails after ``timeout_s``, or at once if
    one of ``alive`` exited."""
    started = time.monotonic()
    while not predicate():
        for proc in alive or []:
            proc.check_alive(what)
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)
    return time.monotonic() - started


@contextlib.contextmanager
def consumers(
    workdir: Path, name: str, config: Mapping[str, Any], count: int = 1
) -> Iterator[list[ConsumerProcess]]:
    """Start ``count`` consumers with one configuration (each on its own metrics port and log
    under ``workdir``); they are killed by pid when the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    started: list[ConsumerProcess] = []
    try:
        for i in range(count):
            port = free_port()
            label = f"{name}-{i}" if count > 1 else name
            path = workdir / f"{label}.toml"
            full = {**config, "server": {"host": "127.0.0.1", "port": port}}
            path.write_text(to_toml(full))
            proc = ConsumerProcess(label, path, workdir / f"{label}.log", port)
            started.append(proc)
            proc.start()
        yield started
    finally:
        for proc in started:
            proc.stop()


def wait_ready(procs: list[ConsumerProcess], timeout_s: float = 90.0) -> None:
    wait_for(lambda: all(p.ready() for p in procs), timeout_s, "/readyz", procs, every_s=0.1)


@dataclass(frozen=True)
class Drain:
    """How a backlog drained: rows counted by ``/metrics`` across the processes."""

    rows: int
    seconds: float
    """From the first row written to the last."""
    startup_s: float
    """From starting the processes to their first row written."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def drain(
    procs: list[ConsumerProcess], total: int, started: float, timeout_s: float = 600.0
) -> Drain:
    """Poll every process's ``rowbatch_rows_written_total`` until ``total`` rows are written.
    Throughput is measured from the first poll that saw rows (minus those rows) to the end,
    so process start-up (imports, model discovery, group join) is left out."""
    first_at: float | None = None
    first_rows = 0.0
    deadline = time.monotonic() + timeout_s
    while True:
        written = sum(p.rows_written() for p in procs)
        now = time.monotonic()
        if written > 0 and first_at is None:
            first_at, first_rows = now, written
        if written >= total:
            break
        for proc in procs:
            proc.check_alive(f"{total} rows written ({written:.0f} so far)")
        if now > deadline:
            raise TimeoutError(f"{written:.0f} of {total} rows written after {timeout_s:.0f} s")
        time.sleep(0.1)
    assert first_at is not None
    if now - first_at < 1e-3:  # everything was written before the first poll
        return Drain(total, now - started, 0.0)
    return Drain(int(total - first_rows), now - first_at, first_at - started)
