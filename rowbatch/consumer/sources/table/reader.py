"""Reading the units of a table run as pieces (rows ``[first, first + rows)`` of one file, at
most ``chunk_rows`` of them), streamed: a Parquet row group batch by batch (a whole Parquet file
row group after row group), a text file block by block (never a whole file in memory), only
the columns the binding reads; hive partition values become string columns."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rowbatch.consumer.sources.table.plan import TableInputError, Unit
from rowbatch.tables.bad_lines import BadLine
from rowbatch.tables.csv import csv_rows
from rowbatch.tables.formats import InputFormat
from rowbatch.tables.jsonl import jsonl_rows
from rowbatch.wire.columns.column_type import ColumnType

BLOCK_BYTES: Final = 8 << 20
"""Text formats are parsed this many bytes at a time (a JSON line must fit in one block)."""


@dataclass(frozen=True, eq=False)
class Piece:
    """Rows ``[first_row, first_row + len(table))`` of one file: the rows of one chunk as the
    reader cut it, or a part of one (:meth:`part`), which keeps the chunk's keys."""

    unit: Unit
    first_row: int
    """Within the file."""
    table: pa.Table
    origin: int = -1
    """The file row the chunk this piece is part of begins at (``first_row`` when the piece
    is a whole chunk: the default)."""
    bad_line: BadLine | None = None
    """A line of a text file that is no row (too many fields, a value that does not convert):
    the piece is that one row (its table holds the line's text), to dead-letter."""

    def __post_init__(self) -> None:
        if self.origin < 0:
            object.__setattr__(self, "origin", self.first_row)

    @property
    def rows(self) -> int:
        return int(self.table.num_rows)

    @property
    def chunk_id(self) -> str:
        """``<file key>@<chunk's first row>``: with :attr:`row_offset` ``+ i`` as the row
        index, row ``i`` of this piece is keyed by its file row, so a part of a chunk (the
        rows a restart had left to do, a half of a dead-lettered chunk) writes the same keys
        as the whole chunk would have (the reader cuts a file the same way every run)."""
        return f"{self.unit.file.key}@{self.origin}"

    @property
    def row_offset(self) -> int:
        """The index, in its chunk, of the piece's first row."""
        return self.first_row - self.origin

    @property
    def message_id(self) -> str:
        """``<file key>@<first row>``: the piece's own id (parts of one chunk in flight at
        the same time have different ids)."""
        return f"{self.unit.file.key}@{self.first_row}"

    def part(self, offset: int, rows: int) -> Piece:
        """Rows ``[offset, offset + rows)`` of this piece (of the same chunk)."""
        return Piece(
            self.unit,
            self.first_row + offset,
            self.table.slice(offset, rows),
            self.origin,
            self.bad_line,
        )


HIVE_NULL: Final = "__HIVE_DEFAULT_PARTITION__"
"""Hive's (and Spark's) directory name for a null partition value."""


def _with_partitions(table: pa.Table, unit: Unit, wanted: Sequence[str] | None) -> pa.Table:
    """The hive partition values of the unit's path as string columns (URL-decoded, as Hive
    and Spark write them; ``__HIVE_DEFAULT_PARTITION__`` is null)."""
    for name, raw in unit.file.partitions:
        if name in table.column_names or (wanted is not None and name not in wanted):
            continue
        value = None if raw == HIVE_NULL else urllib.parse.unquote(raw)
        table = table.append_column(name, pa.array([value] * table.num_rows, pa.string()))
    return table


