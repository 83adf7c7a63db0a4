"""``dlq replay``: publish the selected dead letters back and remove each from the queue once
its publish is confirmed, in that order for every letter, with up to ``in_flight`` letters
between the two steps at once. A crash between them leaves a letter in the queue, so a rerun
publishes it again: the chunk keeps its id, and the sinks write a chunk id's rows once, so the
rows still land once. A letter replayed ``max_replays`` times already (it failed again after
each) is held back, not replayed into the same failure. The first publish or removal that is not
confirmed stops the replay: no new letter is started, those in flight finish.

Copies of one letter (the same ``DeadLetter.identity``: a chunk dead-lettered again after a
redelivery) are published once, as the first selected: each copy is removed only after that
publish was confirmed (with ``rowbatch-dlq-replayed-as`` naming where it landed), and stays in
the queue when it was not (or the letter was held back)."""

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
    duplicates: int = 0
    """Selected letters that were copies of one selected before (not in ``matched``, never
    published)."""
    duplicates_removed: int = 0
    """Of ``duplicates``, those removed after the letter they copy was published (a dry run:
    those that would be)."""
    failed: str | None = None
    """Why the replay stopped early (the current letter was left in the queue)."""

    def lines(self) -> list[str]:
        verb = "would replay" if self.dry_run else "replayed"
        out = [
            f"read {self.read} dead letters, {self.matched} selected; {verb} {self.replayed} "
            f"({self.rows} rows) to {self.target}"
        ]
        if self.duplicates:
            removed = "would remove" if self.dry_run else "removed"
            line = (
                f"{self.duplicates} {'duplicate' if self.duplicates == 1 else 'duplicates'} of "
                f"the selected letters (dead-lettered more than once): {removed} "
                f"{self.duplicates_removed} once the letter they copy was published, none "
                "published again"
            )
            left = self.duplicates - self.duplicates_removed
            if left:
                line += f"; {left} left in the queue with their letter"
            out.append(line)
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
    summary = ReplaySummary(target=plan.target, dry_run=plan.dry_run)
    run = _Run(queue, selection, plan, summary, clocks)
    clock = clocks.monotonic
    shown = clock()
    try:
        async for letter in queue.letters():
            if not await run.take(letter):
                break
            if progress is not None and clock() - shown >= progress_every_s:
                shown = clock()
                progress(summary)
    finally:
        await run.flight.finish()
    if progress is not None:
        progress(summary)
    return summary


class _Run:
    """One replay's decisions, letter by letter as the queue gives them."""

    def __init__(
        self,
        queue: DeadLetterQueue,
        selection: Selection,
        plan: ReplayPlan,
        summary: ReplaySummary,
        clocks: Clocks,
    ) -> None:
        self._queue = queue
        self._selection = selection
        self._plan = plan
        self._summary = summary
        self._clocks = clocks
        self._begun = clocks.monotonic()
        self.flight = _Flight(summary, plan.in_flight)
        self._started: set[str] = set()
        """The letters this run publishes (their refs)."""
        self._handled: set[str] = set()
        """Every selected letter this run took a decision on (started, held back, a copy)."""
        self._firsts: dict[bytes, _First] = {}
        """The first selected letter of each ``copy_key``, which its copies follow."""
        self._copies_to_settle = False
        """Some letter started may have copies further on (then a ``limit`` reached does not
        end the read: the copies of what was replayed are still removed)."""

    async def take(self, letter: DeadLetter) -> bool:
        """Count, replay, hold back or follow ``letter``; False: read no more (one failed, or
        the limit is reached and nothing read later can be a copy of what was replayed)."""
        if not self._selects(letter):
            return True
        plan = self._plan
        copy_key = letter.copy_key
        first = None if copy_key is None else self._firsts.get(copy_key)
        if first is not None:
            return await self._follow(letter, first)
        if plan.limit is not None and len(self._started) >= plan.limit:
            return self._copies_to_settle  # only copies of what was replayed are still removed
        self._summary.matched += 1
        self._handled.add(letter.ref)
        if letter.replays >= plan.max_replays:
            self._summary.held_back += 1
            if copy_key is not None:
                self._firsts[copy_key] = _First(letter, None, held_back=True)
            return True
        return await self._start(letter, copy_key)

    def _selects(self, letter: DeadLetter) -> bool:
        """Counts ``letter`` read unless this run has seen it (again, or back after its
        replay); whether the selection takes it."""
        if letter.ref in self._handled:
            return False  # given again by the queue (a lapsed lease): dealt with already
        if letter.attributes.get(REPLAYED_FROM) in self._started:
            self._summary.came_back += 1  # a queue read to its live end (Pub/Sub) sees it again
            return False
        self._summary.read += 1
        return self._selection.matches(letter)

    async def _start(self, letter: DeadLetter, copy_key: bytes | None) -> bool:
        """Publish ``letter`` and then remove it (a dry run counts it); False once one failed."""
        plan = self._plan
        if plan.rate is not None and not plan.dry_run:
            due = self._begun + len(self._started) / plan.rate
            await _paced(due, self._clocks.monotonic, self._clocks.sleep)
        self._started.add(letter.ref)
        published: asyncio.Future[str | None] | None = None
        if not plan.dry_run:
            published = asyncio.get_running_loop().create_future()
        if copy_key is not None:
            self._firsts[copy_key] = _First(letter, published, held_back=False)
            self._copies_to_settle = True
        if published is None:
            self.flight.count(letter)
            return True
        return await self.flight.start(_replay_one(self._queue, letter, plan.target, published))

    async def _follow(self, copy: DeadLetter, first: _First) -> bool:
        """A copy of ``first``: removed once ``first`` is published (a dry run counts it),
        left with it when it is held back."""
        self._handled.add(copy.ref)
        self._summary.duplicates += 1
        if first.published is not None:
            return await self.flight.start(_remove_copy(self._queue, copy, first))
        if self._plan.dry_run and not first.held_back:
            self._summary.duplicates_removed += 1
        return True


