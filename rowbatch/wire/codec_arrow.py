"""The Arrow encoding (``application/vnd.apache.arrow.stream``): one Arrow IPC *stream* (schema
message, zero or more record batches, optional end-of-stream marker). See
``docs/wire-format.md`` for the type mapping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from rowbatch.wire.columns.arrow import (
    ArrowConverter,
    arrow_converter,
    arrow_to_column,
    column_to_arrow,
)
from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.errors import CorruptArrow

Compression = Literal["lz4", "zstd"]
_COMPRESSIONS: Final = ("lz4", "zstd")

_ARROW_ERRORS: Final = (pa.ArrowException, OSError, ValueError, TypeError, IndexError)


def encode_arrow(columns: Sequence[Column], compression: Compression | None = None) -> bytes:
    if compression is not None and compression not in _COMPRESSIONS:
        raise ValueError(f"compression must be one of {_COMPRESSIONS} or None, not {compression!r}")
    arrays = [column_to_arrow(col) for col in columns]
    batch = pa.RecordBatch.from_arrays(arrays, names=[col.name for col in columns])
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


@dataclass(frozen=True, eq=False)
class _KnownSchema:
    """A stream schema that decoded before: its pyarrow schema, field names and column types."""

    schema: pa.Schema
    names: tuple[str, ...]
    types: tuple[ColumnType, ...]
    converters: tuple[ArrowConverter, ...]


#: Schema messages (their exact bytes) of streams decoded before, for :func:`_decode_known`.
_KNOWN_SCHEMAS: Final[dict[bytes, _KnownSchema]] = {}
MAX_KNOWN_SCHEMAS: Final = 256


@dataclass(eq=False)
class Layout:
    """A stream seen before whose columns are all fixed-width numbers without nulls, read as
    zero-copy views: given the same bytes up to the record batch's body (schema, row counts,
    null counts, buffer offsets and lengths, no compression), every column lies at the same
    place in the body, and any body bytes are valid values."""

    names: tuple[str, ...]
    columns: tuple[tuple[ColumnType, np.dtype[Any], int, int, tuple[int, ...] | None], ...]
    """Per column: its type, the numpy dtype, its offset in the payload, its number of values
    and its shape (None: one dimension)."""
    size: int
    """The payload's whole length (body and end-of-stream marker included)."""
    trailer: bytes
    """What follows the body: the end-of-stream marker, or nothing."""
    types: Mapping[str, ColumnType]
    """Column name -> type (read-only; shared by every chunk of this layout)."""
    rows: int
    key: bytes = b""
    """The prefix that identifies it: the stream's bytes up to the record batch's body."""
    checked: bool = False
    """A chunk of this layout passed :func:`rowbatch.wire.chunks.decode.decode_chunk`'s checks
    of the columns (names, lengths): they hold for every chunk of it (the same schema and row
    counts), so its chunks may skip them (:func:`read_checked`)."""

    def arrays(self, payload: bytes) -> list[NDArray[Any]]:
        """The columns' values in ``payload`` (a stream of this layout), as read-only views."""
        out = []
        for _, dtype, offset, count, shape in self.columns:
            values = np.frombuffer(payload, dtype, count, offset)
            out.append(values if shape is None else values.reshape(shape))
        return out


#: Stream prefixes (schema message and record batch metadata, their exact bytes) of streams
#: decoded before whose columns are fixed-width views, for :func:`_decode_layout`.
_LAYOUTS: Final[dict[bytes, Layout]] = {}
MAX_LAYOUTS: Final = 1024
#: The layout :func:`find_layout` found last (none or one): a stream of one layout after
#: another is matched by a compare of its prefix, without parsing it or hashing a copy.
_RECENT: Final[list[Layout]] = []
_CONTINUATION: Final = b"\xff\xff\xff\xff"
_END_OF_STREAM: Final = _CONTINUATION + b"\x00\x00\x00\x00"


def _prefix(payload: bytes | bytearray | memoryview, buffer: pa.Buffer, size: int) -> bytes:
    """The first ``size`` bytes of the payload (``buffer`` is its pyarrow buffer)."""
    return payload[:size] if type(payload) is bytes else buffer.slice(0, size).to_pybytes()


def _schema_message_end(payload: bytes | bytearray | memoryview, buffer: pa.Buffer) -> int:
    """Where the first (schema) message of a stream with continuation markers ends, if it
    seems to: 8 bytes of prefix plus the metadata length; 0 when the prefix is not there."""
    if len(buffer) < 8:
        return 0
    head = _prefix(payload, buffer, 8)
    if head[:4] != _CONTINUATION:
        return 0
    length = int.from_bytes(head[4:8], "little", signed=True)
    return 8 + length if 0 < length <= len(buffer) - 8 else 0


