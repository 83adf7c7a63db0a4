"""A stopped consumer always exits: the watchdog, the bounded loop teardown and the exit past
stuck threads (rowbatch/consumer/service/shutdown.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from rowbatch.consumer.service.shutdown import (
    StoppedDuringStartup,
    Watchdog,
    close_bounded,
    exit_past_stuck_threads,
    run_bounded,
    unless_stopped,
    watch_stop,
)


class FakeTimer:
    def __init__(self, interval: float, fire: Callable[[], None]) -> None:
        self.interval = interval
        self.fire = fire
        self.daemon = False
        self.started = False
        self.cancelled = False

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        self.cancelled = True


def _watchdog(limit_s: float) -> tuple[Watchdog, list[FakeTimer], list[float]]:
    timers: list[FakeTimer] = []
    expired: list[float] = []

    def make(interval: float, fire: Callable[[], None]) -> FakeTimer:
        timers.append(FakeTimer(interval, fire))
        return timers[-1]

    return Watchdog(limit_s, expire=expired.append, timer=make), timers, expired


def test_watchdog_arms_one_daemon_timer_with_the_limit_and_expiry_reports_it() -> None:
    dog, timers, expired = _watchdog(42.0)
    assert not dog.armed
    dog.arm()
    dog.arm()
    assert dog.armed
    assert len(timers) == 1
    assert timers[0].started and timers[0].daemon and timers[0].interval == 42.0
    timers[0].fire()
    assert expired == [42.0]


def test_disarmed_watchdog_cancels_its_timer() -> None:
    dog, timers, _ = _watchdog(1.0)
    dog.arm()
    dog.disarm()
    assert timers[0].cancelled
    assert not dog.armed


def test_watchdog_is_armed_by_the_stop_signal_only() -> None:
    dog, timers, _ = _watchdog(5.0)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(watch_stop(stop, dog))
        await asyncio.sleep(0)
        assert not dog.armed
        stop.set()
        await task

    asyncio.run(main())
    assert dog.armed
    assert len(timers) == 1


def test_run_bounded_returns_although_an_executor_thread_is_stuck() -> None:
    release = threading.Event()
    entered = threading.Event()
    returned = threading.Event()

    def stuck() -> None:  # a library thread that does not return until released
        entered.set()
        release.wait()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, stuck)  # left behind on purpose
        await asyncio.to_thread(entered.wait)

    def run() -> None:
        run_bounded(main(), teardown_s=0.05)
        returned.set()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    try:
        # (asyncio.run would join the stuck thread: this would time out)
        assert returned.wait(30), "run_bounded waited for the stuck executor thread"
        assert not release.is_set()
    finally:
        release.set()
        runner.join(30)


def test_run_bounded_cancels_leftover_tasks_and_raises_what_main_raises() -> None:
    cancelled = asyncio.Event()
    seen: list[bool] = []

    async def leftover() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()
            seen.append(True)

    async def main() -> None:
        asyncio.create_task(leftover())  # noqa: RUF006 - left behind on purpose
        await asyncio.sleep(0)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_bounded(main(), teardown_s=1.0)
    assert seen == [True]


class FakeThread(threading.Thread):
    def __init__(self, name: str, *, alive: bool, daemon: bool = False) -> None:
        super().__init__(name=name, daemon=daemon)
        self.alive = alive
        self.joined: list[float | None] = []

    def is_alive(self) -> bool:
        return self.alive

    def join(self, timeout: float | None = None) -> None:
        self.joined.append(timeout)


def test_threads_that_end_let_the_process_exit_normally() -> None:
    gone = FakeThread("done", alive=False)
    daemon = FakeThread("daemon", alive=True, daemon=True)
    exits: list[int] = []
    code = exit_past_stuck_threads(
        0, wait_s=5.0, threads=lambda: [gone, daemon], exit_now=exits.append
    )
    assert code == 0
    assert exits == []
    assert gone.joined == [] and daemon.joined == []


def test_a_stuck_thread_is_given_the_wait_then_the_process_exits_with_the_code() -> None:
    now = [100.0]
    stuck = FakeThread("grpc-poller", alive=True)
    other = FakeThread("executor", alive=True)

    def join_stuck(timeout: float | None = None) -> None:
        stuck.joined.append(timeout)
        now[0] += timeout or 0.0

    stuck.join = join_stuck  # type: ignore[method-assign]
    exits: list[int] = []
    exit_past_stuck_threads(
        0,
        wait_s=5.0,
        threads=lambda: [stuck, other],
        exit_now=exits.append,
        clock=lambda: now[0],
    )
    assert stuck.joined == [5.0]
    assert other.joined == [0.0]  # the wait is shared, not per thread
    assert exits == [0]


async def test_a_close_that_hangs_is_given_up_and_named(caplog: pytest.LogCaptureFixture) -> None:
    never = asyncio.Event()
    await close_bounded("sink", never.wait(), 0.01)
    assert "closing the sink took over" in caplog.text


async def test_a_close_that_fails_is_logged_and_the_next_step_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    closed: list[str] = []

    async def broken() -> None:
        raise OSError("connection reset")

    async def fine() -> None:
        closed.append("client")

    await close_bounded("source", broken(), 1.0)
    await close_bounded("inference client", fine(), 1.0)
    assert "closing the source failed" in caplog.text
    assert "connection reset" in caplog.text
    assert closed == ["client"]


async def test_a_start_up_step_that_finishes_gives_its_result() -> None:
    async def step() -> int:
        return 7

    assert await unless_stopped(step(), asyncio.Event()) == 7


async def test_stop_during_a_start_up_wait_cancels_it_and_says_so() -> None:
    stop = asyncio.Event()
    cancelled: list[bool] = []

    async def waits_forever() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def press_stop() -> None:
        await asyncio.sleep(0)
        stop.set()

    presser = asyncio.create_task(press_stop())
    with pytest.raises(StoppedDuringStartup):
        await unless_stopped(waits_forever(), stop)
    await presser
    assert cancelled == [True]


async def test_a_failing_start_up_step_raises_its_own_error() -> None:
    async def step() -> None:
        raise LookupError("model 'x' not found")

    with pytest.raises(LookupError, match="not found"):
        await unless_stopped(step(), asyncio.Event())
