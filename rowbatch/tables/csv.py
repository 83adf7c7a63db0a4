"""Reading CSV: the first line is the header; empty cells and ``null``/``NULL`` are nulls in
non-string columns (a string column keeps ``""``); ``NaN``/``inf`` are float values; a vector
cell is a JSON array (``"[0.1, 0.2]"``), read as text here and parsed on conversion."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.csv as pcsv

from rowbatch.tables.bad_lines import BadLine, Blocks, bisect, clip, count_lines
from rowbatch.wire.columns.arrow import arrow_type_of
from rowbatch.wire.columns.column_type import ColumnType, Kind

_CSV_NULLS: Final = ["", "null", "NULL"]
# Quoted values may span lines (text columns); Arrow then splits blocks more carefully.
_CSV_PARSE: Final = pcsv.ParseOptions(newlines_in_values=True)


def _csv_types(schema: Mapping[str, ColumnType]) -> dict[str, pa.DataType]:
    return {
        name: pa.string() if ctype.kind is Kind.VECTOR else arrow_type_of(ctype)
        for name, ctype in schema.items()
    }


def csv_batches(
    stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterable[pa.RecordBatch]:
    """Record batches of the CSV in ``stream``, parsed ``block_bytes`` at a time; columns in
    ``schema`` are read as its types."""
    return pcsv.open_csv(  # type: ignore[no-any-return]
        stream,
        read_options=pcsv.ReadOptions(block_size=block_bytes),
        parse_options=_CSV_PARSE,
        convert_options=pcsv.ConvertOptions(
            column_types=_csv_types(schema), null_values=_CSV_NULLS
        ),
    )


def _cut(buf: bytes) -> int:
    """The index after the last line break of ``buf`` outside a quoted value (an even count
    of quotes before it), 0 if none."""
    end = len(buf)
    after = 0  # quotes from the candidate line break to the end
    total = buf.count(b'"')
    while True:
        nl = buf.rfind(b"\n", 0, end)
        if nl < 0:
            return 0
        after += buf.count(b'"', nl, end)
        if (total - after) % 2 == 0:
            return nl + 1
        end = nl


@dataclass(frozen=True)
class _Record:
    """One record of a block read line by line: its fields and raw bytes."""

    fields: list[str]
    raw: bytes
    row: int
    line: int


class _CsvRows:
    def __init__(self, stream: Any, schema: Mapping[str, ColumnType], block_bytes: int) -> None:
        self._blocks = Blocks(stream, block_bytes, _cut)
        self._declared = _csv_types(schema)
        self._names: list[str] = []
        self._types: dict[str, pa.DataType] | None = None
        """Every column's, once the first rows are read (later blocks are read as them)."""
        self._row = 0
        self._line = 1

    def _parse(self, data: bytes, types: Mapping[str, pa.DataType]) -> pa.Table:
        return pcsv.read_csv(
            pa.BufferReader(data),
            read_options=pcsv.ReadOptions(column_names=self._names, block_size=1 << 20),
            parse_options=_CSV_PARSE,
            convert_options=pcsv.ConvertOptions(column_types=types, null_values=_CSV_NULLS),
        )

    def run(self) -> Iterator[pa.RecordBatch | BadLine]:
        first = self._blocks.next()
        if first is None or not self._header(first):
            raise pa.ArrowInvalid("Empty CSV file")
        while (block := self._blocks.next()) is not None:
            yield from self._block(block)

    def _header(self, block: bytes) -> bool:
        """Takes the header's names from the first record of ``block``; gives the rest back."""
        start = 3 if block.startswith(b"\xef\xbb\xbf") else 0
        lines = block[start:].splitlines(keepends=True)
        reader = csv.reader(line.decode("utf-8", errors="replace") for line in lines)
        for fields in reader:
            if fields:
                self._names = fields
                taken = reader.line_num
                self._line += taken
                self._blocks.unread(b"".join(lines[taken:]))
                return True
        return False

    def _block(self, data: bytes) -> Iterator[pa.RecordBatch | BadLine]:
        try:  # the fast path: the whole block (a line with other than one field a column fails)
            table = self._parse(data, self._types or self._declared)
        except pa.ArrowInvalid:
            yield from self._careful(data)
            return
        if self._types is None:
            self._types = {f.name: f.type for f in table.schema}
        yield from table.to_batches()
        self._row += table.num_rows
        self._line += count_lines(data)

    def _careful(self, data: bytes) -> Iterator[pa.RecordBatch | BadLine]:
        """A block that failed, line by line: each record with the wrong number of fields or
        a value that does not convert is a :class:`BadLine`."""
        lines = data.splitlines(keepends=True)
        reader = csv.reader(line.decode("utf-8", errors="surrogateescape") for line in lines)
        records: list[_Record] = []
        done = 0
        for fields in reader:
            if fields:
                raw = b"".join(lines[done : reader.line_num])
                records.append(_Record(fields, raw, self._row + len(records), self._line + done))
            done = reader.line_num
        if records and not self._blocks.at_end:
            # The last record may be cut short (a quoted line break the cut took for the
            # end): it begins the next block.
            done = records.pop().line - self._line
            self._blocks.unread(b"".join(lines[done:]))
        good: list[_Record] = []
        for record in records:
            if len(record.fields) != len(self._names):
                yield from self._convert(good)
                good = []
                yield self._bad(
                    record,
                    f"expected {len(self._names)} fields, found {len(record.fields)}",
                )
            else:
                good.append(record)
        yield from self._convert(good)
        self._row += len(records)
        self._line += done

    def _convert(self, records: Sequence[_Record]) -> Iterator[pa.RecordBatch | BadLine]:
        if not records:
            return
        if self._types is None:  # the first rows: the other columns' types from all of them
            text = {name: pa.string() for name in self._declared}
            try:
                inferred = self._parse(self._joined(records), text).schema
            except pa.ArrowInvalid:
                inferred = pa.schema([(name, pa.string()) for name in self._names])
            self._types = {f.name: self._declared.get(f.name, f.type) for f in inferred}

        def parse(part: Sequence[_Record]) -> pa.Table | None:
            assert self._types is not None
            try:
                table = self._parse(self._joined(part), self._types)
            except pa.ArrowInvalid:
                return None
            return table if table.num_rows == len(part) else None

        for out in bisect(records, parse):
            if isinstance(out, _Record):
                yield self._bad(out, self._why(out))
            else:
                yield from out.to_batches()

    @staticmethod
    def _joined(records: Sequence[_Record]) -> bytes:
        return b"".join(r.raw if r.raw.endswith((b"\n", b"\r")) else r.raw + b"\n" for r in records)

    def _why(self, record: _Record) -> str:
        """Why a record with the right number of fields does not convert: its first value
        that does not."""
        assert self._types is not None
        for name, value in zip(self._names, record.fields, strict=True):
            atype = self._types.get(name, pa.string())
            if value in _CSV_NULLS and not pa.types.is_string(atype):
                continue
            try:
                value.encode("utf-8")
                pa.array([value], pa.string()).cast(atype)
            except (pa.ArrowException, UnicodeEncodeError):
                shown = value if len(value) <= 40 else value[:37] + "..."
                return f"column {name!r}: cannot convert {shown!r} to {atype}"
        return "cannot read it"

    @staticmethod
    def _bad(record: _Record, why: str) -> BadLine:
        sep = ", " if why.startswith("column") else ": "
        return BadLine(record.row, record.line, clip(record.raw), f"line {record.line}{sep}{why}")


def csv_rows(
    stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterator[pa.RecordBatch | BadLine]:
    """Like :func:`csv_batches`, but a line that is no row (too many or too few fields, a
    value that does not convert to its column's type) costs that line only: it is handed out,
    in its place among the batches, as a :class:`BadLine` (its data row index counted). The
    columns not in ``schema`` have the types of the first block's rows."""
    return _CsvRows(stream, schema, block_bytes).run()


__all__ = ["csv_batches", "csv_rows"]
