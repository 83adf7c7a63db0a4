"""CommitStage with a fake sink, clock and sleep: when a commit is due (age, staged bytes, held
memory), that messages are settled only after the commit that holds their rows, and what is
left unsettled when the pipeline stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from rowbatch.consumer.engine.commit_stage import CommitStage
from rowbatch.consumer.engine.ledger import Entry, Ledger
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sinks.base import SinkError
from rowbatch.consumer.sources.base import WrittenRows
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.timing import Clocks

INTERVAL = 10.0
PRESSURE = 1000
TARGET = 500


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeSleep:
    """Records each wait asked for; a sleep returns only when the test calls :meth:`let_one`."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self._go = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        await self._go.wait()
        self._go.clear()

    def let_one(self) -> None:
        self._go.set()


class FakeSink:
    """A ``CommitsWrites`` sink: records, at each commit, what had been settled by then."""

    def __init__(self, settled: list[Entry]) -> None:
        self.target_file_bytes = TARGET
        self.staged = 0
        self.commits = 0
        self.settled_at_commit: list[list[Entry]] = []
        self.error: Exception | None = None
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self._settled = settled

    async def commit(self) -> None:
        self.settled_at_commit.append(list(self._settled))
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if self.error is not None:
            raise self.error
        self.commits += 1
        self.staged = 0

    def uncommitted_bytes(self) -> int:
        return self.staged


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.sleep = FakeSleep()
        self.settled: list[Entry] = []
        self.settle_calls = 0
        self.sink = FakeSink(self.settled)
        self.metrics = Metrics()
        self.ledger = Ledger()
        self.retried: list[str] = []
        self.stage = CommitStage(
            self.sink,
            retrying=self.retrying,
            settle_many=self.settle_many,
            interval_s=INTERVAL,
            pressure_bytes=PRESSURE,
            metrics=self.metrics,
            clocks=Clocks(monotonic=self.clock, sleep=self.sleep),
        )

    async def retrying(self, op: Callable[[], Awaitable[None]], what: str) -> None:
        self.retried.append(what)
        await op()

    async def settle_many(self, entries: Sequence[Entry]) -> None:
        self.settle_calls += 1
        self.settled.extend(entries)

    def entry(self, name: str, reserved_bytes: int = 10) -> Entry:
        delivery = Delivery(name, b"", {}, 0.0, 1, "projects/p/subscriptions/s")
        return self.ledger.open(delivery, f"chunk-{name}", 4, reserved_bytes, self.clock())

    def awaiting(self) -> float:
        value = self.metrics.registry.get_sample_value("rowbatch_messages_awaiting_commit")
        assert value is not None
        return value


