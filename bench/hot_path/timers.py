"""Timing the hot path's stages: exclusive thread CPU time per stage, by wrapping the stage's
functions in place (with the timers' own cost measured, to subtract), and cProfile across the
threads a run starts."""

from __future__ import annotations

import contextlib
import cProfile
import functools
import inspect
import pstats
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

STAGES = ("decode", "check", "intake", "batch", "tensor", "grpc", "result", "sink", "ack")


class Stages:
    """Exclusive thread CPU time per stage: a stage's time excludes stages nested inside it."""

    def __init__(self, stages: Sequence[str] = STAGES) -> None:
        self.seconds = dict.fromkeys(stages, 0.0)
        self.calls = dict.fromkeys(stages, 0)
        self.nested = dict.fromkeys(stages, 0)
        """Calls of other stages made from inside this one (for the timer-cost correction)."""
        self._local = threading.local()
        self._lock = threading.Lock()

    def wrap(self, stage: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack: list[list[float]] = self._local.__dict__.setdefault("stack", [])
            frame = [0.0, 0.0]  # time and number of nested stage calls
            stack.append(frame)
            started = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                stack.pop()
                if stack:
                    stack[-1][0] += spent
                    stack[-1][1] += 1
                with self._lock:
                    self.seconds[stage] = self.seconds.get(stage, 0.0) + spent - frame[0]
                    self.calls[stage] = self.calls.get(stage, 0) + 1
                    self.nested[stage] = self.nested.get(stage, 0) + int(frame[1])

        return timed

    def corrected(self, inside: float, outside: float) -> dict[str, float]:
        """Seconds per stage less the timers' own cost: ``inside`` per call of the stage (what
        a timed no-op records), ``outside`` per stage call nested in it (the rest of a timer's
        cost, which lands in the caller's exclusive time)."""
        return {
            s: max(0.0, v - self.calls[s] * inside - self.nested[s] * outside)
            for s, v in self.seconds.items()
        }

    @contextlib.contextmanager
    def patched(self, targets: Sequence[tuple[object, str, str]]) -> Iterator[None]:
        saved = []
        for owner, attr, stage in targets:
            if hasattr(owner, attr):
                raw = inspect.getattr_static(owner, attr)
                timed = self.wrap(stage, getattr(owner, attr))
                if isinstance(raw, classmethod | staticmethod):
                    timed = staticmethod(timed)  # the class's attribute was already bound
                saved.append((owner, attr, raw))
                setattr(owner, attr, timed)
        try:
            yield
        finally:
            for owner, attr, raw in reversed(saved):
                setattr(owner, attr, raw)


def timer_cost() -> tuple[float, float]:
    """(inside, outside): what one timed call adds, as :meth:`Stages.corrected` takes it."""
    stages = Stages(("cal",))

    def noop() -> None:
        pass

    timed = stages.wrap("cal", noop)
    n = 50_000
    best_plain = best_timed = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(n):
            noop()
        best_plain = min(best_plain, time.process_time() - started)
        stages.seconds["cal"] = 0.0
        started = time.process_time()
        for _ in range(n):
            timed()
        best_timed = min(best_timed, time.process_time() - started)
    inside = stages.seconds["cal"] / n
    total = (best_timed - best_plain) / n
    return inside, max(0.0, total - inside)


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator[list[cProfile.Profile]]:
    """cProfile (thread CPU time) on this thread and on every thread started meanwhile (the
    sinks' worker threads)."""
    profilers: list[cProfile.Profile] = []
    if not enabled:
        yield profilers
        return

    def start(*_: object) -> None:
        sys.setprofile(None)
        profiler = cProfile.Profile(time.thread_time)
        profilers.append(profiler)
        profiler.enable()

    start()
    threading.setprofile(start)
    try:
        yield profilers
    finally:
        threading.setprofile(None)
        profilers[0].disable()


def print_profile(title: str, stats: pstats.Stats, rows: int, top: int) -> None:
    entries = getattr(stats, "stats", {})
    ranked = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print(f"\ncProfile {title}: top {top} by own time (us/row own, cumulative; calls)")
    for (file, line, func), (_, calls, own, cum, _) in ranked:
        where = f"{Path(file).name}:{line}({func})" if line else func
        print(f"  {own / rows * 1e6:7.2f} {cum / rows * 1e6:8.2f}  {calls:>8}  {where[:90]}")
