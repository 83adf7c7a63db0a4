"""Per-partition completion tracking for ordered offset commits (Kafka).

Records of one partition are *received* in offset order but *settled* (written, or
dead-lettered) in any order: batches complete out of order, a message may wait for a retry.
Kafka keeps one committed offset per partition, meaning "every record below this one is
done; start here". So the offset to commit is the lowest offset still unsettled, or, when
nothing is unsettled, one past the highest offset received. Offsets that were never received
(gaps left by transaction markers or compaction) are skipped over like settled ones.

The tracker is pure (no I/O, no clock) and keeps only the *unsettled* offsets of a partition,
so its memory is bounded by what is in flight, not by how far the partition has advanced.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

P = TypeVar("P", bound=Hashable)
"""A partition key: ``aiokafka.TopicPartition`` in the source, anything hashable in tests."""


@dataclass
class _Partition:
    pending: set[int] = field(default_factory=set)
    """Received, not yet settled."""
    heap: list[int] = field(default_factory=list)
    """``pending`` as a min-heap, with settled offsets removed lazily."""
    last_received: int = -1


class OffsetTracker(Generic[P]):
    """Which offsets of each partition may be committed.

    ``received(tp, offset)`` when a record is taken from the broker (offsets of a partition
    strictly increasing), ``settled(tp, offset)`` when it is durably written or
    dead-lettered, ``committable(tp)`` for the offset to commit (Kafka semantics: the first
    record not yet done), ``forget(tp)`` when the partition is revoked (later settles of its
    records are then ignored: ``settled`` returns False).
    """

    def __init__(self) -> None:
        self._parts: dict[P, _Partition] = {}

    def received(self, tp: P, offset: int) -> None:
        """Track a record taken from the broker. Raises ``ValueError`` unless ``offset`` is
        above every offset received for ``tp`` since it was last forgotten."""
        if offset < 0:
            raise ValueError(f"{tp}: offset must be >= 0, not {offset}")
        part = self._parts.get(tp)
        if part is None:
            part = self._parts[tp] = _Partition()
        if offset <= part.last_received:
            raise ValueError(
                f"{tp}: offset {offset} received after {part.last_received} "
                f"(offsets of a partition must increase)"
            )
        part.last_received = offset
        part.pending.add(offset)
        heapq.heappush(part.heap, offset)

    def settled(self, tp: P, offset: int) -> bool:
        """The record is done (written, or dead-lettered). Returns False, changing nothing,
        when it is not pending: already settled, or its partition was forgotten since."""
        part = self._parts.get(tp)
        if part is None or offset not in part.pending:
            return False
        part.pending.discard(offset)
        heap = part.heap
        while heap and heap[0] not in part.pending:
            heapq.heappop(heap)
        return True

    def committable(self, tp: P) -> int | None:
        """The offset to commit for ``tp``: the lowest unsettled offset, else one past the
        highest received; None when nothing was received since ``tp`` was last forgotten."""
        part = self._parts.get(tp)
        if part is None:
            return None
        if part.heap:
            return part.heap[0]
        return part.last_received + 1

    def last_received(self, tp: P) -> int | None:
        part = self._parts.get(tp)
        return None if part is None else part.last_received

    def pending(self, tp: P) -> int:
        """How many records of ``tp`` are received and not yet settled."""
        part = self._parts.get(tp)
        return 0 if part is None else len(part.pending)

    def forget(self, tp: P) -> None:
        """Drop everything known about ``tp`` (revoked): its next ``received`` starts afresh,
        and settles of records received before are ignored."""
        self._parts.pop(tp, None)

    def partitions(self) -> Iterator[P]:
        return iter(list(self._parts))

    def __contains__(self, tp: object) -> bool:
        return tp in self._parts


__all__ = ["OffsetTracker"]