@pytest.fixture
def world() -> World:
    return World()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Lets the loop run (no time passes) until ``condition`` holds."""
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


@contextlib.asynccontextmanager
async def running(world: World) -> AsyncIterator[asyncio.Task[None]]:
    """``world.stage.run()`` as a task, cancelled at the end."""
    task = asyncio.create_task(world.stage.run())
    try:
        yield task
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# --- due ----------------------------------------------------------------------------------------


async def test_nothing_held_is_never_due(world: World) -> None:
    world.clock.now = 1e6
    world.sink.staged = 10 * TARGET
    assert not world.stage.due()
    await world.stage.hold([])
    assert not world.stage.due()
    assert world.stage.waiting == 0


async def test_not_due_before_the_interval_due_at_it(world: World) -> None:
    world.clock.now = 100.0
    await world.stage.hold([world.entry("a")])
    world.clock.now = 100.0 + INTERVAL - 0.001
    await world.stage.hold([world.entry("b")])  # a later message does not restart the wait
    assert not world.stage.due()
    world.clock.now = 100.0 + INTERVAL
    assert world.stage.due()


async def test_due_when_the_sink_has_a_full_file_staged(world: World) -> None:
    await world.stage.hold([world.entry("a")])
    world.sink.staged = TARGET - 1
    assert not world.stage.due()
    world.sink.staged = TARGET
    assert world.stage.due()


async def test_due_when_the_held_messages_hold_pressure_bytes(world: World) -> None:
    await world.stage.hold([world.entry("a", PRESSURE // 2), world.entry("b", PRESSURE // 4)])
    assert not world.stage.due()
    await world.stage.hold([world.entry("c", PRESSURE // 4 - 1)])
    assert not world.stage.due()
    await world.stage.hold([world.entry("d", 1)])
    assert world.stage.due()


async def test_the_interval_starts_again_with_the_first_message_after_a_commit(
    world: World,
) -> None:
    await world.stage.hold([world.entry("a")])
    world.clock.now = INTERVAL
    await world.stage.commit()
    world.clock.now = 50.0
    await world.stage.hold([world.entry("b")])
    world.clock.now = 50.0 + INTERVAL - 1
    assert not world.stage.due()
    world.clock.now = 50.0 + INTERVAL
    assert world.stage.due()


async def test_held_bytes_are_forgotten_after_a_commit(world: World) -> None:
    await world.stage.hold([world.entry("a", PRESSURE)])
    assert world.stage.due()
    await world.stage.commit()
    await world.stage.hold([world.entry("b", 1)])
    assert not world.stage.due()


async def test_commit_soon_makes_what_waits_due_until_the_commit(world: World) -> None:
    world.stage.commit_soon()  # nothing waits: nothing to commit
    assert not world.stage.due()
    await world.stage.hold([world.entry("a")])
    assert world.stage.due()
    await world.stage.commit()
    await world.stage.hold([world.entry("b")])
    assert not world.stage.due()  # the next message waits for the interval again


# --- commit, settle -----------------------------------------------------------------------------


async def test_entries_are_settled_only_after_the_sink_commit_returned(world: World) -> None:
    entries = [world.entry("a"), world.entry("b")]
    await world.stage.hold(entries)
    assert world.stage.waiting == 2
    assert world.awaiting() == 2

    await world.stage.commit()

    assert world.sink.settled_at_commit == [[]]
    assert world.settled == entries
    assert world.sink.commits == 1
    assert world.retried == ["commit"]
    assert world.stage.waiting == 0
    assert world.awaiting() == 0


async def test_entries_held_during_a_commit_wait_for_the_next(world: World) -> None:
    first = [world.entry("a"), world.entry("b")]
    await world.stage.hold(first)
    world.sink.gate = asyncio.Event()
    committing = asyncio.create_task(world.stage.commit())
    await asyncio.wait_for(world.sink.started.wait(), timeout=5)

    late = world.entry("c")
    await world.stage.hold([late])
    assert world.stage.waiting == 3
    assert world.settled == []
    world.sink.gate.set()
    await committing

    assert world.settled == first
    assert world.stage.waiting == 1
    assert world.awaiting() == 1
    await world.stage.commit()
    assert world.settled == [*first, late]
    assert world.sink.settled_at_commit == [[], first]


async def test_a_second_commit_waits_for_the_first(world: World) -> None:
    a = world.entry("a")
    await world.stage.hold([a])
    world.sink.gate = asyncio.Event()
    first = asyncio.create_task(world.stage.commit())
    await asyncio.wait_for(world.sink.started.wait(), timeout=5)
    b = world.entry("b")
    await world.stage.hold([b])
    second = asyncio.create_task(world.stage.commit())
    await until(lambda: len(world.sink.settled_at_commit) == 1, "the first commit began")
    assert len(world.sink.settled_at_commit) == 1  # the second has not begun
    world.sink.gate.set()
    await asyncio.gather(first, second)
    assert world.settled == [a, b]
    assert world.sink.commits == 2


async def test_unsettled_returns_the_waiting_entries_and_clears_them(world: World) -> None:
    entries = [world.entry("a", PRESSURE), world.entry("b")]
    await world.stage.hold(entries)
    assert world.stage.due()

    assert world.stage.unsettled() == entries
    assert world.stage.waiting == 0
    assert world.awaiting() == 0
    assert not world.stage.due()
    assert world.stage.unsettled() == []


async def test_unsettled_during_a_commit_returns_both_kinds_and_none_is_settled_later(
    world: World,
) -> None:
    a = world.entry("a")
    await world.stage.hold([a])
    world.sink.gate = asyncio.Event()
    committing = asyncio.create_task(world.stage.commit())
    await asyncio.wait_for(world.sink.started.wait(), timeout=5)
    b = world.entry("b")
    await world.stage.hold([b])

    assert world.stage.unsettled() == [a, b]
    world.sink.gate.set()
    await committing
    assert world.settled == []  # nacked ones are not acked as well


async def test_a_failed_commit_raises_and_keeps_its_entries_unsettled(world: World) -> None:
    entries = [world.entry("a"), world.entry("b")]
    await world.stage.hold(entries)
    world.sink.error = SinkError("the catalog refused the commit")

    with pytest.raises(SinkError, match="refused"):
        await world.stage.commit()

    assert world.settled == []
    assert world.settle_calls == 0
    later = world.entry("c")
    await world.stage.hold([later])
    assert world.stage.waiting == 3
    assert world.stage.unsettled() == [*entries, later]


# --- run ----------------------------------------------------------------------------------------


async def test_run_commits_when_a_hold_makes_it_due(world: World) -> None:
    a = world.entry("a")
    await world.stage.hold([a])
    async with running(world) as task:
        await until(lambda: world.sleep.waits == [INTERVAL], "run sleeps until the interval")
        assert world.settled == []

        b = world.entry("b", PRESSURE)  # the held memory is due now
        await world.stage.hold([b])
        await until(lambda: world.settled == [a, b], "run commits")
        assert world.sink.commits == 1
        assert world.sleep.waits == [INTERVAL]  # woken, not by the timer
        assert not task.done()


async def test_run_commits_when_the_interval_has_passed(world: World) -> None:
    first = world.entry("first", 0)
    await world.stage.hold([first])
    world.clock.now = 3.0
    a = world.entry("a")
    await world.stage.hold([a])
    async with running(world):
        # the oldest message has waited 3 s of the interval
        await until(lambda: world.sleep.waits == [INTERVAL - 3.0], "run sleeps")
        world.clock.now = INTERVAL - 0.5
        world.sleep.let_one()  # woken early: not due yet
        await until(lambda: len(world.sleep.waits) == 2, "run sleeps again")
        assert world.sleep.waits[1] == pytest.approx(0.5)  # what is left of the interval
        assert world.sink.commits == 0
        world.clock.now = INTERVAL
        world.sleep.let_one()
        await until(lambda: world.sink.commits == 1, "run commits")
        assert world.settled == [first, a]


async def test_run_commits_what_is_due_when_it_starts(world: World) -> None:
    a = world.entry("a")
    await world.stage.hold([a])
    world.sink.staged = TARGET
    async with running(world):
        await until(lambda: world.settled == [a], "run commits")
        assert world.sleep.waits == []


async def test_run_after_a_commit_commits_the_next_due_messages(world: World) -> None:
    a = world.entry("a", PRESSURE)
    await world.stage.hold([a])
    async with running(world):
        await until(lambda: world.settled == [a], "the first commit")
        b = world.entry("b", PRESSURE)
        await world.stage.hold([b])
        await until(lambda: world.settled == [a, b], "the second commit")
        assert world.sink.commits == 2


async def test_run_commits_at_once_when_asked_to_commit_soon(world: World) -> None:
    a = world.entry("a")
    await world.stage.hold([a])
    async with running(world):
        await until(lambda: world.sleep.waits == [INTERVAL], "run sleeps until the interval")
        world.stage.commit_soon()
        await until(lambda: world.settled == [a], "run commits")
        assert world.sleep.waits == [INTERVAL]


async def test_a_failed_commit_ends_run_with_the_error(world: World) -> None:
    world.sink.error = SinkError("boom")
    await world.stage.hold([world.entry("a", PRESSURE)])
    with pytest.raises(SinkError, match="boom"):
        await asyncio.wait_for(world.stage.run(), timeout=5)
    assert len(world.stage.unsettled()) == 1


async def test_run_idle_commits_a_quiet_message_at_the_interval(world: World) -> None:
    a = world.entry("a")
    async with running(world):
        for _ in range(10):
            await asyncio.sleep(0)  # run starts, with nothing held
        await world.stage.hold([a])  # the last message for a while: no other hold follows
        await until(lambda: bool(world.sleep.waits), "run sleeps until the interval")
        world.clock.now = INTERVAL
        world.sleep.let_one()
        await until(lambda: world.settled == [a], "run commits")


# --- rows held for a source that keeps progress per row -----------------------------------------


class RowsTold:
    """A ``rows_committed`` callback: records each call with the sink's commit count and what
    had been settled by then."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.calls: list[tuple[list[WrittenRows], int, list[Entry]]] = []

    async def __call__(self, written: Sequence[WrittenRows]) -> None:
        self.calls.append((list(written), self.world.sink.commits, list(self.world.settled)))


