"""Data files being written: one open Parquet file per day partition, streamed to the warehouse
(local or object store, through the table's FileIO) a row group at a time, so a file of
``target_file_bytes`` never sits in memory; and the rewrite of a closed file without some rows
(rows dead-lettered, or committed by another writer meanwhile)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rowbatch.consumer.sinks.iceberg.ledger import Claims, Ranges, contains, merge_claims
from rowbatch.consumer.sinks.iceberg.schema import PARTITION_NAME

ROW_GROUP_BYTES: Final = 4 * 1024 * 1024
"""Arrow bytes gathered before they are written as one row group (an eighth of the target file
size when that is smaller): what the sink holds in memory besides the writer's own pages
(about as much again)."""


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


@dataclass
class OpenFile:
    """A data file being written: rows are gathered to a row group, then streamed out."""

    path: str
    schema: pa.Schema
    io: Any
    target_bytes: int
    """Bytes written out at which the file is full (:attr:`full`)."""
    compression: str = "zstd"
    rows: int = 0
    claims: list[Claims] = field(default_factory=list)
    _pending: list[pa.Table] = field(default_factory=list)
    _pending_bytes: int = 0
    _stream: Any = None
    _writer: pq.ParquetWriter | None = None

    @property
    def written_bytes(self) -> int:
        """Bytes written out so far, and those gathered for the next row group."""
        return self._out_bytes() + self._pending_bytes

    @property
    def full(self) -> bool:
        """Whether the bytes written out (encoded and compressed) reached the target."""
        return self._out_bytes() >= self.target_bytes

    def _out_bytes(self) -> int:
        return int(self._stream.tell()) if self._stream is not None else 0

    def add(self, table: pa.Table, claims: Claims) -> None:
        self._pending.append(table)
        self._pending_bytes += int(table.nbytes)
        self.rows += int(table.num_rows)
        self.claims.append(claims)
        if self._pending_bytes >= min(ROW_GROUP_BYTES, max(64 * 1024, self.target_bytes // 8)):
            self._flush()

    def drop_chunks(self, chunk_ids: set[str]) -> bool:
        """Drops the chunks' rows still gathered here; ``True`` when the written part of the
        file may hold some of them too (the file must then be closed and rewritten without
        them: its claims still name them)."""
        gone = pa.array(sorted(chunk_ids), type=pa.string())
        kept = []
        for part in self._pending:
            keep = pc.invert(pc.is_in(part["chunk_id"], value_set=gone))
            kept.append(part.filter(keep))
        self.rows -= sum(p.num_rows for p in self._pending) - sum(p.num_rows for p in kept)
        self._pending = [p for p in kept if p.num_rows]
        self._pending_bytes = sum(int(p.nbytes) for p in self._pending)
        if self._writer is not None:
            return True
        self.claims = [
            {c: r for c, r in part.items() if c not in chunk_ids} for part in self.claims
        ]
        return False

    def _flush(self) -> None:
        if not self._pending:
            return
        group = pa.concat_tables(self._pending)
        self._pending, self._pending_bytes = [], 0
        if self._writer is None:
            self._stream = self.io.new_output(self.path).create(overwrite=True)
            self._writer = pq.ParquetWriter(self._stream, self.schema, compression=self.compression)
        self._writer.write_table(group, row_group_size=max(1, int(group.num_rows)))

    def close(self) -> ClosedFile | None:
        """Writes what is gathered and the footer; ``None`` when no row was ever added."""
        self._flush()
        if self._writer is None:
            return None
        self._writer.close()
        size = int(self._stream.tell())
        self._stream.close()
        self._writer = self._stream = None
        return ClosedFile(self.path, self.rows, merge_claims(self.claims), size)

    def abort(self) -> None:
        """Closes without caring for the file (it is never committed)."""
        self._pending, self._pending_bytes = [], 0
        for thing in (self._writer, self._stream):
            if thing is not None:
                with contextlib.suppress(Exception):  # best effort: the file is abandoned
                    thing.close()
        self._writer = self._stream = None


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