def _body_start(payload: bytes, schema_end: int) -> int:
    """Where the body of the record batch message after the schema message (ending at
    ``schema_end``) starts; 0 when its prefix is not there."""
    head = payload[schema_end : schema_end + 8]
    if len(head) < 8 or head[:4] != _CONTINUATION:
        return 0
    length = int.from_bytes(head[4:8], "little", signed=True)
    start = schema_end + 8 + length
    return start if length > 0 and start <= len(payload) else 0


def find_layout(payload: bytes) -> Layout | None:
    """The layout ``payload`` has when everything up to its record batch's body is, byte for
    byte, that of a stream seen before whose columns were all fixed-width numbers without
    nulls (see :class:`Layout`), and it is as long; None for anything else."""
    if _RECENT:
        last = _RECENT[0]
        # The prefix holds the lengths of the messages it spans, so a payload that starts
        # with it has the same message boundaries: the same layout, as the lookup below finds.
        if (
            len(payload) == last.size
            and payload.startswith(last.key)
            and (not last.trailer or payload.endswith(last.trailer))
        ):
            return last
    if not _LAYOUTS or payload[:4] != _CONTINUATION:
        return None
    length = int.from_bytes(payload[4:8], "little", signed=True)
    end = 8 + length if 0 < length <= len(payload) - 8 else 0
    start = _body_start(payload, end) if end else 0
    layout = _LAYOUTS.get(payload[:start]) if start else None
    if layout is None or len(payload) != layout.size:
        return None
    if layout.trailer and not payload.endswith(layout.trailer):
        return None
    _RECENT[:] = (layout,)
    return layout


def read_checked(payload: bytes) -> tuple[dict[str, NDArray[Any]], Layout] | None:
    """The columns of ``payload`` by name, and its layout, when its layout is known and
    ``checked``; None otherwise (decode it with :func:`decode_arrow_laid_out`)."""
    layout = find_layout(payload)
    if layout is None or not layout.checked:
        return None
    return dict(zip(layout.names, layout.arrays(payload), strict=True)), layout


def _decode_layout(payload: bytes) -> tuple[list[str], list[Column], Layout] | None:
    layout = find_layout(payload)
    if layout is None:
        return None
    columns = [
        Column(name, ctype, values)
        for name, (ctype, *_), values in zip(
            layout.names, layout.columns, layout.arrays(payload), strict=True
        )
    ]
    return list(layout.names), columns, layout


def _learn_layout(
    payload: bytes,
    schema_end: int,
    names: tuple[str, ...],
    columns: list[Column],
    trailer: bytes,
) -> Layout | None:
    """Keep (and return) the layout of a stream just decoded against a known schema (one
    record batch, then ``trailer``) when every column is a zero-copy view of ``payload`` of
    fixed-width numbers, no nulls."""
    start = _body_start(payload, schema_end)
    if not start:
        return None
    base = np.frombuffer(payload, np.uint8).ctypes.data
    placed = []
    for col in columns:
        values = col.values
        if col.nulls is not None or values.dtype.kind not in "iuf":
            return None
        if not values.flags.c_contiguous or values.flags.writeable:
            return None
        offset = values.ctypes.data - base
        if offset < start or offset + values.nbytes > len(payload):
            return None
        shape = None if values.ndim == 1 else values.shape
        placed.append((col.type, values.dtype, offset, values.size, shape))
    if len(_LAYOUTS) >= MAX_LAYOUTS:
        _LAYOUTS.clear()
        _RECENT.clear()
    types = MappingProxyType({col.name: col.type for col in columns})
    rows = len(columns[0].values) if columns else 0
    key = payload[:start]
    layout = Layout(names, tuple(placed), len(payload), trailer, types, rows, key)
    _LAYOUTS[key] = layout
    return layout


def _decode_known(
    payload: bytes | bytearray | memoryview, buffer: pa.Buffer
) -> tuple[list[str], list[Column], Layout | None] | None:
    """The stream's names and columns when it is a schema seen before (the same bytes) followed
    by exactly one record batch and, optionally, the end-of-stream marker; None for anything
    else (the stream reader then decodes it and words any error). Skips the stream reader's
    set-up and the schema's parse: the batch is read against the known schema and validated
    in full, as the stream reader's batches are."""
    end = _schema_message_end(payload, buffer)
    # No schema message, or the schema alone (the stream reader decodes that as no rows).
    if not end or end >= len(buffer):
        return None
    known = _KNOWN_SCHEMAS.get(_prefix(payload, buffer, end))
    if known is None:
        return None
    source = pa.BufferReader(buffer)
    try:
        source.seek(end)
        message = pa.ipc.read_message(source)
        if message.type != "record batch":
            return None
        rest = len(buffer) - source.tell()
        if rest and (rest != len(_END_OF_STREAM) or source.read() != _END_OF_STREAM):
            return None
        batch = pa.ipc.read_record_batch(message, known.schema)
        batch.validate(full=True)
    except _ARROW_ERRORS:
        return None
    columns = [
        convert(name, batch.column(i))
        for i, (name, convert) in enumerate(zip(known.names, known.converters, strict=True))
    ]
    layout = None
    if type(payload) is bytes:
        trailer = _END_OF_STREAM if rest else b""
        layout = _learn_layout(payload, end, known.names, columns, trailer)
    return list(known.names), columns, layout