def telling(world: World) -> RowsTold:
    """``world.stage`` made again with a ``rows_committed`` callback; returns it."""
    told = RowsTold(world)
    world.stage = CommitStage(
        world.sink,
        retrying=world.retrying,
        settle_many=world.settle_many,
        interval_s=INTERVAL,
        pressure_bytes=PRESSURE,
        metrics=world.metrics,
        clocks=Clocks(monotonic=world.clock, sleep=world.sleep),
        rows_committed=told,
    )
    return told


async def test_rows_held_are_told_after_the_commit_before_the_settle(world: World) -> None:
    told = telling(world)
    a, b = world.entry("a"), world.entry("b")
    rows: list[WrittenRows] = [(a.delivery, 0, 4), (b.delivery, 0, 2)]
    await world.stage.hold_rows(rows[:1])
    await world.stage.hold_rows(rows[1:])  # b's first rows: b is not complete
    await world.stage.hold([a])
    assert told.calls == []

    await world.stage.commit()

    assert told.calls == [(rows, 1, [])]  # after the sink's commit, before any settle
    assert world.settled == [a]
    await world.stage.commit()
    assert len(told.calls) == 1  # told once


async def test_rows_of_a_failed_commit_are_told_after_the_next_one(world: World) -> None:
    told = telling(world)
    a, b = world.entry("a"), world.entry("b")
    first: list[WrittenRows] = [(a.delivery, 0, 4)]
    await world.stage.hold_rows(first)
    await world.stage.hold([a])
    world.sink.error = SinkError("the catalog refused the commit")
    with pytest.raises(SinkError, match="refused"):
        await world.stage.commit()
    assert told.calls == []
    assert world.settled == []

    later: list[WrittenRows] = [(b.delivery, 0, 4)]
    await world.stage.hold_rows(later)
    await world.stage.hold([b])
    world.sink.error = None
    await world.stage.commit()

    assert told.calls == [([*first, *later], 1, [])]
    assert world.settled == [a, b]


