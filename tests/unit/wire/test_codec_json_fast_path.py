"""The short cuts of JSON column decoding (well-formed column objects, float32 casts that
cannot overflow) give what the full checks give: the same columns, or the same error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.codec_json import decode as json_decode
from rowbatch.wire.codec_json import values as json_values
from rowbatch.wire.codec_json.decode import decode_json
from rowbatch.wire.headers.fields import Encoding
from tests.unit.wire.helpers import ChunkCase, chunk_cases
from tests.unit.wire.test_codec_json import PROPERTY, documents, outcome

F32_MAX = float(np.finfo(np.float32).max)
EDGE_FLOATS = [
    F32_MAX,
    -F32_MAX,
    3.4028235e38,
    -3.4028235e38,
    3.4028235677973366e38,
    3.5e38,
    1e39,
    -1e39,
    2**128,
    -(2**128),
    10**400,
    5e-324,
    -0.0,
    0,
    1,
    "NaN",
    "Infinity",
    "-Infinity",
]


@contextmanager
def full_checks() -> Iterator[None]:
    with (
        mock.patch.object(json_decode, "_entry_type_fast", return_value=None),
        mock.patch.object(json_values, "_float32_fast", return_value=None),
    ):
        yield


def assert_alike(payload: bytes) -> None:
    fast = outcome(decode_json, payload)
    with full_checks():
        full = outcome(decode_json, payload)
    assert fast == full


def column(type_name: str, values: list[Any], **extra: Any) -> bytes:
    entry = {"name": "c", "type": type_name, **extra, "values": values}
    return json.dumps({"columns": [entry]}).encode()


@PROPERTY
@given(payload=documents())
def test_any_document_decodes_alike(payload: bytes) -> None:
    assert_alike(payload)


@PROPERTY
@given(case=chunk_cases(max_rows=40))
def test_encoded_chunks_decode_alike(case: ChunkCase) -> None:
    assert_alike(encode_chunk("t", case.columns, Encoding.JSON, "c", schema=case.types).payload)


@pytest.mark.parametrize("value", EDGE_FLOATS)
@pytest.mark.parametrize("count", [1, 40])
def test_float32_edges_decode_alike(value: Any, count: int) -> None:
    values = [1.5] * (count - 1) + [value]
    assert_alike(column("float32", values))
    assert_alike(column("float32", [None, *values]))
    assert_alike(column("vector", [values], dim=count))
    assert_alike(column("vector", [None, values, [0] * count], dim=count))


@PROPERTY
@given(
    values=st.lists(
        st.one_of(
            st.floats(allow_nan=False),
            st.integers(-(2**130), 2**130),
            st.sampled_from(EDGE_FLOATS),
        ),
        max_size=70,
    ),
    vector=st.booleans(),
)
def test_float32_values_decode_alike(values: list[Any], vector: bool) -> None:
    if vector and values:
        assert_alike(column("vector", [values, values], dim=len(values)))
    else:
        assert_alike(column("float32", values))


@pytest.mark.parametrize(
    "payload",
    [
        column("vector", [[1, 2]], dim=2),
        column("vector", [[1, 2]], dim=True),
        column("vector", [[1, 2]], dim=2.0),
        column("vector", [[1, 2]], dim=0),
        column("vector", [[1] * 3], dim=2**21),
        column("vector", [[1, 2]]),
        column("int64", [1], dim=1),
        column("Int64", [1]),
        column("int64", {"a": 1}),  # type: ignore[arg-type]
        b'{"columns": [{"name": 1, "type": "int64", "values": [1]}]}',
        b'{"columns": [{"name": "c", "type": ["int64"], "values": [1]}]}',
        b'{"columns": [{"name": "c", "type": "int64", "values": [1], "x": 1}]}',
    ],
)
def test_odd_column_objects_decode_alike(payload: bytes) -> None:
    assert_alike(payload)
