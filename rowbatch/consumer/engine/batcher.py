"""Rows from many messages packed into batches of the model's preferred size.

A message's rows are queued whole and taken in arrival order; a message may span several
batches. A batch is flushed when ``target`` rows are waiting, or when the oldest waiting row has
waited ``max_wait_s`` (the latency bound). The clock is injected, so tests need no sleeping.
"""

from __future__ import annotations

import functools
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rowbatch.timing import Clock


@dataclass(frozen=True)
class Segment:
    """A run of consecutive rows of one message inside a batch."""

    message: int
    """The message's ledger key."""
    start: int
    """Index, inside the message, of the segment's first row."""
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, eq=False)
class Batch:
    """Rows ready for one inference call: table columns concatenated across segments."""

    columns: Mapping[str, NDArray[Any]]
    nulls: Mapping[str, NDArray[np.bool_]]
    """Null masks (True = null) for the columns that have a null in this batch."""
    segments: tuple[Segment, ...]
    oldest_at: float
    """Clock time at which the batch's oldest row was queued."""

    def __len__(self) -> int:
        return self._rows

    @functools.cached_property
    def _rows(self) -> int:
        """Rows in the batch (counted once: a batch of many small messages has many segments,
        and the pipeline asks several times)."""
        return sum(s.stop - s.start for s in self.segments)

    def offsets(self) -> list[int]:
        """Row offset of each segment inside the batch."""
        out, at = [], 0
        for seg in self.segments:
            out.append(at)
            at += len(seg)
        return out

    def rows_of(self, chosen: Sequence[Segment]) -> NDArray[np.int64]:
        """Row positions, inside this batch, of the segments ``chosen``."""
        where = dict(zip(self.segments, self.offsets(), strict=True))
        parts = [np.arange(where[s], where[s] + len(s), dtype=np.int64) for s in chosen]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def rows(self, start: int, stop: int, segment: Segment) -> Batch:
        """Rows ``[start, stop)`` (positions in this batch, all of one segment's) as a batch
        of their own, ``segment`` naming them in their message."""
        nulls = {k: m[start:stop] for k, m in self.nulls.items() if m[start:stop].any()}
        columns = {k: v[start:stop] for k, v in self.columns.items()}
        return Batch(columns, nulls, (segment,), self.oldest_at)

    def where(self, mask: NDArray[np.bool_]) -> Batch | None:
        """The rows ``mask`` picks, as a batch whose segments are their runs inside each
        message (``None``: no row picked)."""
        if not mask.any():
            return None
        if mask.all():
            return self
        segments: list[Segment] = []
        for segment, at in zip(self.segments, self.offsets(), strict=True):
            picked = mask[at : at + len(segment)]
            if picked.all():
                segments.append(segment)
                continue
            edges = np.flatnonzero(np.diff(np.concatenate(([False], picked, [False]))))
            for low, high in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                segments.append(Segment(segment.message, segment.start + low, segment.start + high))
        index = np.flatnonzero(mask)
        nulls = {k: m[index] for k, m in self.nulls.items() if m[index].any()}
        return Batch(
            {k: v[index] for k, v in self.columns.items()}, nulls, tuple(segments), self.oldest_at
        )

    def select(self, chosen: Sequence[Segment]) -> Batch:
        """A batch of just ``chosen`` (segments of this batch), e.g. one half of a bisection."""
        index = self.rows_of(chosen)
        nulls = {k: m[index] for k, m in self.nulls.items() if m[index].any()}
        return Batch(
            columns={k: v[index] for k, v in self.columns.items()},
            nulls=nulls,
            segments=tuple(chosen),
            oldest_at=self.oldest_at,
        )


@dataclass
class _Pending:
    message: int
    columns: Mapping[str, NDArray[Any]]
    nulls: Mapping[str, NDArray[np.bool_]]
    rows: int
    queued_at: float
    taken: int = 0

    @property
    def left(self) -> int:
        return self.rows - self.taken


