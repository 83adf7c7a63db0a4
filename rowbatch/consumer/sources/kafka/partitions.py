"""The partitions a Kafka group member owns: each assignment's epoch, the records of each that
are in flight, committing their offsets, and the rebalance listener that tells of changes.

Commits (``enable_auto_commit=False``): records are settled out of order (batches complete
out of order; a record may wait for a retry). An ``OffsetTracker`` keeps the unsettled
offsets of each partition; the offset committed for a partition is the lowest unsettled
offset, or one past the highest received when none is (Kafka's committed offset is the first
record *not* done). Settled means durably written (``ack``) or confirmed in the dead-letter
topic (``dead_letter``); a record nacked or buffered is not settled, so a commit never passes
it. Commits run every ``commit_interval_s``, on revoke, and on ``close``, serialised by a lock
and only when the offset moved.

Rebalances (aiokafka rebalances eagerly: every rebalance revokes *all* partitions and assigns
afresh). On revoke the source stops taking records of those partitions (their buffered and
retry-waiting records are dropped: not settled, so not committed past), waits up to
``revoke_grace_s`` for their in-flight records to settle, commits what is committable, then
forgets them. Each assignment of a partition gets a new *epoch*; a record from an earlier
epoch that settles later is ignored for commits (``ack`` is a no-op, a ``dead_letter`` is not
published: the partition's next owner, reading from the committed offset, processes it
again). After a rebalance aiokafka starts each assigned partition at its committed offset,
so records in flight when it was revoked are read again, by this member or another: the same
rows are written twice under the same ``(chunk_id, row_index)`` key, which the sinks upsert,
so the table holds them once. ``revoke_grace_s + commit_timeout_s`` must stay below
``rebalance_timeout_ms``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from rowbatch.consumer.sources.kafka.offsets import OffsetTracker
from rowbatch.consumer.sources.kafka.records import Held, hold

_LOG = logging.getLogger(__name__)


class RebalanceListener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """Hands aiokafka's revoke and assign callbacks to ``on_revoked``/``on_assigned``."""

    def __init__(
        self,
        on_revoked: Callable[[set[TopicPartition]], Awaitable[None]],
        on_assigned: Callable[[set[TopicPartition]], None],
    ) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        self._on_assigned(set(assigned))