class UnitReader:
    """Reads units one after another, keeping the last Parquet file open (the row groups of a
    file usually follow each other)."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        chunk_rows: int,
        columns: Sequence[str] | None = None,
        schema: Mapping[str, ColumnType] | None = None,
    ) -> None:
        self._fs = fs
        self._chunk_rows = chunk_rows
        self._columns = list(columns) if columns is not None else None
        self._schema = dict(schema or {})
        self._open: tuple[str, Any, pq.ParquetFile] | None = None

    def pieces(self, unit: Unit) -> Iterator[Piece]:
        """The unit's rows as pieces of at most ``chunk_rows`` rows, in order."""
        where = unit.file.path
        if unit.row_group is not None:
            where += f" (row group {unit.row_group})"
        try:
            if unit.file.format is InputFormat.PARQUET:
                yield from self._parquet(unit)
            else:
                yield from self._text(unit)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
            raise TableInputError(f"{where}: cannot read it: {exc}") from exc

    def store_answers(self, unit: Unit) -> bool:
        """Whether the filesystem still finds the unit's file: after a read failed with an
        OSError, True says the file's content is at fault (corrupt, truncated), False that
        the store itself is (down, unreachable)."""
        try:
            info = self._fs.get_file_info(unit.file.path)
        except OSError:
            return False
        return bool(info.type == pafs.FileType.File)

    def _parquet_file(self, path: str) -> pq.ParquetFile:
        if self._open is None or self._open[0] != path:
            self.close()
            handle = self._fs.open_input_file(path)
            self._open = (path, handle, pq.ParquetFile(handle))
        return self._open[2]

    def _parquet(self, unit: Unit) -> Iterator[Piece]:
        """A row group's pieces; of a whole file (its footer could not be read when planned),
        each row group's in turn, cut as the row groups' own units would be (the same keys)."""
        try:
            parquet = self._parquet_file(unit.file.path)
        except (pa.ArrowException, OSError) as exc:
            raise TableInputError(f"{unit.file.path}: cannot read it as Parquet: {exc}") from exc
        names = set(parquet.schema_arrow.names)
        columns = None if self._columns is None else [c for c in self._columns if c in names]
        first = unit.first_row
        groups = [unit.row_group] if unit.row_group is not None else range(parquet.num_row_groups)
        for group in groups:
            for batch in parquet.iter_batches(
                batch_size=self._chunk_rows, row_groups=[group], columns=columns
            ):
                table = _with_partitions(pa.Table.from_batches([batch]), unit, self._columns)
                yield Piece(unit, first, table)
                first += batch.num_rows

    def _text(self, unit: Unit) -> Iterator[Piece]:
        """The file cut in chunks of ``chunk_rows`` rows from row 0, as pieces: a chunk with
        bad lines is cut around them (its parts keep the chunk's keys), each bad line a piece
        of its own (:attr:`Piece.bad_line`) in its place."""
        size = self._chunk_rows
        with self._fs.open_input_stream(unit.file.path, compression="detect") as stream:
            if unit.file.format is InputFormat.CSV:
                items = csv_rows(stream, self._schema, BLOCK_BYTES)
            else:
                items = jsonl_rows(stream, self._schema, BLOCK_BYTES)
            held: list[pa.RecordBatch] = []
            first = row = 0  # the held rows' first, and the next row

            def flush() -> Piece:
                table = pa.Table.from_batches(held)
                if self._columns is not None:
                    table = table.select([c for c in self._columns if c in table.column_names])
                table = _with_partitions(table, unit, self._columns)
                held.clear()
                return Piece(unit, first, table, first - first % size)

            for item in items:
                if isinstance(item, BadLine):
                    if held:
                        yield flush()
                    text = pa.table({"line": pa.array([item.text], pa.string())})
                    yield Piece(unit, item.row, text, item.row - item.row % size, item)
                    first = row = item.row + 1
                    continue
                offset = 0
                while offset < item.num_rows:
                    take = min(size - row % size, item.num_rows - offset)
                    held.append(item.slice(offset, take))
                    offset += take
                    row += take
                    if row % size == 0:
                        yield flush()
                        first = row
            if held:
                yield flush()

    def close(self) -> None:
        if self._open is not None:
            self._open[1].close()
            self._open = None


__all__ = ["BLOCK_BYTES", "Piece", "UnitReader"]