@dataclass
class _First:
    """The first selected letter of an identity, which its copies follow: ``published`` is
    resolved with where it landed once its publish is confirmed, or with None when it is not
    (None itself: not published by this run, held back or a dry run)."""

    letter: DeadLetter
    published: asyncio.Future[str | None] | None
    held_back: bool


@dataclass(frozen=True)
class _Settled:
    """A letter this run replayed and removed, or (``copy``) a copy it removed."""

    letter: DeadLetter
    copy: bool = False


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
        self._tasks: set[asyncio.Task[_Settled | None]] = set()

    def count(self, letter: DeadLetter) -> None:
        self._summary.replayed += 1
        self._summary.rows += letter.row_count or 0

    async def start(self, step: Coroutine[Any, Any, _Settled | None]) -> bool:
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

    def _collect(self, done: set[asyncio.Task[_Settled | None]]) -> None:
        for task in done:
            error = task.exception()
            if error is None:
                settled = task.result()
                if settled is None:
                    continue  # a copy of a letter whose publish failed: left in the queue
                if settled.copy:
                    self._summary.duplicates_removed += 1
                else:
                    self.count(settled.letter)
            elif isinstance(error, ReplayStopped):
                if self._summary.failed is None:
                    self._summary.failed = str(error)
            else:
                raise error


class ReplayStopped(Exception):
    """A publish or a removal was not confirmed (the message says which, and why)."""


async def _replay_one(
    queue: DeadLetterQueue,
    letter: DeadLetter,
    target: str,
    published: asyncio.Future[str | None],
) -> _Settled:
    """Publish ``letter``, resolve ``published`` (where it landed, None when it did not), then
    remove it."""
    try:
        try:
            landed = await queue.publish(letter, target)
        except DeadLetterQueueError as exc:
            raise ReplayStopped(f"publishing {letter.ref} to {target} failed: {exc}") from exc
        _resolve(published, landed)
        try:
            await queue.remove(letter, landed)
        except DeadLetterQueueError as exc:
            raise ReplayStopped(
                f"{letter.ref} was replayed as {landed} but could not be removed from the "
                f"dead-letter queue ({exc}); a rerun replays it again, and its rows still land "
                "once (the chunk id is kept)"
            ) from exc
    finally:
        _resolve(published, None)  # not published (failed or cancelled): its copies stay
    return _Settled(letter)


async def _remove_copy(queue: DeadLetterQueue, copy: DeadLetter, first: _First) -> _Settled | None:
    """Remove ``copy`` once the publish of the letter it copies is confirmed; leave it (None)
    when that publish failed."""
    assert first.published is not None
    landed = await asyncio.shield(first.published)  # a cancelled copy cancels no publish
    if landed is None:
        return None
    try:
        await queue.remove(copy, landed)
    except DeadLetterQueueError as exc:
        raise ReplayStopped(
            f"{copy.ref} (a copy of {first.letter.ref}, replayed as {landed}) could not be "
            f"removed from the dead-letter queue ({exc}); a rerun removes it (or replays it "
            "again, and its rows still land once: the chunk id is kept)"
        ) from exc
    return _Settled(copy, copy=True)


def _resolve(future: asyncio.Future[str | None], landed: str | None) -> None:
    if not future.done():
        future.set_result(landed)


__all__ = [
    "DEFAULT_IN_FLIGHT",
    "DEFAULT_MAX_REPLAYS",
    "ReplayPlan",
    "ReplayStopped",
    "ReplaySummary",
    "replay",
]
