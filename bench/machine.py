"""The machine a benchmark ran on, recorded with its figures: cores, CPU model, memory, load
before and after, and a CPU calibration (a fixed piece of pure-Python work, timed), so that a
reader can tell how fast this machine was compared with theirs. Machines of one kind differ by
up to ~2x in CPU speed: consumer CPU per message or row divided by ``calibration_us`` is the
figure that travels between them; a share of the model server's ceiling does not, where the
consumer is the bottleneck."""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

CALIBRATION_ROUNDS = 7


@dataclass(frozen=True)
class Load:
    """``/proc/loadavg``'s 1, 5 and 15 minute averages, and when they were read."""

    at: str
    one: float
    five: float
    fifteen: float


@dataclass(frozen=True)
class Machine:
    cores: int
    cpu_model: str
    cpu_mhz: float
    memory_gib: float
    kernel: str
    python: str
    calibration_us: float
    """The best of ``CALIBRATION_ROUNDS`` timings of :func:`calibration_work` (lower: faster)."""
    load_before: Load
    load_after: Load | None = None

    def header(self) -> str:
        after = (
            ""
            if self.load_after is None
            else f", after {self.load_after.one:.2f}/{self.load_after.five:.2f}"
        )
        return (
            f"{self.cores} cores, {self.cpu_model} ({self.cpu_mhz:,.0f} MHz), "
            f"{self.memory_gib:.0f} GiB; calibration {self.calibration_us:,.0f} us; load before "
            f"{self.load_before.one:.2f}/{self.load_before.five:.2f}{after}"
        )


def calibration_work() -> int:
    """A fixed amount of interpreter work (dict, str and int operations, like a consumer's
    per-message bookkeeping)."""
    seen: dict[str, int] = {}
    total = 0
    for i in range(20_000):
        key = f"m{i % 997}"
        seen[key] = seen.get(key, 0) + i
        total += len(key) * (i & 7)
    return total + len(seen)


def calibrate(rounds: int = CALIBRATION_ROUNDS) -> float:
    """Microseconds of :func:`calibration_work`, the best of ``rounds``."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        calibration_work()
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def load_now(loadavg: Path = Path("/proc/loadavg")) -> Load:
    try:
        one, five, fifteen = (float(x) for x in loadavg.read_text().split()[:3])
    except (OSError, ValueError):
        one = five = fifteen = -1.0
    return Load(time.strftime("%Y-%m-%d %H:%M:%S %z"), one, five, fifteen)


def _cpuinfo(cpuinfo: Path) -> tuple[str, float]:
    model, mhz = platform.processor() or platform.machine(), 0.0
    try:
        text = cpuinfo.read_text()
    except OSError:
        return model, mhz
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            model = value.strip()
        elif key.strip() == "cpu MHz" and not mhz:
            try:
                mhz = float(value)
            except ValueError:
                mhz = 0.0
    return model, mhz


def _memory_gib(meminfo: Path) -> float:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def describe(proc: Path = Path("/proc")) -> Machine:
    """This machine now (load before; :meth:`finish` adds the load after)."""
    model, mhz = _cpuinfo(proc / "cpuinfo")
    return Machine(
        os.cpu_count() or 1,
        model,
        mhz,
        _memory_gib(proc / "meminfo"),
        platform.release(),
        platform.python_version(),
        round(calibrate(), 1),
        load_now(proc / "loadavg"),
    )


def finish(machine: Machine, proc: Path = Path("/proc")) -> Machine:
    return Machine(
        machine.cores,
        machine.cpu_model,
        machine.cpu_mhz,
        machine.memory_gib,
        machine.kernel,
        machine.python,
        machine.calibration_us,
        machine.load_before,
        load_now(proc / "loadavg"),
    )