class Partitions:
    """The partitions of ``topic`` this member owns, and their offsets."""

    def __init__(self, topic: str, commit_timeout_s: float) -> None:
        self._topic = topic
        self._commit_timeout_s = commit_timeout_s
        self._commit_lock = asyncio.Lock()
        self._tracker: OffsetTracker[TopicPartition] = OffsetTracker()
        self._epochs: dict[TopicPartition, int] = {}
        """Assigned partitions (including ones being revoked) -> their current epoch."""
        self._epoch_ids = itertools.count(1)
        self.fetching: set[TopicPartition] = set()
        """Assigned partitions whose records are taken and yielded (not being revoked)."""
        self._inflight: Counter[tuple[TopicPartition, int]] = Counter()
        """Yielded and not yet settled, per (partition, epoch)."""
        self._committed: dict[TopicPartition, int] = {}
        """What this member last committed per partition, in the current epoch."""
        self.settled = asyncio.Event()
        """Set whenever a yielded record is settled (a revoke waits on it)."""
        self.assignments = 0
        """Partition assignments received (1 after joining; +1 per rebalance)."""
        self.commits = 0
        """Successful offset commits."""

    # -- assignment ----------------------------------------------------------------------------

    def assign(self, assigned: set[TopicPartition]) -> set[TopicPartition]:
        """Start a new epoch for each assigned partition of the topic; returns those."""
        mine = {tp for tp in assigned if tp.topic == self._topic}
        for tp in mine:
            self._epochs[tp] = next(self._epoch_ids)
            self.fetching.add(tp)
        self.assignments += 1
        _LOG.info("assigned %s", show_tps(mine))
        return mine

    def revoking(self, revoked: set[TopicPartition]) -> set[TopicPartition]:
        """Stop taking records of the owned ones of ``revoked``; returns those (``forget``
        them once the revoke is done)."""
        tps = {tp for tp in revoked if tp in self._epochs}
        self.fetching -= tps
        return tps

    async def drain(
        self, tps: set[TopicPartition], grace_s: float, closed: Callable[[], bool]
    ) -> None:
        """Wait up to ``grace_s`` for the in-flight records of ``tps`` to settle."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s

        def inflight() -> int:
            return sum(self._inflight[(tp, self._epochs[tp])] for tp in tps)

        while (left := inflight()) and not closed():
            remaining = deadline - loop.time()
            if remaining <= 0:
                _LOG.warning(
                    "revoke: %d record(s) of %s still in flight after %g s; not "
                    "committing past them (the next owner reads them again)",
                    left,
                    show_tps(tps),
                    grace_s,
                )
                break
            self.settled.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self.settled.wait()

    def forget(self, tps: set[TopicPartition]) -> None:
        """The revoke of ``tps`` is over: later settles of their records are ignored."""
        for tp in tps:
            epoch = self._epochs.pop(tp)
            self._inflight.pop((tp, epoch), None)
            self._tracker.forget(tp)
            self._committed.pop(tp, None)
        _LOG.info("revoked %s", show_tps(tps))

    # -- records -------------------------------------------------------------------------------

    def received(self, tp: TopicPartition, records: Iterable[Any]) -> list[Held]:
        """The records of a fetch of ``tp`` not taken before, now tracked; none when ``tp``
        was revoked while the fetch was on its way."""
        if tp not in self.fetching:
            return []
        epoch = self._epochs[tp]
        last = self._tracker.last_received(tp)
        taken: list[Held] = []
        for record in records:
            if last is not None and record.offset <= last:
                continue  # fetched twice (aiokafka re-fetch after a pause): have it
            self._tracker.received(tp, record.offset)
            last = record.offset
            taken.append(hold(record, tp, epoch))
        return taken

    def is_assigned(self, held: Held) -> bool:
        """Fetched under the current assignment of its partition (which may be being
        revoked: its settles still count until the revoke's commit)."""
        return self._epochs.get(held.tp) == held.epoch

    def is_current(self, held: Held) -> bool:
        """Assigned, and its partition not being revoked: may be yielded (again)."""
        return held.tp in self.fetching and self.is_assigned(held)

    def yielded(self, held: Held) -> None:
        self._inflight[(held.tp, held.epoch)] += 1

    def returned(self, held: Held) -> None:
        """A yielded record is no longer in flight (settled, nacked or dropped)."""
        key = (held.tp, held.epoch)
        if self._inflight[key] <= 1:
            self._inflight.pop(key, None)
        else:
            self._inflight[key] -= 1
        self.settled.set()

    def settle(self, held: Held) -> bool:
        """Its offset may be committed past; False when it was already, or belongs to an
        earlier assignment (its next owner reads it again)."""
        if not self.is_assigned(held):
            return False
        return self._tracker.settled(held.tp, held.record.offset)

    # -- commits -------------------------------------------------------------------------------

    def committable(self) -> dict[TopicPartition, int]:
        """What a commit now would send, per current partition."""
        out: dict[TopicPartition, int] = {}
        for tp in self.fetching:
            offset = self._tracker.committable(tp)
            if offset is not None:
                out[tp] = offset
        return out

    async def commit(self, consumer: Any, tps: set[TopicPartition], why: str) -> None:
        """Commit the committable offset of each of ``tps`` that moved since the last
        commit. Failures are logged: the offset is committed later, or the partition's next
        owner re-reads from the last commit (never past an unsettled record)."""
        async with self._commit_lock:
            offsets: dict[TopicPartition, int] = {}
            for tp in tps:
                if tp not in self._epochs:
                    continue
                offset = self._tracker.committable(tp)
                if offset is not None and offset > self._committed.get(tp, -1):
                    offsets[tp] = offset
            if not offsets:
                return
            try:
                async with asyncio.timeout(self._commit_timeout_s):
                    await consumer.commit(offsets)
            except CommitFailedError as exc:
                _LOG.warning("%s commit refused (group rebalanced): %s", why, exc)
                return
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.warning("%s commit of %s failed: %r", why, show_offsets(offsets), exc)
                return
            self._committed.update(offsets)
            self.commits += 1
            _LOG.debug("%s commit: %s", why, show_offsets(offsets))


def show_offsets(offsets: Mapping[TopicPartition, int]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}@{o}" for tp, o in sorted(offsets.items()))


def show_tps(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(tps)) or "nothing"


__all__ = ["Partitions", "RebalanceListener", "show_offsets", "show_tps"]
