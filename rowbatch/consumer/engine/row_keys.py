"""The keys of a batch's rows, ``(chunk_id, row_index)``, from the ledger: the result table's
primary key, and what a rollout hashes to put each row in an arm."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Segment
from rowbatch.consumer.engine.ledger import Entry, Ledger


@dataclass(frozen=True, eq=False)
class RowKeys:
    """The keys of the rows of some segments, in batch order."""

    chunk_ids: tuple[str, ...]
    """One per segment."""
    message_ids: tuple[str, ...]
    """The source's message id, one per segment."""
    lengths: tuple[int, ...]
    """Rows per segment."""
    row_index: NDArray[np.int64]
    """One per row: its index in its chunk."""

    def per_row(self, values: Sequence[str]) -> NDArray[np.object_]:
        """A per-segment value (``chunk_ids``, ``message_ids``) repeated for each row."""
        return np.repeat(np.array(values, dtype=object), self.lengths)


def row_keys(ledger: Ledger, segments: Sequence[Segment]) -> RowKeys:
    """The keys of ``segments``' rows (messages held in ``ledger``)."""
    entries = [ledger.get(s.message) for s in segments]
    lengths = tuple(len(s) for s in segments)
    index = (
        _keyed(segments, entries)
        if any(e.row_keys is not None for e in entries)
        else _row_indexes(
            [s.start + e.delivery.row_offset for s, e in zip(segments, entries, strict=True)],
            lengths,
        )
    )
    return RowKeys(
        tuple(e.chunk_id for e in entries),
        tuple(e.delivery.message_id for e in entries),
        lengths,
        index,
    )


def _keyed(segments: Sequence[Segment], entries: Sequence[Entry]) -> NDArray[np.int64]:
    """The rows' keys where some message's rows have keys of their own (a row part: their
    indexes in its parent chunk; rows set apart at intake: their indexes in the message),
    shifted by the delivery's ``row_offset`` (a table-mode part of a chunk; 0 otherwise)."""
    parts = [
        np.arange(s.start, s.stop, dtype=np.int64) + e.delivery.row_offset
        if e.row_keys is None
        else e.row_keys[s.start : s.stop] + e.delivery.row_offset
        for s, e in zip(segments, entries, strict=True)
    ]
    return np.concatenate(parts).astype(np.int64, copy=False)


def _row_indexes(starts: Sequence[int], lengths: Sequence[int]) -> NDArray[np.int64]:
    """``start, start + 1, ... start + length - 1`` for each segment, joined: one ``arange``
    over all the rows, shifted per segment (not one ``arange`` a message)."""
    counts = np.asarray(lengths, dtype=np.int64)
    shifts = np.asarray(starts, dtype=np.int64) - (np.cumsum(counts) - counts)
    indexes: NDArray[np.int64] = np.arange(int(counts.sum()), dtype=np.int64)
    indexes += np.repeat(shifts, counts)
    return indexes
