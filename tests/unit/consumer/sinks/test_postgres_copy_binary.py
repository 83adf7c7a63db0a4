"""The PostgreSQL sink's binary COPY encoding, read back by a small parser of the format
(no server): every value, null and vector arrives as written."""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, SinkError, TableSpec, table_columns
from rowbatch.consumer.sinks.postgres import copy_binary
from tests.sink_data import check_snapshot, make_rows, spec

_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def _array(data: bytes) -> list[float]:
    ndim, _, oid, dim, _ = struct.unpack(">5i", data[:20])
    assert (ndim, oid) == (1, 700)
    out, at = [], 20
    for _ in range(dim):
        (size,) = struct.unpack(">i", data[at : at + 4])
        out.append(struct.unpack(">f", data[at + 4 : at + 4 + size])[0])
        at += 4 + size
    return out


_DECODE: dict[str, Any] = {
    "chunk_id": bytes.decode,
    "row_index": lambda b: struct.unpack(">q", b)[0],
    "source_message_id": bytes.decode,
    "doc_id": lambda b: struct.unpack(">q", b)[0],
    "title": bytes.decode,
    "embedding": _array,
    "score": lambda b: struct.unpack(">f", b)[0],
    "model_name": bytes.decode,
    "model_version": bytes.decode,
    "processed_at": lambda b: _EPOCH + timedelta(microseconds=struct.unpack(">q", b)[0]),
}


def read_copy(data: bytes) -> dict[str, list[Any]]:
    names = list(_DECODE)
    snap: dict[str, list[Any]] = {name: [] for name in names}
    at = 0
    while at < len(data):
        (fields,) = struct.unpack(">h", data[at : at + 2])
        assert fields == len(names)
        at += 2
        for name in names:
            (size,) = struct.unpack(">i", data[at : at + 4])
            at += 4
            if size < 0:
                snap[name].append(None)
                continue
            snap[name].append(_DECODE[name](data[at : at + size]))
            at += size
    return snap


def columns() -> tuple[Any, ...]:
    pg: Any = copy_binary
    table = table_columns(spec())
    return tuple(pg.PgColumn(c.name, pg.pg_type(c), pg.column_encoder(c), c) for c in table)


@pytest.mark.parametrize("rows", [1, 7, 1200])
def test_copy_tuples_read_back(rows: int) -> None:
    g = np.arange(3000, 3000 + rows)
    data = make_rows(g, garbage_under_nulls=True)
    encoded = b"".join(
        copy_binary.encode_tuples(columns(), data, slice(lo, min(lo + 500, rows)))
        for lo in range(0, rows, 500)
    )
    check_snapshot(read_copy(encoded), g)


def test_keys_that_are_not_text_are_refused() -> None:
    data = make_rows(np.arange(3))
    bad = ResultRows(
        **{
            **{f: getattr(data, f) for f in data.__dataclass_fields__},
            "chunk_id": np.array(["a", 5, "b"], dtype=object),
        }
    )
    with pytest.raises(SinkError, match="column 'chunk_id' row 1: expected str, found int"):
        copy_binary.encode_tuples(columns(), bad, slice(0, 3))


def test_bytea_cells_are_the_raw_bytes_and_nulls_are_null() -> None:
    table = TableSpec("t", (ColumnSpec("raw", "bytes"),), ())
    (col,) = table_columns(table)
    pg: Any = copy_binary
    assert pg.pg_type(col) == "bytea"
    values = [b"\x00\xff\x00", b"", b"garbage under a null", bytes(range(256)), b"\\x41"]
    rows = ResultRows(
        chunk_id=np.array(["c"] * 5, dtype=object),
        row_index=np.arange(5, dtype=np.int64),
        source_message_id=np.array(["m"] * 5, dtype=object),
        passthrough={"raw": np.array(values, dtype=object)},
        outputs={},
        nulls={"raw": np.array([False, False, True, False, False])},
        model_name="m",
        model_version="1",
        processed_at=datetime(2024, 1, 1, tzinfo=UTC),
    )
    encoded = copy_binary.encode_tuples(
        (pg.PgColumn(col.name, "bytea", pg.column_encoder(col), col),), rows, slice(0, 5)
    )
    fields = []
    at = 0
    while at < len(encoded):
        (count,) = struct.unpack(">h", encoded[at : at + 2])
        assert count == 7
        at += 2
        row = []
        for _ in range(count):
            (size,) = struct.unpack(">i", encoded[at : at + 4])
            at += 4
            row.append(None if size < 0 else encoded[at : at + size])
            at += max(size, 0)
        fields.append(row[3])  # chunk_id, row_index, source_message_id, raw, ...
    assert fields == [b"\x00\xff\x00", b"", None, bytes(range(256)), b"\\x41"]


def test_bytea_cells_refuse_text() -> None:
    table = TableSpec("t", (ColumnSpec("raw", "bytes"),), ())
    (col,) = table_columns(table)
    data = make_rows(np.arange(2))
    rows = ResultRows(
        **{
            **{f: getattr(data, f) for f in data.__dataclass_fields__},
            "passthrough": {"raw": np.array([b"x", "text"], dtype=object)},
            "nulls": {},
        }
    )
    with pytest.raises(SinkError, match="column 'raw' row 1: expected bytes, found str"):
        copy_binary.column_encoder(col)(rows, slice(0, 2))
