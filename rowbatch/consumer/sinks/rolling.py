"""A Parquet data file being written and rolled at a target size: rows are gathered to a row
group, then streamed out (to a local file or an object store), so a file of the target size never
sits in memory. Used by the sinks that commit large files (Iceberg, Parquet)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.parquet as pq

ROW_GROUP_BYTES: Final = 4 * 1024 * 1024
"""Most Arrow bytes gathered before they are written as one row group (an eighth of the target
file size when that is smaller; see :func:`row_group_bytes_for`): what the sink holds in memory
besides the writer's own pages."""
MIN_ROW_GROUP_BYTES: Final = 256 * 1024
ROW_GROUP_BUDGET_SHARE: Final = 64
"""A row group is at most a 64th of the memory budget (1 MiB at 64 MiB, 4 MiB from 256 MiB)."""
HELD_PER_ROW_GROUP: Final = 3
"""What an open file holds between writes, in row groups: the tables gathered, and while a
group is written, the writer's encoded and compressed pages of it (about 1.5x the group,
measured with pyarrow's pool: an 8 MiB group held ~2.5x its size in all)."""
OPEN_FILES: Final = 2
"""Open files a sink holds at once: one per day partition of ``processed_at``, so two for a
while around midnight (UTC)."""


def row_group_bytes_for(budget_bytes: int) -> int:
    """The row-group size for a memory budget: a 64th of it, within 256 KiB .. 4 MiB."""
    share = budget_bytes // ROW_GROUP_BUDGET_SHARE
    return max(MIN_ROW_GROUP_BYTES, min(ROW_GROUP_BYTES, share))


def held_bytes(row_group_bytes: int) -> int:
    """The most the open files hold between writes with row groups of this size."""
    return OPEN_FILES * HELD_PER_ROW_GROUP * row_group_bytes


class FileBroken(Exception):
    """A data file failed midway while rows were streamed into it (the store or the disk
    failed): the rows it held are gone from memory and from the store, so the messages they
    came from must be delivered again. Not transient: the consumer stops, and every message
    not yet acked (those rows' among them) is redelivered; nothing is lost."""

    def __init__(self, path: str, cause: BaseException) -> None:
        super().__init__(
            f"data file {path} failed midway ({type(cause).__name__}: {cause}); the rows "
            "streamed into it are lost, so the consumer stops and their messages are "
            "delivered again"
        )


Claims = Mapping[str, list[tuple[int, int]]]
"""Row ranges per chunk (the Iceberg sink's ledger claims; empty where unused)."""


@dataclass
class RollingFile:
    """A data file being written: rows are gathered to a row group, then streamed out."""

    path: str
    schema: pa.Schema
    open_stream: Callable[[], Any]
    """Opens the file's output stream (called at the first row group)."""
    target_bytes: int
    """Bytes written out at which the file is full (:attr:`full`)."""
    compression: str = "zstd"
    row_group_bytes: int = ROW_GROUP_BYTES
    """Arrow bytes gathered before they are written as one row group (at most an eighth of
    ``target_bytes``)."""
    rows: int = 0
    claims: list[Claims] = field(default_factory=list)
    _pending: list[pa.Table] = field(default_factory=list)
    _pending_bytes: int = 0
    _stream: Any = None
    _writer: pq.ParquetWriter | None = None
    _out: int = 0
    broken: BaseException | None = None
    """What failed while rows were being streamed out: the file cannot be finished, and the
    rows already streamed into it are gone (see :class:`FileBroken`)."""

    @property
    def written_bytes(self) -> int:
        """Bytes written out so far, and those gathered for the next row group."""
        return self._out_bytes() + self._pending_bytes

    @property
    def full(self) -> bool:
        """Whether the bytes written out (encoded and compressed) reached the target."""
        return self._out_bytes() >= self.target_bytes

    def _out_bytes(self) -> int:
        return self._out  # kept by the writing thread: safe to read from the event loop

    def add(self, table: pa.Table, claims: Claims) -> None:
        self._check()
        self._pending.append(table)
        self._pending_bytes += int(table.nbytes)
        self.rows += int(table.num_rows)
        self.claims.append(claims)
        if self._pending_bytes >= min(self.row_group_bytes, max(64 * 1024, self.target_bytes // 8)):
            self._flush()

    def drop_chunks(self, chunk_ids: set[str]) -> bool:
        """Drops the chunks' rows still gathered here; ``True`` when the written part of the
        file may hold some of them too (the file must then be closed and rewritten without
        them: its claims still name them)."""
        import pyarrow.compute as pc  # noqa: PLC0415 (only here: its library is ~5 MiB of RSS)

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
        self._check()
        group = pa.concat_tables(self._pending)
        if self._writer is None:  # nothing streamed yet: a failure to open loses nothing
            self._stream = self.open_stream()
            self._writer = pq.ParquetWriter(self._stream, self.schema, compression=self.compression)
        try:
            self._writer.write_table(group, row_group_size=max(1, int(group.num_rows)))
            self._out = int(self._stream.tell())
        except BaseException as exc:
            self.broken = exc
            raise
        self._pending, self._pending_bytes = [], 0

    def _check(self) -> None:
        if self.broken is not None:
            raise FileBroken(self.path, self.broken)

    def close(self) -> int | None:
        """Writes what is gathered and the footer; the file's size, ``None`` when no row was
        ever written (nothing was created)."""
        self._flush()
        if self._writer is None:
            return None
        self._check()
        try:
            self._writer.close()
            size = int(self._stream.tell())
            self._stream.close()
        except BaseException as exc:
            self.broken = exc
            raise
        self._writer = self._stream = None
        return size

    def abort(self) -> None:
        """Closes without caring for the file (it is never committed)."""
        self._pending, self._pending_bytes = [], 0
        for thing in (self._writer, self._stream):
            if thing is not None:
                with contextlib.suppress(Exception):  # best effort: the file is abandoned
                    thing.close()
        self._writer = self._stream = None
