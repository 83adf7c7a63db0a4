"""Property tests: whatever goes through encode_chunk comes back from decode_chunk, typed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodeOptions, encode_chunk
from rowbatch.wire.columns.column_type import BOOL, FLOAT32, FLOAT64, INT64, STRING, ColumnType
from rowbatch.wire.headers.fields import Encoding, kafka_headers_to_attributes
from tests.unit.wire.helpers import (
    ChunkCase,
    assert_column_equal,
    assert_decoded_matches,
    chunk_cases,
    masked,
)

ENCODINGS = [Encoding.JSON, Encoding.ARROW]
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
@PROPERTY
@given(case=chunk_cases())
def test_round_trip_python_values(encoding: Encoding, case: ChunkCase) -> None:
    encoded = encode_chunk("orders", case.columns, encoding, "c-1", schema=case.types)
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    assert decoded.headers == encoded.headers
    assert decoded.chunk_id == "c-1"
    assert decoded.table == "orders"
    assert_decoded_matches(decoded, case.columns, case.types, case.rows)


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
@PROPERTY
@given(case=chunk_cases())
def test_round_trip_via_kafka_headers(encoding: Encoding, case: ChunkCase) -> None:
    encoded = encode_chunk("t", case.columns, encoding, schema=case.types)
    attributes = kafka_headers_to_attributes(encoded.kafka_headers)
    decoded = decode_chunk(encoded.payload, attributes)
    assert_decoded_matches(decoded, case.columns, case.types, case.rows)


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
@PROPERTY
@given(case=chunk_cases())
def test_decoded_chunk_re_encodes_identically(encoding: Encoding, case: ChunkCase) -> None:
    """A decoded chunk is valid encode input (e.g. to re-publish or dead-letter parts of it)."""
    first = decode_chunk(
        encode_chunk("t", case.columns, encoding, "x", schema=case.types).payload,
        encode_chunk("t", case.columns, encoding, "x", schema=case.types).attributes,
    )
    again = encode_chunk(
        "t",
        first.columns,
        encoding,
        "x",
        schema=first.types,
        null_masks=first.null_masks,
        options=EncodeOptions(produced_at=first.headers.produced_at),
    )
    second = decode_chunk(again.payload, again.attributes)
    for name in case.columns:
        assert_column_equal(name, second.columns[name], first.columns[name])
        assert (name in second.null_masks) == (name in first.null_masks)


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    vectors=hnp.arrays(
        np.float32, st.tuples(st.integers(0, 6), st.just(1024)), elements=st.floats(width=32)
    ),
    data=st.data(),
)
def test_round_trip_large_vectors(
    encoding: Encoding, vectors: np.ndarray[Any, Any], data: st.DataObject
) -> None:
    rows = vectors.shape[0]
    null_rows = data.draw(hnp.arrays(np.bool_, rows))
    with_nulls = masked(vectors, np.repeat(null_rows[:, None], 1024, axis=1))
    ids = np.arange(rows, dtype=np.int64)
    encoded = encode_chunk("emb", {"id": ids, "embedding": with_nulls}, encoding, "v")
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    assert decoded.types["embedding"] == ColumnType.vector(1024)
    expected = np.where(null_rows[:, None], np.float32(0), vectors)
    assert_column_equal("embedding", decoded.columns["embedding"], expected)
    if null_rows.any():
        np.testing.assert_array_equal(decoded.null_masks["embedding"], null_rows)
    else:
        assert "embedding" not in decoded.null_masks


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_empty_chunk_keeps_types(encoding: Encoding) -> None:
    types = {"a": INT64, "b": STRING, "v": ColumnType.vector(8), "f": FLOAT32, "ok": BOOL}
    columns: dict[str, list[Any]] = {name: [] for name in types}
    encoded = encode_chunk("t", columns, encoding, "empty", schema=types)
    assert encoded.headers.row_count == 0
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    assert decoded.row_count == 0
    assert dict(decoded.types) == types
    assert decoded.columns["v"].shape == (0, 8)
    assert decoded.columns["a"].dtype == np.int64
    assert decoded.columns["b"].dtype == object


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_text_edge_cases(encoding: Encoding) -> None:
    text = ["", "日本語", "emoji 🎉", "nul\x00byte", 'quote"back\\slash', "\n\t", None, " "]
    blobs = [b"", b"\x00\xff", None, b"a" * 100, b"\n", b"=", b"\x80", b"z"]
    encoded = encode_chunk("t", {"s": text, "b": blobs}, encoding, "txt")
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    assert list(decoded.columns["s"]) == text
    assert list(decoded.columns["b"]) == blobs
    assert decoded.null_masks["s"].tolist() == [v is None for v in text]


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_non_finite_floats_are_values_not_nulls(encoding: Encoding) -> None:
    values = [float("nan"), float("inf"), float("-inf"), -0.0, None]
    encoded = encode_chunk(
        "t",
        {
            "f64": values,
            "f32": values,
            "v": [[float("nan"), float("inf")], None, [1, 2]] + [None] * 2,
        },
        encoding,
        "nf",
        schema={"f32": FLOAT32, "f64": FLOAT64, "v": ColumnType.vector(2)},
    )
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    for name in ("f32", "f64"):
        col = decoded.columns[name]
        assert np.isnan(col[0])
        assert col[1] == np.inf
        assert col[2] == -np.inf
        assert np.signbit(col[3])
        assert decoded.null_masks[name].tolist() == [False, False, False, False, True]
    vec = decoded.columns["v"]
    assert np.isnan(vec[0, 0])
    assert vec[0, 1] == np.inf


def test_json_float32_is_written_short() -> None:
    encoded = encode_chunk("t", {"x": np.array([0.1, 1e-45], dtype=np.float32)}, "json", "s")
    assert b"[0.1,1e-45]" in encoded.payload
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    np.testing.assert_array_equal(decoded.columns["x"], np.array([0.1, 1e-45], np.float32))


@settings(max_examples=200, deadline=None)
@given(values=hnp.arrays(np.float32, st.integers(0, 50), elements=st.floats(width=32)))
def test_json_float32_round_trips_bit_exact(values: np.ndarray[Any, Any]) -> None:
    encoded = encode_chunk("t", {"x": values}, "json", "f")
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    got = decoded.columns["x"]
    same = (got.view(np.uint32) == values.view(np.uint32)) | (np.isnan(got) & np.isnan(values))
    assert same.all()


def test_arrow_numeric_decode_is_zero_copy() -> None:
    values = np.arange(1000, dtype=np.int64)
    vectors = np.ones((1000, 16), dtype=np.float32)
    encoded = encode_chunk("t", {"i": values, "v": vectors}, "arrow", "z")
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    raw = np.frombuffer(encoded.payload, dtype=np.uint8)
    assert np.shares_memory(decoded.columns["i"], raw)
    assert np.shares_memory(decoded.columns["v"], raw)


def test_encode_does_not_touch_caller_arrays() -> None:
    values = np.arange(3, dtype=np.int64)
    encode_chunk("t", {"i": values}, "arrow", "z")
    assert values.flags.writeable


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_arrow_compression_round_trips(compression: str) -> None:
    vectors = np.zeros((100, 64), dtype=np.float32)
    plain = encode_chunk("t", {"v": vectors}, "arrow", "c")
    options = EncodeOptions(compression=compression)  # type: ignore[arg-type]
    packed = encode_chunk("t", {"v": vectors}, "arrow", "c", options=options)
    assert len(packed.payload) < len(plain.payload)
    decoded = decode_chunk(packed.payload, packed.attributes)
    np.testing.assert_array_equal(decoded.columns["v"], vectors)


def test_produced_at_and_ordering_key_travel() -> None:
    moment = datetime(2024, 5, 1, 12, 34, 56, 789123, tzinfo=UTC)
    encoded = encode_chunk(
        "t", {"a": [1]}, "json", "k", options=EncodeOptions("customer-7", produced_at=moment)
    )
    assert encoded.attributes["rowbatch-produced-at"] == "2024-05-01T12:34:56.789Z"
    decoded = decode_chunk(encoded.payload, encoded.attributes)
    assert decoded.headers.produced_at == moment.replace(microsecond=789000)
    assert decoded.headers.ordering_key == "customer-7"


def test_decode_accepts_memoryview_and_bytearray() -> None:
    for encoding in ENCODINGS:
        encoded = encode_chunk("t", {"a": [1, 2]}, encoding, "m")
        for payload in (memoryview(encoded.payload), bytearray(encoded.payload)):
            decoded = decode_chunk(payload, encoded.attributes)
            assert decoded.columns["a"].tolist() == [1, 2]


def test_arrow_multiple_batches_and_dictionary_and_narrow_ints_decode() -> None:
    schema = pa.schema(
        [("i", pa.int32()), ("s", pa.dictionary(pa.int8(), pa.string())), ("t", pa.large_string())]
    )
    batches = [
        pa.record_batch(
            [
                pa.array([1, None], pa.int32()),
                pa.array(["a", "b"]).dictionary_encode().cast(schema.field("s").type),
                pa.array(["x", None], pa.large_string()),
            ],
            schema=schema,
        ),
        pa.record_batch(
            [
                pa.array([3], pa.int32()),
                pa.array(["a"]).dictionary_encode().cast(schema.field("s").type),
                pa.array(["z"], pa.large_string()),
            ],
            schema=schema,
        ),
    ]
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    attrs = encode_chunk("t", {"i": [0, 0, 0]}, "arrow", "mb").attributes
    decoded = decode_chunk(sink.getvalue().to_pybytes(), attrs)
    assert decoded.columns["i"].dtype == np.int64
    assert decoded.columns["i"].tolist() == [1, 0, 3]
    assert decoded.null_masks["i"].tolist() == [False, True, False]
    assert decoded.columns["s"].tolist() == ["a", "b", "a"]
    assert decoded.columns["t"].tolist() == ["x", None, "z"]
    assert dict(decoded.types) == {"i": INT64, "s": STRING, "t": STRING}
