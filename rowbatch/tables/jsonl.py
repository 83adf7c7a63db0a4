"""Reading JSON Lines: one object per line; arrays of numbers are vectors; a bytes column holds
the text's UTF-8 bytes (JSON has no bytes)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.json as pjson

from rowbatch.tables.bad_lines import BadLine, Blocks, bisect, clip
from rowbatch.wire.columns.arrow import arrow_type_of
from rowbatch.wire.columns.column_type import ColumnType, Kind


def _json_schema(schema: Mapping[str, ColumnType]) -> pa.Schema:
    fields = []
    for name, ctype in schema.items():
        atype = pa.list_(pa.float32()) if ctype.kind is Kind.VECTOR else arrow_type_of(ctype)
        if ctype.kind is Kind.BYTES:
            atype = pa.string()  # JSON has no bytes: the text's UTF-8 bytes
        fields.append(pa.field(name, atype))
    return pa.schema(fields)


def jsonl_batches(
    stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterable[pa.RecordBatch]:
    """Record batches of the JSON Lines in ``stream``, parsed ``block_bytes`` at a time (a line
    must fit in one block); columns in ``schema`` are read as its types."""
    parse = pjson.ParseOptions(
        explicit_schema=_json_schema(schema) if schema else None,
        unexpected_field_behavior="infer",
    )
    return pjson.open_json(  # type: ignore[no-any-return]
        stream, read_options=pjson.ReadOptions(block_size=block_bytes), parse_options=parse
    )


def _cut(buf: bytes) -> int:
    return buf.rfind(b"\n") + 1


class _JsonRows:
    def __init__(self, stream: Any, schema: Mapping[str, ColumnType], block_bytes: int) -> None:
        self._blocks = Blocks(stream, block_bytes, _cut)
        self._declared = _json_schema(schema) if schema else None
        self._schema: pa.Schema | None = None
        """Every column's, once the first rows are read (later blocks are read as them; a
        field they lack makes a line bad, as it fails a streaming read)."""
        self._row = 0
        self._line = 1

    def _parse(self, data: bytes) -> pa.Table:
        if self._schema is None:
            parse = pjson.ParseOptions(
                explicit_schema=self._declared, unexpected_field_behavior="infer"
            )
        else:
            parse = pjson.ParseOptions(
                explicit_schema=self._schema, unexpected_field_behavior="error"
            )
        table = pjson.read_json(pa.BufferReader(data), parse_options=parse)
        if self._schema is None:
            self._schema = table.schema
        return table

    def run(self) -> Iterator[pa.RecordBatch | BadLine]:
        while (block := self._blocks.next()) is not None:
            try:
                table = self._parse(block)
            except pa.ArrowInvalid:
                yield from self._careful(block)
                continue
            yield from table.to_batches()
            self._row += table.num_rows
            self._line += block.count(b"\n")

    def _careful(self, data: bytes) -> Iterator[pa.RecordBatch | BadLine]:
        """A block that failed, line by line: a line that is not a JSON object, or whose
        values do not have their columns' types, is a :class:`BadLine`."""
        good: list[tuple[int, int, bytes]] = []  # (row, line index in the block, text)
        row = self._row
        for index, text in enumerate(data.split(b"\n")):
            if not text.strip():
                continue
            row += 1
            try:
                value = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                why = f"not valid JSON ({exc})"
            else:
                if isinstance(value, dict):
                    good.append((row - 1, index, text))
                    continue
                why = f"not a JSON object (a {type(value).__name__})"
            yield from self._convert(good)
            good = []
            yield self._bad(row - 1, index, text, why)
        yield from self._convert(good)
        self._row = row
        self._line += data.count(b"\n")

    def _convert(
        self, lines: Sequence[tuple[int, int, bytes]]
    ) -> Iterator[pa.RecordBatch | BadLine]:
        def parse(part: Sequence[tuple[int, int, bytes]]) -> pa.Table | None:
            try:
                table = self._parse(b"\n".join(text for _, _, text in part) + b"\n")
            except pa.ArrowInvalid:
                return None
            return table if table.num_rows == len(part) else None

        for out in bisect(lines, parse):
            if isinstance(out, pa.Table):
                yield from out.to_batches()
                continue
            row, index, text = out
            try:
                self._parse(text + b"\n")
                why = "cannot read it"
            except pa.ArrowInvalid as exc:
                why = " ".join(str(exc).split()).removeprefix("JSON parse error: ")
                why = why.removesuffix(" in row 0")
            yield self._bad(row, index, text, why)

    def _bad(self, row: int, index: int, text: bytes, why: str) -> BadLine:
        line = self._line + index
        return BadLine(row, line, clip(text), f"line {line}: {why}")


def jsonl_rows(
    stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterator[pa.RecordBatch | BadLine]:
    """Like :func:`jsonl_batches`, but a line that is no row (not a JSON object, a value of
    the wrong type) costs that line only: it is handed out, in its place among the batches,
    as a :class:`BadLine` (its data row index counted). The fields not in ``schema`` have the
    types of the first block's rows."""
    return _JsonRows(stream, schema, block_bytes).run()


__all__ = ["jsonl_batches", "jsonl_rows"]
