"""Consumer processes for the benchmarks: ``python -m rowbatch.consumer run --config FILE`` children
with their own metrics port and log, read from the outside the way an operator would (``/metrics``,
``/proc/<pid>``), and always killed by pid at the end."""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.consumer_process import (
    ConsumerDied,
    ConsumerProcess,
    CpuTimes,
    cpu_times,
    memory_kib,
    parse_metrics,
    to_toml,
)
from harness.proc import free_port

__all__ = [
    "ConsumerDied",
    "ConsumerProcess",
    "CpuTimes",
    "Drain",
    "consumers",
    "cpu_times",
    "drain",
    "memory_kib",
    "parse_metrics",
    "wait_for",
    "wait_ready",
]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", re.MULTILINE)


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
