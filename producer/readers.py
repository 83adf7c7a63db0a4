"""Reading tables to publish: CSV, JSON Lines or Parquet, from a file or stdin, streamed in record
batches (never the whole file in memory, except Parquet from stdin), cut into chunks of exactly
N rows, and converted to the wire contract's column types with errors that name the file, the
column and the row.

- :func:`open_source` opens a file (``-`` = stdin) as a :class:`TableSource`;
- :func:`rechunk` cuts its record batches into tables of ``rows`` rows;
- :func:`wire_columns` converts one such table to the columns :func:`wire.chunks.split_rows`
  takes, applying the declared schema (``--schema``) or inferring the types;
- :func:`parse_schema` reads ``id:int64,text:string,features:vector[float32,16]``.

CSV: the first line is the header; empty cells and ``null``/``NULL`` are nulls in non-string
columns (a string column keeps ``""``); ``NaN``/``inf`` are float values. A vector cell is a JSON
array (``"[0.1, 0.2]"``). JSON Lines: one object per line; arrays of numbers are vectors.
Compressed files (``.gz``, ``.bz2``, ``.zst``, ``.lz4``) are read as such.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from wire.columns import ColumnType, Kind, arrow_type_of, column_type_of_arrow
from wire.errors import UnsupportedColumnType, WireError

STDIN: Final = "-"
_COMPRESSION_SUFFIXES: Final = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}
_CSV_NULLS: Final = ["", "null", "NULL"]
# Quoted values may span lines (text columns); Arrow then splits blocks more carefully.
_CSV_PARSE: Final = pcsv.ParseOptions(newlines_in_values=True)
_BLOCK_BYTES: Final = 8 << 20
_SCHEMA_ENTRY: Final = re.compile(r"\s*([^:,]+?)\s*:\s*(vector\s*\[[^\]]*\]|[^,]+?)\s*(?:,|$)")


class InputError(ValueError):
    """The input cannot be published as it is: the message says where and what to do."""


class InputFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"
    PARQUET = "parquet"


_SUFFIX_FORMATS: Final = {
    ".csv": InputFormat.CSV,
    ".jsonl": InputFormat.JSONL,
    ".ndjson": InputFormat.JSONL,
    ".json": InputFormat.JSONL,
    ".parquet": InputFormat.PARQUET,
    ".pq": InputFormat.PARQUET,
}


def infer_format(path: str) -> InputFormat:
    """The format from the file name (``data.csv``, ``rows.jsonl.gz``, ``t.parquet``)."""
    if path == STDIN:
        raise InputError("reading stdin: give the format with --format csv|jsonl|parquet")
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in _COMPRESSION_SUFFIXES:
        suffixes.pop()
    fmt = _SUFFIX_FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the format from the file name; give --format csv|jsonl|parquet"
        )
    return fmt


def parse_schema(text: str) -> dict[str, ColumnType]:
    """``name:type,...`` -> column types; types as in docs/wire-format.md section 4
    (``int64``, ``float32``, ``float64``, ``bool``, ``string``, ``bytes``,
    ``vector[float32,D]``)."""
    out: dict[str, ColumnType] = {}
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _SCHEMA_ENTRY.match(text, pos)
        if match is None or match.end() == pos:
            raise InputError(
                f"--schema: cannot read {text[pos:]!r}; expected name:type[,name:type...], "
                "e.g. id:int64,text:string,features:vector[float32,16]"
            )
        name, type_text = match[1], match[2]
        try:
            ctype = ColumnType.parse(type_text)
        except UnsupportedColumnType as exc:
            raise InputError(f"--schema: column {name!r}: {exc}") from None
        if name in out:
            raise InputError(f"--schema: column {name!r} is given twice")
        out[name] = ctype
        pos = match.end()
    if not out:
        raise InputError("--schema is empty")
    return out


class _CountingReader(io.RawIOBase):
    """Counts the bytes read through it (for the progress bar's fraction of a file)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        n = len(data)
        view[:n] = data
        self.count += n
        return n


@dataclass
class TableSource:
    """Record batches of one input, with what is known of its size for a progress bar."""

    name: str
    format: InputFormat
    batches: Iterator[pa.RecordBatch]
    total_rows: int | None = None
    """Known up front for Parquet."""
    total_bytes: int | None = None
    """The file's size (for CSV/JSON Lines files; ``fraction`` uses it)."""
    _counter: _CountingReader | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)
    rows_read: int = 0
    """Rows in the batches handed out so far."""
    exhausted: bool = False

    def __post_init__(self) -> None:
        self.batches = self._count(self.batches)

    def _count(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.rows_read += batch.num_rows
            yield batch
        self.exhausted = True

    def estimated_rows(self) -> float | None:
        """The input's row count: exact for Parquet and once the input is read to its end,
        else extrapolated from the bytes read so far (read-ahead included)."""
        if self.total_rows is not None:
            return float(self.total_rows)
        if self.exhausted:
            return float(self.rows_read)
        if self._counter is None or not self.total_bytes or not self.rows_read:
            return None
        read = self._counter.count
        return self.rows_read * self.total_bytes / read if read else None

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()

    def __enter__(self) -> TableSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_error(name: str, fmt: InputFormat, exc: BaseException) -> InputError:
    text = " ".join(str(exc).split())
    hint = ""
    if "conversion error" in text or "changed from" in text or "not convertible" in text:
        hint = (
            "; a column's values do not all have the type of its first rows: declare its type "
            "with --schema NAME:TYPE (e.g. NAME:string)"
        )
    elif "straddling" in text or "block" in text.lower():
        hint = f"; a JSON line may be longer than the read block ({_BLOCK_BYTES >> 20} MiB)"
    return InputError(f"{name}: cannot read it as {fmt.value}: {text}{hint}")


def _guarded(
    name: str, fmt: InputFormat, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise _read_error(name, fmt, exc) from exc


def _csv_types(schema: Mapping[str, ColumnType]) -> dict[str, pa.DataType]:
    return {
        name: pa.string() if ctype.kind is Kind.VECTOR else arrow_type_of(ctype)
        for name, ctype in schema.items()
    }


def _json_schema(schema: Mapping[str, ColumnType]) -> pa.Schema:
    fields = []
    for name, ctype in schema.items():
        atype = pa.list_(pa.float32()) if ctype.kind is Kind.VECTOR else arrow_type_of(ctype)
        if ctype.kind is Kind.BYTES:
            atype = pa.string()  # JSON has no bytes: the text's UTF-8 bytes
        fields.append(pa.field(name, atype))
    return pa.schema(fields)


def open_source(
    path: str,
    fmt: InputFormat | None = None,
    *,
    schema: Mapping[str, ColumnType] | None = None,
    batch_rows: int = 65_536,
    stdin: IO[bytes] | None = None,
    block_bytes: int = _BLOCK_BYTES,
) -> TableSource:
    """Opens ``path`` (``-``: ``stdin``, default ``sys.stdin.buffer``) for streaming; CSV and
    JSON Lines are parsed ``block_bytes`` at a time (a JSON line must fit in one block)."""
    fmt = fmt or infer_format(path)
    name = "<stdin>" if path == STDIN else path
    if path == STDIN and stdin is None:
        stdin = sys.stdin.buffer
    try:
        if fmt is InputFormat.PARQUET:
            # Parquet needs random access: stdin is read into memory first.
            parquet = pq.ParquetFile(pa.BufferReader(stdin.read()) if stdin else path)
            batches = parquet.iter_batches(batch_size=batch_rows)
            return TableSource(
                name, fmt, _guarded(name, fmt, batches), total_rows=parquet.metadata.num_rows
            )
    except FileNotFoundError as exc:
        raise InputError(f"{path}: cannot open it: {exc.strerror or exc}") from exc
    except (pa.ArrowException, OSError) as exc:
        raise _read_error(name, fmt, exc) from exc
    closers: list[Callable[[], None]] = []
    total_bytes = None
    if stdin is not None:
        raw: IO[bytes] = stdin
    else:
        try:
            raw = Path(path).open("rb")  # noqa: SIM115 - closed by TableSource.close
            total_bytes = Path(path).stat().st_size
        except OSError as exc:
            raise InputError(f"{path}: cannot open it: {exc.strerror or exc}") from exc
        closers.append(raw.close)
    counter = _CountingReader(raw)
    stream: Any = pa.PythonFile(counter, mode="r")
    suffix = Path(path).suffix.lower() if path != STDIN else ""
    if suffix in _COMPRESSION_SUFFIXES:
        stream = pa.CompressedInputStream(stream, _COMPRESSION_SUFFIXES[suffix])
    try:
        batches = _open_text(fmt, stream, schema or {}, block_bytes)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        for close in closers:
            close()
        raise _read_error(name, fmt, exc) from exc
    return TableSource(
        name,
        fmt,
        _guarded(name, fmt, batches),
        total_bytes=total_bytes,
        _counter=counter,
        _closers=closers,
    )


def _open_text(
    fmt: InputFormat, stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterable[pa.RecordBatch]:
    if fmt is InputFormat.CSV:
        return pcsv.open_csv(  # type: ignore[no-any-return]
            stream,
            read_options=pcsv.ReadOptions(block_size=block_bytes),
            parse_options=_CSV_PARSE,
            convert_options=pcsv.ConvertOptions(
                column_types=_csv_types(schema), null_values=_CSV_NULLS
            ),
        )
    parse = pjson.ParseOptions(
        explicit_schema=_json_schema(schema) if schema else None,
        unexpected_field_behavior="infer",
    )
    return pjson.open_json(  # type: ignore[no-any-return]
        stream, read_options=pjson.ReadOptions(block_size=block_bytes), parse_options=parse
    )


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


# --- conversion to wire columns ---------------------------------------------------------------


def _first_failing_row(arr: pa.Array, convert: Callable[[pa.Array], object]) -> int | None:
    """The first row whose conversion fails: the shortest failing prefix, by bisection."""

    def fails(length: int) -> bool:
        try:
            convert(arr.slice(0, length))
        except (pa.ArrowException, ValueError, TypeError):
            return True
        return False

    lo, hi = 0, len(arr)  # arr[:lo] converts, arr[:hi] does not
    if not fails(hi):
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(mid):
            hi = mid
        else:
            lo = mid
    return hi - 1


def _where(source: str, column: str, first_row: int, row: int | None) -> str:
    if row is None:
        return f"{source}: column {column!r}"
    return f"{source}: column {column!r}, data row {first_row + row + 1}"


def _vector_row(row: object, dim: int) -> np.ndarray[Any, np.dtype[np.float32]]:
    if not isinstance(row, list) or len(row) != dim:
        raise ValueError(f"expected a JSON array of {dim} numbers")
    if any(isinstance(v, bool) or not isinstance(v, int | float) for v in row):
        raise TypeError("a vector holds numbers only")
    return np.asarray(row, dtype=np.float32)


def _is_list(atype: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(atype)
        or pa.types.is_large_list(atype)
        or pa.types.is_fixed_size_list(atype)
    )


def _is_text(atype: pa.DataType) -> bool:
    return bool(pa.types.is_string(atype) or pa.types.is_large_string(atype))


# Arrow scalars made once: converting Python literals on every call costs import attempts.
_EMPTY: Final = pa.scalar("")
_TRUE: Final = pa.scalar(True)
_JSON_NULL: Final = pa.scalar("null")
_LINE_OPEN: Final = pa.scalar('{"v":')
_LINE_CLOSE: Final = pa.scalar("}\n")
_VECTOR_LINES: Final = pjson.ParseOptions(
    explicit_schema=pa.schema([("v", pa.list_(pa.float32()))]), unexpected_field_behavior="error"
)


def _parse_vectors_fast(arr: pa.Array) -> pa.Array | None:
    """Text cells holding JSON arrays -> list<float32>, parsed by Arrow's JSON reader (one
    ``{"v": <cell>}`` line per cell); None when that fails, for the careful path to explain."""
    if pa.types.is_large_string(arr.type):
        arr = pc.cast(arr, pa.string())
    blank = pc.fill_null(pc.equal(pc.utf8_trim_whitespace(arr), _EMPTY), _TRUE)
    cells = pc.if_else(blank, _JSON_NULL, arr)
    lines = pc.binary_join_element_wise(_LINE_OPEN, cells, _LINE_CLOSE, _EMPTY)
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32)
    start, stop = int(offsets[lines.offset]), int(offsets[lines.offset + len(lines)])
    data = lines.buffers()[2][start:stop] if stop > start else pa.py_buffer(b"")
    try:
        table = pjson.read_json(
            pa.BufferReader(data),
            read_options=pjson.ReadOptions(use_threads=False, block_size=max(len(data) + 1, 1024)),
            parse_options=_VECTOR_LINES,
        )
    except (pa.ArrowException, ValueError):
        return None
    if table.num_rows != len(arr):
        return None
    return table.column("v").combine_chunks()


def _parse_vectors(
    arr: pa.Array, dim: int, *, source: str, column: str, first_row: int
) -> pa.Array:
    """Text cells holding JSON arrays (``[0.1, 0.2]``) -> fixed-size float32 vectors."""
    parsed = _parse_vectors_fast(arr)
    if parsed is not None:
        return _list_to_vector(parsed, dim, source=source, column=column, first_row=first_row)
    n = len(arr)
    values = np.zeros((n, dim), dtype=np.float32)
    nulls = np.zeros(n, dtype=np.bool_)
    for i, text in enumerate(arr.to_pylist()):
        if text is None or not str(text).strip():
            nulls[i] = True
            continue
        try:
            row = json.loads(text)
            values[i] = _vector_row(row, dim)
        except (ValueError, TypeError) as exc:
            raise InputError(
                f"{_where(source, column, first_row, i)}: {str(text)[:80]!r} is not a vector "
                f"of {dim} numbers ({exc})"
            ) from None
    flat = pa.array(values.reshape(-1), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(
        flat, type=arrow_type_of(ColumnType.vector(dim)), mask=pa.array(nulls)
    )


def _list_to_vector(
    arr: pa.Array, dim: int, *, source: str, column: str, first_row: int
) -> pa.Array:
    target = arrow_type_of(ColumnType.vector(dim))
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
    bad = np.flatnonzero(valid & (lengths != dim))
    if bad.size:
        row = int(bad[0])
        raise InputError(
            f"{_where(source, column, first_row, row)}: a vector of {int(lengths[row])} "
            f"numbers where {dim} were expected (all rows of a vector column have one length)"
        )
    try:
        return pc.cast(arr, target)
    except (pa.ArrowException, ValueError) as exc:
        raise InputError(
            f"{_where(source, column, first_row, None)}: cannot convert to "
            f"vector[float32,{dim}]: {exc}"
        ) from exc


def _infer(
    arr: pa.Array, *, source: str, column: str, first_row: int
) -> tuple[pa.Array, ColumnType]:
    atype = arr.type
    if pa.types.is_null(atype):
        raise InputError(
            f"{_where(source, column, first_row, None)}: every value in data rows "
            f"{first_row + 1}..{first_row + len(arr)} is empty, so its type cannot be inferred; "
            f"declare it with --schema {column}:TYPE"
        )
    if pa.types.is_float16(atype):
        return pc.cast(arr, pa.float32()), ColumnType(Kind.FLOAT32)
    if (
        pa.types.is_list(atype)
        or pa.types.is_large_list(atype)
        or pa.types.is_fixed_size_list(atype)
    ) and (pa.types.is_integer(atype.value_type) or pa.types.is_floating(atype.value_type)):
        lengths = pc.list_value_length(arr).drop_null()
        if len(lengths) == 0:
            raise InputError(
                f"{_where(source, column, first_row, None)}: only null vectors in data rows "
                f"{first_row + 1}..{first_row + len(arr)}: declare it with --schema "
                f"{column}:vector[float32,DIM]"
            )
        dim = int(lengths[0].as_py())
        if dim < 1:
            raise InputError(f"{_where(source, column, first_row, None)}: an empty vector")
        ctype = ColumnType.vector(dim)
        return _list_to_vector(arr, dim, source=source, column=column, first_row=first_row), ctype
    try:
        return arr, column_type_of_arrow(column, atype)
    except UnsupportedColumnType:
        raise InputError(
            f"{_where(source, column, first_row, None)}: its type {atype} (as read from the "
            "input) is not a rowbatch column type (int64, float32, float64, bool, string, "
            "bytes, vector[float32,D]); declare it with --schema, e.g. "
            f"--schema {column}:string, or convert it before publishing"
        ) from None


def _convert(
    arr: pa.Array, ctype: ColumnType, *, source: str, column: str, first_row: int
) -> pa.Array:
    atype = arr.type
    if pa.types.is_dictionary(atype):
        arr = arr.dictionary_decode()
        atype = arr.type
    if ctype.kind is Kind.VECTOR:
        dim = ctype.dim or 0
        if _is_text(atype):
            return _parse_vectors(arr, dim, source=source, column=column, first_row=first_row)
        if _is_list(atype):
            return _list_to_vector(arr, dim, source=source, column=column, first_row=first_row)
    elif ctype.kind is Kind.BYTES and _is_text(atype):
        return pc.cast(arr, pa.binary())
    target = arrow_type_of(ctype)
    if atype == target:
        return arr
    try:
        return pc.cast(arr, target)
    except (pa.ArrowException, ValueError) as exc:
        row = _first_failing_row(arr, lambda a: pc.cast(a, target))
        value = "" if row is None else f": {arr[row].as_py()!r:.80}"
        raise InputError(
            f"{_where(source, column, first_row, row)}: cannot convert {atype} to {ctype}"
            f"{value} ({' '.join(str(exc).split())})"
        ) from exc


def wire_columns(
    table: pa.Table,
    schema: Mapping[str, ColumnType] | None = None,
    *,
    source: str = "input",
    first_row: int = 0,
) -> tuple[dict[str, pa.Array], dict[str, ColumnType]]:
    """The columns of ``table`` as Arrow arrays of the wire types, and those types.

    Columns named in ``schema`` are converted to its type (an error names the row that does not
    convert); others get the type their values have, if the wire format has one. ``first_row``
    is the table's position in the input (for messages)."""
    declared = schema or {}
    missing = [name for name in declared if name not in table.column_names]
    if missing:
        raise InputError(
            f"{source}: --schema names column(s) {missing} that the input lacks "
            f"(it has {table.column_names})"
        )
    columns: dict[str, pa.Array] = {}
    types: dict[str, ColumnType] = {}
    for name, chunked in zip(table.column_names, table.columns, strict=True):
        if name in columns:
            raise InputError(f"{source}: column {name!r} appears more than once")
        arr = chunked.combine_chunks() if chunked.num_chunks != 1 else chunked.chunk(0)
        if name in declared:
            ctype = declared[name]
            arr = _convert(arr, ctype, source=source, column=name, first_row=first_row)
        else:
            arr, ctype = _infer(arr, source=source, column=name, first_row=first_row)
        columns[name] = arr
        types[name] = ctype
    return columns, types


def describe_wire_error(exc: WireError, *, source: str, first_row: int) -> str:
    """A wire error raised for one chunk of the input, with the input's name and row offset."""
    return f"{source} (data rows from {first_row + 1}): {exc}"


__all__ = [
    "STDIN",
    "InputError",
    "InputFormat",
    "TableSource",
    "describe_wire_error",
    "infer_format",
    "open_source",
    "parse_schema",
    "rechunk",
    "wire_columns",
]
