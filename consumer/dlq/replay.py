"""``dlq replay``: publish the selected dead letters back and remove each from the queue once
its publish is confirmed, in that order, one at a time. A crash between the two leaves the
letter in the queue, so a rerun publishes it again: the chunk keeps its id, and the sinks write
a chunk id's rows once, so the rows still land once. A letter replayed ``max_replays`` times
already (it failed again after each) is held back, not replayed into the same failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from rowbatch.consumer.dlq.letters import REPLAYED_FROM, DeadLetter
from rowbatch.consumer.dlq.queue import DeadLetterQueue, DeadLetterQueueError
from rowbatch.consumer.dlq.selection import Selection

DEFAULT_MAX_REPLAYS = 3


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
    *,
    target: str,
    limit: int | None = None,
    dry_run: bool = False,
    max_replays: int = DEFAULT_MAX_REPLAYS,
    progress: Callable[[ReplaySummary], None] | None = None,
    progress_every_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
) -> ReplaySummary:
    """Replay what ``selection`` picks (at most ``limit``) to ``target``; ``progress`` is
    called every ``progress_every_s`` and at the end. Broker errors end the replay early with
    ``failed`` set; they are not raised."""
    summary = ReplaySummary(target=target, dry_run=dry_run)
    done: set[str] = set()
    shown = clock()
    try:
        async for letter in queue.letters():
            if letter.attributes.get(REPLAYED_FROM) in done:
                summary.came_back += 1  # a queue read to its live end (Pub/Sub) sees it again
                continue
            summary.read += 1
            if not selection.matches(letter):
                continue
            if limit is not None and summary.replayed >= limit:
                break
            summary.matched += 1
            if letter.replays >= max_replays:
                summary.held_back += 1
                continue
            if not dry_run:
                await _replay_one(queue, letter, target)
            summary.replayed += 1
            summary.rows += letter.row_count or 0
            done.add(letter.ref)
            if progress is not None and clock() - shown >= progress_every_s:
                shown = clock()
                progress(summary)
    except ReplayStopped as exc:
        summary.failed = str(exc)
    if progress is not None:
        progress(summary)
    return summary


class ReplayStopped(Exception):
    """A publish or a removal was not confirmed (the message says which, and why)."""


async def _replay_one(queue: DeadLetterQueue, letter: DeadLetter, target: str) -> None:
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


__all__ = ["DEFAULT_MAX_REPLAYS", "ReplayStopped", "ReplaySummary", "replay"]
