"""The orjson fast path of JSON decoding gives exactly what the stdlib path gives: the same
columns, or the same error with the same message, whatever the payload."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.codec_json import decode as json_decode
from rowbatch.wire.codec_json.decode import decode_json
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import Encoding
from tests.unit.wire.helpers import ChunkCase, chunk_cases

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(decode: Any, payload: bytes) -> Any:
    """Comparable result of one decode: columns (numeric arrays bit for bit) or the error."""
    try:
        columns = decode(payload)
    except WireError as exc:
        return ("error", type(exc).__name__, str(exc), exc.reason)
    return [
        (
            c.name,
            str(c.type),
            str(c.values.dtype),
            c.values.shape,
            c.values.tolist() if c.values.dtype == object else c.values.tobytes(),
            None if c.nulls is None else c.nulls.tolist(),
        )
        for c in columns
    ]


def assert_same(payload: bytes) -> None:
    assert outcome(decode_json, payload) == outcome(json_decode._decode_strict, payload)


@PROPERTY
@given(case=chunk_cases())
def test_encoded_chunks_decode_alike(case: ChunkCase) -> None:
    payload = encode_chunk("t", case.columns, Encoding.JSON, "c", schema=case.types).payload
    assert_same(payload)


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=2**62, max_value=2**66),
    st.integers(min_value=-(2**66), max_value=-(2**62)),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "a:b", "\u00e9", "\U0001f600", "QUJD"]),
)


_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)
_TYPES = st.sampled_from(["int64", "float32", "float64", "bool", "string", "bytes", "vector", "x"])


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    """Chunk-shaped JSON (sometimes wrong in any way), with duplicate members, escapes and
    odd literals spliced into the text."""
    entries = []
    for _ in range(draw(st.integers(0, 3))):
        members: list[tuple[str, Any]] = [
            ("name", draw(st.text(max_size=4) | st.sampled_from(["a", "a:b", "b"]))),
            ("type", draw(_TYPES)),
            ("values", draw(st.lists(_VALUES, max_size=5))),
        ]
        if draw(st.booleans()):
            members.append(("dim", draw(st.integers(0, 3) | _SCALARS)))
        if draw(st.integers(0, 5)) == 0:
            members.append(draw(st.sampled_from(members)))  # a duplicate member
        entries.append("{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in members) + "}")
    text = '{"columns":[' + ",".join(entries) + "]}"
    if draw(st.integers(0, 6)) == 0:
        text = text.replace('"name"', '"n\\u0061me"', 1)
    if draw(st.integers(0, 6)) == 0:
        text = text.replace(":", "\\u003a", 1).replace('"a:b"', '"a\\u003Ab"')
    if draw(st.integers(0, 6)) == 0:
        text = text.replace("[", "[NaN,", 1)
    if draw(st.integers(0, 8)) == 0:
        text = text[: draw(st.integers(0, len(text)))]
    return text.encode("utf-8", "surrogatepass")


@PROPERTY
@given(payload=documents())
def test_any_document_decodes_alike(payload: bytes) -> None:
    assert_same(payload)


@pytest.mark.parametrize(
    "payload",
    [
        b'{"columns": [], "columns": []}',
        b'{"columns": [{"name": "a", "n\\u0061me": "b", "type": "int64", "values": [1]}]}',
        # a duplicate member whose extra colon an escaped colon in a value would hide
        b'{"columns": [{"name": "a", "name": "a", "type": "string", "values": ["x\\u003ay"]}]}',
        b'{"columns": [{"name": "a", "type": "int64", "values": [18446744073709551616]}]}',
        b'{"columns": [{"name": "a", "type": "float64", "values": [18446744073709551616]}]}',
        b'{"columns": [{"name": "a", "type": "float32", "values": [-9223372036854775809]}]}',
        b'{"columns": [{"name": "a", "type": "vector", "dim": 1, "values": [[1e19], [2]]}]}',
        b'{"columns": [{"name": "a", "type": "string", "values": [18446744073709551616]}]}',
        b'{"columns": [{"name": "a", "type": "float64", "values": [NaN, Infinity]}]}',
        b'{"columns": [{"name": "a", "type": "float64", "values": [1e400]}]}',
        b'{"columns": [{"name": "a", "type": "string", "values": ["\\ud800"]}]}',
        b'{"columns": [{"name": "a", "type": "string", "values": ["\\ud83d\\ude00"]}]}',
        b'{"columns": [{"name": "a:b", "type": "string", "values": ["c:d", null, ""]}]}',
        b'\xef\xbb\xbf{"columns": [{"name": "a", "type": "int64", "values": [1]}]}',
        b"\xff\xfe{}",
        b"[" * 100_000,
        b'{"columns": [{"name": "a", "type": "int64", "values": [1]}]} x',
    ],
)
def test_edge_cases_decode_alike(payload: bytes) -> None:
    assert_same(payload)


def test_fast_path_is_taken_for_ordinary_chunks() -> None:
    data = {"id": np.arange(3), "text": ["a:b", "c", None], "v": np.ones((3, 2), np.float32)}
    payload = encode_chunk("t", data, Encoding.JSON, "c").payload
    assert json_decode._decode_fast(payload) is not None
    assert_same(payload)
