"""encode_chunk accepts numpy arrays (masked too), pyarrow arrays and Python sequences, infers
the documented types, and converts only where no information is lost silently."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    STRING,
    ColumnType,
)
from tests.unit.wire.helpers import masked


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (np.array([1, 2], dtype=np.int8), INT64),
        (np.array([1, 2], dtype=np.int32), INT64),
        (np.array([1, 2], dtype=np.uint32), INT64),
        (np.array([1, 2], dtype=np.uint64), INT64),
        (np.array([1, 2], dtype=np.int64), INT64),
        (np.array([1, 2], dtype=np.float16), FLOAT32),
        (np.array([1, 2], dtype=np.float32), FLOAT32),
        (np.array([1, 2], dtype=np.float64), FLOAT64),
        (np.array([True, False]), BOOL),
        (np.array(["a", "bc"]), STRING),
        (np.array([b"a", b"bc"]), BYTES),
        (np.array(["a", None], dtype=object), STRING),
        (np.zeros((2, 5), dtype=np.float64), ColumnType.vector(5)),
        (np.zeros((2, 5), dtype=np.int64), ColumnType.vector(5)),
        ([1, 2], INT64),
        ([1, 2.5], FLOAT64),
        ([np.int32(1), np.int64(2)], INT64),
        ([np.float32(1.5), None], FLOAT64),
        ([True, None], BOOL),
        (["a", None], STRING),
        ([b"a", bytearray(b"b")], BYTES),
        ([[1, 2], (3, 4)], ColumnType.vector(2)),
        ([np.zeros(3), None], ColumnType.vector(3)),
        ((1, 2), INT64),
        (pa.array([1, 2], pa.int16()), INT64),
        (pa.chunked_array([pa.array(["a"]), pa.array(["b"])]), STRING),
        (
            pa.FixedSizeListArray.from_arrays(pa.array([1, 2, 3, 4], pa.float32()), 2),
            ColumnType.vector(2),
        ),
    ],
)
@pytest.mark.parametrize("encoding", ["json", "arrow"])
def test_inferred_types(data: Any, expected: ColumnType, encoding: str) -> None:
    chunk = encode_chunk("t", {"c": data}, encoding, "i")
    decoded = decode_chunk(chunk.payload, chunk.attributes)
    assert decoded.types["c"] == expected
    assert decoded.columns["c"].dtype == expected.numpy_dtype
    assert decoded.row_count == 2


def test_masked_arrays_mark_nulls() -> None:
    data = masked([1.5, np.nan, 3.0], [False, False, True])
    chunk = encode_chunk("t", {"x": data}, "arrow", "m")
    decoded = decode_chunk(chunk.payload, chunk.attributes)
    assert decoded.null_masks["x"].tolist() == [False, False, True]
    assert np.isnan(decoded.columns["x"][1])
    assert decoded.columns["x"][2] == 0.0


def test_explicit_null_masks_combine_with_none() -> None:
    chunk = encode_chunk(
        "t", {"s": ["a", None, "c"]}, "json", "m", null_masks={"s": [True, False, False]}
    )
    decoded = decode_chunk(chunk.payload, chunk.attributes)
    assert decoded.columns["s"].tolist() == [None, None, "c"]
    assert decoded.null_masks["s"].tolist() == [True, True, False]


def test_declared_types_convert_where_safe() -> None:
    chunk = encode_chunk(
        "t",
        {
            "f32": np.array([1.0, 2.5]),
            "f64": [1, 2],
            "v": [[1, 2], [3, 4]],
            "all_null": [None, None],
        },
        "arrow",
        "d",
        schema={"f32": FLOAT32, "f64": FLOAT64, "v": ColumnType.vector(2), "all_null": STRING},
    )
    decoded = decode_chunk(chunk.payload, chunk.attributes)
    assert decoded.columns["f32"].dtype == np.float32
    assert decoded.columns["f64"].tolist() == [1.0, 2.0]
    assert decoded.columns["v"].dtype == np.float32
    assert decoded.columns["all_null"].tolist() == [None, None]
    assert decoded.null_masks["all_null"].tolist() == [True, True]


def test_column_order_is_kept() -> None:
    names = ["z", "a", "m", "b"]
    chunk = encode_chunk("t", {n: [1] for n in names}, "json", "o")
    assert list(decode_chunk(chunk.payload, chunk.attributes).columns) == names
    chunk = encode_chunk("t", {n: [1] for n in names}, "arrow", "o")
    assert list(decode_chunk(chunk.payload, chunk.attributes).columns) == names


def test_random_chunk_id_when_omitted() -> None:
    a = encode_chunk("t", {"a": [1]}, "json")
    b = encode_chunk("t", {"a": [1]}, "json")
    assert a.headers.chunk_id != b.headers.chunk_id
    assert len(a.headers.chunk_id) == 36


def test_decoded_column_helper() -> None:
    chunk = encode_chunk("t", {"a": [1, None]}, "json", "h")
    col = decode_chunk(chunk.payload, chunk.attributes).column("a")
    assert col.type == INT64
    assert col.nulls is not None
    assert col.nulls.tolist() == [False, True]
