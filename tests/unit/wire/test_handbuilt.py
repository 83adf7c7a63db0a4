"""Messages built the way docs/wire-format.md tells other languages to build them, with only
json / base64 / pyarrow (no rowbatch code), decode with rowbatch."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pyarrow as pa

from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.columns.column_type import BOOL, BYTES, FLOAT64, INT64, STRING, ColumnType


def test_documented_json_example_decodes() -> None:
    attributes = {
        "rowbatch-format-version": "1",
        "content-type": "application/json",
        "rowbatch-chunk-id": "orders-db:18446",
        "rowbatch-table": "orders",
        "rowbatch-row-count": "3",
        "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
    }
    thumbnail = b"\x89PNG\r\n\x1a\n"
    doc = {
        "columns": [
            {"name": "id", "type": "int64", "values": [1, 2, None]},
            {"name": "price", "type": "float64", "values": [9.5, "NaN", 0]},
            {"name": "in_stock", "type": "bool", "values": [True, False, None]},
            {"name": "title", "type": "string", "values": ["Tea", "", None]},
            {
                "name": "thumbnail",
                "type": "bytes",
                "values": [base64.b64encode(thumbnail).decode("ascii"), "", None],
            },
            {
                "name": "embedding",
                "type": "vector",
                "dim": 3,
                "values": [[0.1, 0.2, 0.3], None, [1, 0, -1]],
            },
        ]
    }
    payload = json.dumps(doc).encode("utf-8")

    chunk = decode_chunk(payload, attributes)

    assert chunk.row_count == 3
    assert chunk.headers.chunk_id == "orders-db:18446"
    assert chunk.headers.table == "orders"
    assert dict(chunk.types) == {
        "id": INT64,
        "price": FLOAT64,
        "in_stock": BOOL,
        "title": STRING,
        "thumbnail": BYTES,
        "embedding": ColumnType.vector(3),
    }
    assert chunk.columns["id"].dtype == np.int64
    assert chunk.columns["id"].tolist() == [1, 2, 0]
    assert chunk.null_masks["id"].tolist() == [False, False, True]
    price = chunk.columns["price"]
    assert price[0] == 9.5
    assert math.isnan(price[1])
    assert price[2] == 0.0
    assert "price" not in chunk.null_masks  # NaN is a value, not a null
    assert chunk.columns["in_stock"].tolist() == [True, False, False]
    assert chunk.columns["title"].tolist() == ["Tea", "", None]
    assert chunk.columns["thumbnail"].tolist() == [thumbnail, b"", None]
    emb = chunk.columns["embedding"]
    assert emb.dtype == np.float32
    assert emb.shape == (3, 3)
    np.testing.assert_array_equal(
        emb, np.array([[0.1, 0.2, 0.3], [0, 0, 0], [1, 0, -1]], np.float32)
    )
    assert chunk.null_masks["embedding"].tolist() == [False, True, False]


def test_documented_section_9_example() -> None:
    attributes = {
        "rowbatch-format-version": "1",
        "content-type": "application/json",
        "rowbatch-chunk-id": "orders-db:18446",
        "rowbatch-table": "orders",
        "rowbatch-row-count": "2",
        "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
    }
    payload = (
        b'{"columns":[{"name":"order_id","type":"int64","values":[18446001,18446002]},\n'
        b'{"name":"text","type":"string","values":["two teas","one coffee"]}]}'
    )
    chunk = decode_chunk(payload, attributes)
    assert chunk.columns["order_id"].tolist() == [18446001, 18446002]
    assert chunk.columns["text"].tolist() == ["two teas", "one coffee"]


def test_documented_arrow_example_decodes() -> None:
    # As in docs/wire-format.md section 5.2, plus one column of each other type.
    batch = pa.record_batch(
        [
            pa.array([1, 2], pa.int64()),
            pa.FixedSizeListArray.from_arrays(pa.array([0.1, 0.2, 0.3, 0.4], pa.float32()), 2),
            pa.array([0.5, None], pa.float32()),
            pa.array([1.5, float("inf")], pa.float64()),
            pa.array([True, None], pa.bool_()),
            pa.array(["é", None], pa.string()),
            pa.array([b"\x00", b""], pa.binary()),
        ],
        names=["id", "embedding", "score", "weight", "flag", "text", "blob"],
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue().to_pybytes()
    attributes = {
        "rowbatch-format-version": "1",
        "content-type": "application/vnd.apache.arrow.stream",
        "rowbatch-chunk-id": "0b6f1c2e-4b9f-4d5e-9a59-2f1d8c3e7a10",
        "rowbatch-table": "orders",
        "rowbatch-row-count": "2",
        "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
    }

    chunk = decode_chunk(payload, attributes)

    assert chunk.columns["id"].tolist() == [1, 2]
    emb = chunk.columns["embedding"]
    assert emb.dtype == np.float32
    assert emb.shape == (2, 2)
    np.testing.assert_array_equal(emb, np.array([[0.1, 0.2], [0.3, 0.4]], np.float32))
    assert chunk.columns["score"].dtype == np.float32
    assert chunk.columns["score"].tolist() == [0.5, 0.0]
    assert chunk.null_masks["score"].tolist() == [False, True]
    assert chunk.columns["weight"].tolist() == [1.5, float("inf")]
    assert chunk.columns["flag"].tolist() == [True, False]
    assert chunk.null_masks["flag"].tolist() == [False, True]
    assert chunk.columns["text"].tolist() == ["é", None]
    assert chunk.columns["blob"].tolist() == [b"\x00", b""]
    assert "blob" not in chunk.null_masks


def test_arrow_without_end_of_stream_marker_and_with_compression() -> None:
    batch = pa.record_batch([pa.array(np.arange(1000, dtype=np.int64))], names=["a"])
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    payload = sink.getvalue().to_pybytes()[:-8]  # some writers omit the EOS marker
    attributes = {
        "rowbatch-format-version": "1",
        "content-type": "application/vnd.apache.arrow.stream",
        "rowbatch-chunk-id": "z",
        "rowbatch-table": "t",
        "rowbatch-row-count": "1000",
        "rowbatch-produced-at": "2024-05-01T12:34:56Z",
    }
    chunk = decode_chunk(payload, attributes)
    np.testing.assert_array_equal(chunk.columns["a"], np.arange(1000))
