"""The Arrow encoding (``application/vnd.apache.arrow.stream``): one Arrow IPC *stream* (schema
message, zero or more record batches, optional end-of-stream marker). See
``docs/wire-format.md`` for the type mapping."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import pyarrow as pa

from producer.columns import Column, arrow_to_column, column_to_arrow
from producer.errors import CorruptArrow

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


def decode_arrow(payload: bytes | bytearray | memoryview) -> tuple[list[str], list[Column]]:
    """Returns the schema's field names (duplicates kept, for the caller to report) and the
    columns. Numeric columns are views into ``payload`` where Arrow allows it."""
    buffer = pa.py_buffer(payload)
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
    names = list(schema.names)
    if len(set(names)) != len(names):
        return names, []
    try:
        table = pa.Table.from_batches(batches, schema=schema)
    except _ARROW_ERRORS as exc:  # pragma: no cover - batches of one stream share its schema
        raise CorruptArrow(f"record batches do not fit the stream's schema: {exc}") from exc
    return names, [arrow_to_column(name, table.column(i)) for i, name in enumerate(names)]
