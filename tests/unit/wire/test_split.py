"""split_rows: every part fits, rows keep order, ids are deterministic, oversize rows are named."""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodeOptions, encode_chunk
from rowbatch.wire.chunks.split import split_rows
from rowbatch.wire.columns.column_type import INT64, STRING, ColumnType
from rowbatch.wire.errors import RowTooLarge
from rowbatch.wire.headers.fields import Encoding

ENCODINGS = [Encoding.JSON, Encoding.ARROW]
MOMENT = dt.datetime(2024, 5, 1, tzinfo=dt.UTC)


def columns(rows: int, text_len: int = 50) -> dict[str, Any]:
    rng = np.random.default_rng(rows)
    return {
        "id": np.arange(rows, dtype=np.int64),
        "text": ["x" * int(n) for n in rng.integers(0, text_len, rows)],
        "emb": rng.standard_normal((rows, 8)).astype(np.float32),
    }


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_fits_whole_keeps_id(encoding: Encoding) -> None:
    parts = split_rows("t", columns(10), encoding, "base", max_bytes=1_000_000)
    assert len(parts) == 1
    assert parts[0].headers.chunk_id == "base"
    whole = encode_chunk("t", columns(10), encoding, "base")
    assert parts[0].payload == whole.payload


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(2, 400),
    text_len=st.integers(1, 400),
    max_bytes=st.integers(3_000, 40_000),
)
def test_parts_fit_and_reassemble(
    encoding: Encoding, rows: int, text_len: int, max_bytes: int
) -> None:
    data = columns(rows, text_len)
    at_moment = EncodeOptions(produced_at=MOMENT)
    try:
        parts = split_rows("t", data, encoding, "base", max_bytes=max_bytes, options=at_moment)
    except RowTooLarge as exc:
        assert exc.row_index is not None
        assert exc.size > max_bytes
        return
    ids: list[str] = []
    texts: list[str] = []
    seen = 0
    for part in parts:
        assert part.size <= max_bytes
        decoded = decode_chunk(part.payload, part.attributes)
        assert decoded.headers.produced_at == MOMENT
        ids.append(decoded.chunk_id)
        np.testing.assert_array_equal(
            decoded.columns["id"], np.arange(seen, seen + decoded.row_count)
        )
        np.testing.assert_array_equal(
            decoded.columns["emb"], data["emb"][seen : seen + decoded.row_count]
        )
        texts.extend(decoded.columns["text"].tolist())
        seen += decoded.row_count
    assert seen == rows
    assert texts == data["text"]
    if len(parts) > 1:
        assert ids == [f"base.{i}" for i in range(len(parts))]
    again = split_rows("t", data, encoding, "base", max_bytes=max_bytes, options=at_moment)
    assert [(p.payload, p.headers) for p in again] == [(p.payload, p.headers) for p in parts]


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_parts_are_reasonably_full(encoding: Encoding) -> None:
    data = columns(5000)
    whole = encode_chunk("t", data, encoding, "b")
    limit = whole.size // 5
    parts = split_rows("t", data, encoding, "b", max_bytes=limit)
    assert 5 <= len(parts) <= 8
    assert all(p.size <= limit for p in parts)


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_skewed_rows(encoding: Encoding) -> None:
    text = ["a"] * 300 + ["b" * 20_000] * 3 + ["c"] * 300
    parts = split_rows("t", {"s": text}, encoding, "skew", max_bytes=25_000)
    decoded = [decode_chunk(p.payload, p.attributes) for p in parts]
    assert sum(d.row_count for d in decoded) == len(text)
    assert [v for d in decoded for v in d.columns["s"].tolist()] == text
    assert all(p.size <= 25_000 for p in parts)


@pytest.mark.parametrize("encoding", ENCODINGS, ids=["json", "arrow"])
def test_row_too_large_names_the_row(encoding: Encoding) -> None:
    text = ["small"] * 10 + ["huge" * 10_000] + ["small"] * 10
    with pytest.raises(RowTooLarge, match="row 10 alone encodes to") as info:
        split_rows("t", {"s": text}, encoding, "big", max_bytes=5_000)
    assert info.value.row_index == 10
    assert info.value.size > 40_000
    assert info.value.max_bytes == 5_000
    assert info.value.reason == "row_too_large"


def test_single_row_and_empty_chunk_too_large() -> None:
    with pytest.raises(RowTooLarge, match="row 0 alone"):
        split_rows("t", {"s": ["x" * 10_000]}, "arrow", "one", max_bytes=1_000)
    with pytest.raises(RowTooLarge, match="without rows") as info:
        split_rows("t", {"s": []}, "arrow", "none", max_bytes=10, schema={"s": STRING})
    assert info.value.row_index is None


def test_split_keeps_nulls_and_schema() -> None:
    rows = 2000
    values: list[int | None] = [None if i % 7 == 0 else i for i in range(rows)]
    vectors = [None if i % 5 == 0 else [float(i)] * 4 for i in range(rows)]
    parts = split_rows(
        "t",
        {"v": values, "e": vectors},
        "arrow",
        "n",
        max_bytes=8_000,
        schema={"v": INT64, "e": ColumnType.vector(4)},
        options=EncodeOptions(ordering_key="k"),
    )
    assert len(parts) > 1
    got_nulls: list[bool] = []
    got_vec_nulls: list[bool] = []
    for part in parts:
        decoded = decode_chunk(part.payload, part.attributes)
        assert decoded.headers.ordering_key == "k"
        mask = decoded.null_masks.get("v", np.zeros(decoded.row_count, bool))
        got_nulls.extend(mask.tolist())
        vmask = decoded.null_masks.get("e", np.zeros(decoded.row_count, bool))
        got_vec_nulls.extend(vmask.tolist())
    assert got_nulls == [v is None for v in values]
    assert got_vec_nulls == [v is None for v in vectors]


def test_max_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_bytes"):
        split_rows("t", {"a": [1]}, "json", "x", max_bytes=0)
