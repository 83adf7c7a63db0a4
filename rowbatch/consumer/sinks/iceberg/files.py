"""Data files of the Iceberg sink: where a new one goes, the closed ones waiting for a commit,
and the rewrite of a file without some rows (rows dead-lettered, or committed by another writer
meanwhile). Files being written are :class:`rowbatch.consumer.sinks.rolling.RollingFile`."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from rowbatch.consumer.sinks.iceberg.ledger import Claims, Ranges, contains
from rowbatch.consumer.sinks.iceberg.schema import PARTITION_NAME


def data_path(location: str, day: str) -> str:
    """A new data file's full path under the table's location."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%f")
    return f"{location.rstrip('/')}/data/{PARTITION_NAME}={day}/{stamp}-{uuid.uuid4().hex}.parquet"


@dataclass
class ClosedFile:
    """A data file written in full and not yet committed, with the rows it holds."""

    path: str
    rows: int
    claims: Claims
    size: int = 0


def rows_without(
    io: Any, src: str, schema: pa.Schema, gone: Mapping[str, Ranges]
) -> pa.Table | None:
    """The rows of the data file ``src`` not in ``gone``; ``None`` when it holds none of them."""
    with io.new_input(src).open() as stream:
        table = pq.read_table(stream, schema=schema)
    chunk = np.asarray(table["chunk_id"].to_numpy(zero_copy_only=False), dtype=object)
    rows = table["row_index"].to_numpy()
    drop = np.zeros(table.num_rows, dtype=bool)
    for chunk_id, ranges in gone.items():
        mine = chunk == chunk_id
        if mine.any():
            drop[mine] = contains(ranges, rows[mine])
    return table.filter(pa.array(~drop)) if drop.any() else None


def write_rows(io: Any, table: pa.Table, path: str) -> int:
    """Writes ``table`` as the data file ``path``; its size in bytes."""
    with io.new_output(path).create(overwrite=True) as out:
        pq.write_table(table, out, compression="zstd")
        return int(out.tell())


def without(
    io: Any, closed: ClosedFile, schema: pa.Schema, gone: Mapping[str, Ranges], path: str
) -> ClosedFile | None:
    """``closed`` rewritten to ``path`` without the rows in ``gone``; ``None`` when no row is
    left. The old file is left for the table's orphan-file cleanup (it was never committed)."""
    remaining: Claims = {}
    for chunk_id, ranges in closed.claims.items():
        left = _subtract(ranges, gone.get(chunk_id, []))
        if left:
            remaining[chunk_id] = left
    kept = rows_without(io, closed.path, schema, gone)
    if kept is None:  # the claims may still have named them (rows dropped before a flush)
        return ClosedFile(closed.path, closed.rows, remaining, closed.size) if remaining else None
    if kept.num_rows == 0:
        return None
    return ClosedFile(path, int(kept.num_rows), remaining, write_rows(io, kept, path))


def _subtract(ranges: Ranges, holes: Ranges) -> Ranges:
    out: Ranges = []
    for start, end in ranges:
        cursor = start
        for h_start, h_end in holes:
            if h_end <= cursor or h_start >= end:
                continue
            if h_start > cursor:
                out.append((cursor, h_start))
            cursor = max(cursor, h_end)
        if cursor < end:
            out.append((cursor, end))
    return out