@dataclass
class Batcher:
    target: int
    max_wait_s: float
    clock: Clock = time.monotonic
    on_shrink: Callable[[], None] | None = None
    """Called whenever queued rows leave the queue (batched, discarded or withdrawn)."""
    _queue: deque[_Pending] = field(default_factory=deque, init=False)
    _rows: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.target < 1:
            raise ValueError(f"batch target size must be >= 1, got {self.target}")
        if self.max_wait_s < 0:
            raise ValueError(f"max_wait must be >= 0 s, got {self.max_wait_s}")

    @property
    def pending_rows(self) -> int:
        return self._rows

    def add(
        self,
        message: int,
        columns: Mapping[str, NDArray[Any]],
        nulls: Mapping[str, NDArray[np.bool_]] | None = None,
    ) -> None:
        """Queue all rows of one message (every column has the same number of rows)."""
        count = 0
        for i, values in enumerate(columns.values()):
            if i == 0:
                count = int(values.shape[0])
            elif values.shape[0] != count:
                rows = sorted({int(v.shape[0]) for v in columns.values()})
                raise ValueError(f"message {message}: columns have different lengths {rows}")
        if count == 0:
            return
        self._queue.append(_Pending(message, columns, nulls or {}, count, self.clock()))
        self._rows += count

    def next_deadline(self) -> float | None:
        """Clock time at which the oldest queued row reaches ``max_wait_s``; None if empty."""
        return self._queue[0].queued_at + self.max_wait_s if self._queue else None

    def ready(self) -> Batch | None:
        """A full batch if ``target`` rows wait, a partial one if the oldest row waited long
        enough, else None."""
        if self._rows >= self.target:
            return self._take(self.target)
        deadline = self.next_deadline()
        if deadline is not None and self.clock() >= deadline:
            return self._take(self._rows)
        return None

    def drain(self) -> list[Batch]:
        """Everything queued, in batches of at most ``target`` rows (for shutdown)."""
        out = []
        while self._rows:
            out.append(self._take(min(self.target, self._rows)))
        return out

    def discard(self, message: int) -> int:
        """Drop the queued rows of ``message``; returns how many were dropped."""
        dropped = 0
        kept: deque[_Pending] = deque()
        for p in self._queue:
            if p.message == message:
                dropped += p.left
            else:
                kept.append(p)
        self._queue = kept
        self._rows -= dropped
        self._shrunk()
        return dropped

    def withdraw(self, messages: Collection[int]) -> list[int]:
        """Drop the messages of ``messages`` none of whose rows has been batched yet; returns
        those dropped (a message already partly batched stays: its other rows follow)."""
        wanted = set(messages)
        dropped: list[int] = []
        kept: deque[_Pending] = deque()
        for p in self._queue:
            if p.message in wanted and p.taken == 0:
                dropped.append(p.message)
                self._rows -= p.rows
            else:
                kept.append(p)
        if dropped:
            self._queue = kept
            self._shrunk()
        return dropped

    def _shrunk(self) -> None:
        if self.on_shrink is not None:
            self.on_shrink()

    def _take(self, want: int) -> Batch:
        parts: list[tuple[_Pending, int, int]] = []
        queue = self._queue
        oldest = queue[0].queued_at
        self._rows -= want
        while want > 0:
            head = queue[0]
            start = head.taken
            n = head.rows - start
            if n <= want:
                queue.popleft()
            else:
                n = want
            head.taken = start + n
            parts.append((head, start, start + n))
            want -= n
        self._shrunk()
        return _concat(parts, oldest)


def _concat(parts: Sequence[tuple[_Pending, int, int]], oldest: float) -> Batch:
    names = list(parts[0][0].columns)
    if len(parts) == 1:
        p, a, b = parts[0]
        columns = {k: p.columns[k][a:b] for k in names}
    else:
        # Whole messages (the common case for small ones) go in as they are, without a slice.
        whole = [a == 0 and b == p.rows for p, a, b in parts]
        columns = {
            k: np.concatenate(
                [
                    p.columns[k] if w else p.columns[k][a:b]
                    for (p, a, b), w in zip(parts, whole, strict=True)
                ]
            )
            for k in names
        }
    nulls: dict[str, NDArray[np.bool_]] = {}
    for name in {k for p, _, _ in parts for k in p.nulls}:
        masks = [
            p.nulls[name][a:b] if name in p.nulls else np.zeros(b - a, np.bool_)
            for p, a, b in parts
        ]
        mask = np.concatenate(masks)
        if mask.any():
            nulls[name] = mask
    segments = tuple(Segment(p.message, a, b) for p, a, b in parts)
    return Batch(columns=columns, nulls=nulls, segments=segments, oldest_at=oldest)