def _remember(
    payload: bytes | bytearray | memoryview,
    buffer: pa.Buffer,
    schema: pa.Schema,
    names: list[str],
    cols: list[Column],
) -> None:
    """Keeps the schema of a stream that decoded (one record batch, no dictionaries) for
    :func:`_decode_known`, keyed by its schema message's bytes."""
    if any(pa.types.is_dictionary(field.type) for field in schema):
        return
    end = _schema_message_end(payload, buffer)
    if not end:
        return
    source = pa.BufferReader(buffer)
    try:
        message = pa.ipc.read_message(source)
    except _ARROW_ERRORS:  # pragma: no cover - the stream reader read it
        return
    if message.type != "schema" or source.tell() != end:
        return
    if len(_KNOWN_SCHEMAS) >= MAX_KNOWN_SCHEMAS:
        _KNOWN_SCHEMAS.clear()
    types = tuple(c.type for c in cols)
    converters = tuple(
        arrow_converter(ctype, field.type) for ctype, field in zip(types, schema, strict=True)
    )
    _KNOWN_SCHEMAS[_prefix(payload, buffer, end)] = _KnownSchema(
        schema, tuple(names), types, converters
    )


def decode_arrow(payload: bytes | bytearray | memoryview) -> tuple[list[str], list[Column]]:
    """Returns the schema's field names (duplicates kept, for the caller to report) and the
    columns. Numeric columns are views into ``payload`` where Arrow allows it."""
    names, columns, _ = decode_arrow_laid_out(payload)
    return names, columns


def decode_arrow_laid_out(
    payload: bytes | bytearray | memoryview,
) -> tuple[list[str], list[Column], Layout | None]:
    """:func:`decode_arrow`, and the layout the payload was read by (None: by pyarrow)."""
    if type(payload) is bytes:
        laid_out = _decode_layout(payload)
        if laid_out is not None:
            return laid_out
    buffer = pa.py_buffer(payload)
    known = _decode_known(payload, buffer)
    if known is not None:
        return known
    names, columns = _decode_with_reader(payload, buffer)
    return names, columns, None


def _decode_with_reader(
    payload: bytes | bytearray | memoryview, buffer: pa.Buffer
) -> tuple[list[str], list[Column]]:
    """The stream reader's decode (any valid stream), and the schema remembered."""
    source = pa.BufferReader(buffer)
    try:
        reader = pa.ipc.open_stream(source)
        batches = list(reader)
        schema = reader.schema
        for batch in batches:
            batch.validate(full=True)
    except _ARROW_ERRORS as exc:
        raise CorruptArrow(
            f"payload is not a valid Arrow IPC stream ({len(buffer)} bytes): "
            f"{type(exc).__name__}: {exc}",
            expected="Arrow IPC stream",
            found=str(exc)[:200],
        ) from exc
    trailing = len(buffer) - source.tell()
    if trailing:
        raise CorruptArrow(
            f"{trailing} unexpected byte(s) after the end of the Arrow IPC stream "
            f"({len(buffer)} bytes in all)",
            expected="nothing after the end-of-stream marker",
            found=f"{trailing} trailing bytes",
        )
    try:
        names = list(schema.names)
    except UnicodeDecodeError as exc:
        raise CorruptArrow(
            f"a column name in the Arrow schema is not valid UTF-8: {exc}",
            expected="UTF-8 column names",
            found=str(exc)[:200],
        ) from exc
    if len(set(names)) != len(names):
        return names, []
    try:
        table = pa.Table.from_batches(batches, schema=schema)
    except _ARROW_ERRORS as exc:  # pragma: no cover - batches of one stream share its schema
        raise CorruptArrow(f"record batches do not fit the stream's schema: {exc}") from exc
    cols = [arrow_to_column(name, table.column(i)) for i, name in enumerate(names)]
    if len(batches) == 1:
        _remember(payload, buffer, schema, names, cols)
    return names, cols
