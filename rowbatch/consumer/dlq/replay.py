"""``dlq replay``: publish the selected dead letters back and remove each from the queue once
its publish is confirmed, in that order for every letter, with up to ``in_flight`` letters
between the two steps at once. A crash between them leaves a letter in the queue, so a rerun
publishes it again: the chunk keeps its id, and the sinks write a chunk id's rows once, so the
rows still land once. A letter replayed ``max_replays`` times already (it failed again after
each) is held back, not replayed into the same failure. The first publish or removal that is not
confirmed stops the replay: no new letter is started, those in flight finish."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from rowbatch.consumer.dlq.letters import REPLAYED_FROM, DeadLetter
from rowbatch.consumer.dlq.queue import DeadLetterQueue, DeadLetterQueueError
from rowbatch.consumer.dlq.selection import Selection
from rowbatch.timing import SYSTEM_CLOCKS, Clock, Clocks, Sleep

DEFAULT_MAX_REPLAYS = 3
DEFAULT_IN_FLIGHT = 16
"""Letters published and not yet removed at once (each waits for its own confirmation)."""


@dataclass(frozen=True)
class ReplayPlan:
    """Where a replay publishes (``target``) and how: at most ``limit`` letters (None: all
    selected), only counted when ``dry_run``, holding back those replayed ``max_replays``
    times already, with up to ``in_flight`` between publish and removal, starting at most
    ``rate`` letters a second (None: as fast as they are confirmed)."""

    target: str
    limit: int | None = None
    dry_run: bool = False
    max_replays: int = DEFAULT_MAX_REPLAYS
    in_flight: int = DEFAULT_IN_FLIGHT
    rate: float | None = None


@dataclass
class ReplaySummary:
    """What a replay did; ``rows`` counts the replayed letters' ``rowbatch-row-count``."""

    target: str
    dry_run: bool
    read: int = 0
    matched: int = 0
    replayed: int = 0
    rows: int = 0
    held_back: int = 0
    """Matched, but replayed ``max_replays`` times already."""
    came_back: int = 0
    """Replayed by this run and dead-lettered again while it ran (not replayed twice)."""
    failed: str | None = None
    """Why the replay stopped early (the current letter was left in the queue)."""

    def lines(self) -> list[str]:
        verb = "would replay" if self.dry_run else "replayed"
        out = [
            f"read {self.read} dead letters, {self.matched} selected; {verb} {self.replayed} "
            f"({self.rows} rows) to {self.target}"
        ]
        if self.came_back:
            out.append(
                f"{self.came_back} came back to the dead-letter queue during this replay (they "
                "failed again): left there"
            )
        if self.held_back:
            out.append(
                f"held back {self.held_back} replayed too often already (they failed again "
                "after each replay; fix the cause, or raise --max-replays)"
            )
        if self.failed:
            out.append(f"stopped: {self.failed}; the rest stay in the dead-letter queue")
        return out


async def replay(
    queue: DeadLetterQueue,
    selection: Selection,
    plan: ReplayPlan,
    *,
    progress: Callable[[ReplaySummary], None] | None = None,
    progress_every_s: float = 2.0,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> ReplaySummary:
    """Replay what ``selection`` picks (at most ``plan.limit``) to ``plan.target``;
    ``progress`` is called every ``progress_every_s`` (on ``clocks.monotonic``) and at the
    end. Broker errors end the replay early with ``failed`` set; they are not raised (an error
    reading the queue is, once the letters in flight have finished). ``plan.rate``: start at
    most that many letters per second (so a big replay does not flood the consumers)."""
    target, limit, dry_run, rate = plan.target, plan.limit, plan.dry_run, plan.rate
    clock, sleep = clocks.monotonic, clocks.sleep
    summary = ReplaySummary(target=target, dry_run=dry_run)
    flight = _Flight(summary, plan.in_flight)
    started: set[str] = set()
    shown = begun = clock()
    try:
        async for letter in queue.letters():
            if letter.ref in started:
                continue  # given again by the queue (a lapsed lease): replayed already
            if letter.attributes.get(REPLAYED_FROM) in started:
                summary.came_back += 1  # a queue read to its live end (Pub/Sub) sees it again
                continue
            summary.read += 1
            if not selection.matches(letter):
                continue
            if limit is not None and len(started) >= limit:
                break
            summary.matched += 1
            if letter.replays >= plan.max_replays:
                summary.held_back += 1
                continue
            if rate is not None and not dry_run:
                await _paced(begun + len(started) / rate, clock, sleep)
            started.add(letter.ref)
            if dry_run:
                flight.count(letter)
            elif not await flight.start(_replay_one(queue, letter, target)):
                break  # one failed: start no more
            if progress is not None and clock() - shown >= progress_every_s:
                shown = clock()
                progress(summary)
    finally:
        await flight.finish()
    if progress is not None:
        progress(summary)
    return summary


async def _paced(due: float, clock: Clock, sleep: Sleep) -> None:
    """Wait until ``clock()`` reaches ``due``."""
    if due > clock():
        await sleep(due - clock())


class _Flight:
    """The letters between publish and removal; counts each one that completes, keeps the
    first failure."""

    def __init__(self, summary: ReplaySummary, limit: int) -> None:
        self._summary = summary
        self._limit = max(1, limit)
        self._tasks: set[asyncio.Task[DeadLetter]] = set()

    def count(self, letter: DeadLetter) -> None:
        self._summary.replayed += 1
        self._summary.rows += letter.row_count or 0

    async def start(self, step: Coroutine[Any, Any, DeadLetter]) -> bool:
        """Start ``step`` (unless a letter has failed already: then ``step`` is dropped), then
        wait until fewer than the limit are in flight; False once a letter has failed."""
        finished = {task for task in self._tasks if task.done()}
        self._tasks -= finished
        self._collect(finished)
        if self._summary.failed is not None:
            step.close()
            return False
        self._tasks.add(asyncio.create_task(step))
        while len(self._tasks) >= self._limit:
            done, self._tasks = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_COMPLETED)
            self._collect(done)
        return self._summary.failed is None

    async def finish(self) -> None:
        if self._tasks:
            done, _ = await asyncio.wait(self._tasks)
            self._tasks = set()
            self._collect(done)

    def _collect(self, done: set[asyncio.Task[DeadLetter]]) -> None:
        for task in done:
            error = task.exception()
            if error is None:
                self.count(task.result())
            elif isinstance(error, ReplayStopped):
                if self._summary.failed is None:
                    self._summary.failed = str(error)
            else:
                raise error


class ReplayStopped(Exception):
    """A publish or a removal was not confirmed (the message says which, and why)."""


async def _replay_one(queue: DeadLetterQueue, letter: DeadLetter, target: str) -> DeadLetter:
    try:
        landed = await queue.publish(letter, target)
    except DeadLetterQueueError as exc:
        raise ReplayStopped(f"publishing {letter.ref} to {target} failed: {exc}") from exc
    try:
        await queue.remove(letter, landed)
    except DeadLetterQueueError as exc:
        raise ReplayStopped(
            f"{letter.ref} was replayed as {landed} but could not be removed from the "
            f"dead-letter queue ({exc}); a rerun replays it again, and its rows still land "
            "once (the chunk id is kept)"
        ) from exc
    return letter


__all__ = [
    "DEFAULT_IN_FLIGHT",
    "DEFAULT_MAX_REPLAYS",
    "ReplayPlan",
    "ReplayStopped",
    "ReplaySummary",
    "replay",
]
