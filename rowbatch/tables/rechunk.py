"""Cutting a stream of record batches into tables of exactly N rows (the chunks to publish)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa


def rechunk(batches: Iterable[pa.RecordBatch], rows: int) -> Iterator[pa.Table]:
    """Tables of exactly ``rows`` rows (the last one may be shorter), in input order."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, not {rows}")
    pending: list[pa.RecordBatch] = []
    held = 0
    for batch in batches:
        offset = 0
        while offset < batch.num_rows:
            take = min(rows - held, batch.num_rows - offset)
            pending.append(batch.slice(offset, take))
            offset += take
            held += take
            if held == rows:
                yield pa.Table.from_batches(pending)
                pending, held = [], 0
    if held:
        yield pa.Table.from_batches(pending)


__all__ = ["rechunk"]