async def test_rows_held_during_a_commit_are_told_after_the_next(world: World) -> None:
    told = telling(world)
    a, b = world.entry("a"), world.entry("b")
    await world.stage.hold_rows([(a.delivery, 0, 4)])
    await world.stage.hold([a])
    world.sink.gate = asyncio.Event()
    committing = asyncio.create_task(world.stage.commit())
    await asyncio.wait_for(world.sink.started.wait(), timeout=5)
    await world.stage.hold_rows([(b.delivery, 0, 4)])  # written while the commit runs
    await world.stage.hold([b])
    world.sink.gate.set()
    await committing
    assert told.calls == [([(a.delivery, 0, 4)], 1, [])]

    await world.stage.commit()
    assert told.calls[1] == ([(b.delivery, 0, 4)], 2, [a])


async def test_unsettled_forgets_the_rows_held(world: World) -> None:
    told = telling(world)
    a, b = world.entry("a"), world.entry("b")
    await world.stage.hold_rows([(a.delivery, 0, 4)])
    await world.stage.hold([a])
    assert world.stage.unsettled() == [a]  # nacked: its rows are not told

    await world.stage.hold_rows([(b.delivery, 0, 4)])
    await world.stage.hold([b])
    await world.stage.commit()
    assert told.calls == [([(b.delivery, 0, 4)], 1, [])]


async def test_a_commit_with_no_rows_held_tells_nothing(world: World) -> None:
    told = telling(world)
    a = world.entry("a")
    await world.stage.hold([a])
    await world.stage.commit()
    assert told.calls == []
    assert world.settled == [a]


async def test_without_rows_committed_hold_rows_keeps_nothing(world: World) -> None:
    a = world.entry("a")
    await world.stage.hold_rows([(a.delivery, 0, 4)])
    assert world.stage._rows == []  # nobody to tell: nothing kept (and nothing grows)
    await world.stage.hold([a])
    await world.stage.commit()
    assert world.settled == [a]
