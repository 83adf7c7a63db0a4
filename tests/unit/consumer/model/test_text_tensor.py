"""Vectorised BYTES tensors are byte for byte what tritonclient builds element by element, and
reject exactly what the per-row path rejects, with the same message."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray
from tritonclient.utils import serialize_byte_tensor

from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.text_tensor import (
    bytes_input,
    check_text,
    serialize_text,
    utf8_elements,
)

_ELEMENT = st.one_of(
    st.text(),
    st.text(alphabet=st.characters(max_codepoint=0x7F)),
    st.binary(max_size=8),
    st.none(),
    st.integers(),
    st.sampled_from(["bad \udc80", "\ud800", np.bytes_(b"x\x00"), bytearray(b"ab"), 1.5]),
)


def objects(values: list[Any], shape: tuple[int, ...] | None = None) -> NDArray[Any]:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out if shape is None else out.reshape(shape)


def per_row(values: NDArray[Any]) -> Any:
    try:
        return utf8_elements("c", values)
    except SchemaMismatch as exc:
        return (str(exc), exc.column, exc.expected, exc.found, exc.row)


def vectorised(values: NDArray[Any]) -> Any:
    try:
        raw = serialize_text("c", values)
    except SchemaMismatch as exc:
        return (str(exc), exc.column, exc.expected, exc.found, exc.row)
    reference = serialize_byte_tensor(objects(utf8_elements("c", values)))
    expected = reference.item() if reference.size else b""
    assert raw == expected
    return utf8_elements("c", values)


@settings(max_examples=400, deadline=None)
@given(st.lists(_ELEMENT, max_size=12) | st.lists(st.text(), max_size=12))
def test_serialise_and_check_agree_with_the_per_row_path(values: list[Any]) -> None:
    array = objects(values)
    assert vectorised(array) == per_row(array)
    try:
        check_text("c", array)
    except SchemaMismatch as exc:
        assert (str(exc), exc.column, exc.expected, exc.found, exc.row) == per_row(array)
    else:
        assert isinstance(per_row(array), list)


@pytest.mark.parametrize(
    "values",
    [
        objects(["", "héllo", "日本語 🤖", "a\x00b"]),
        objects(["ab", "cd", "é", "f"], (2, 2)),
        objects([b"\xff\x00", b"", np.bytes_(b"x")]),
        objects(["a", b"b"]),
        np.array(["ab", "c"]),
        objects([]),
    ],
)
def test_raw_content_is_what_tritonclient_stores(values: NDArray[Any]) -> None:
    shape = list(values.shape) if values.ndim > 1 else [len(values), 1]
    ours = bytes_input("TEXT", shape, serialize_text("c", values))
    reference = grpcclient.InferInput("TEXT", shape, "BYTES")
    reference.set_data_from_numpy(objects(utf8_elements("c", values)).reshape(shape))
    assert ours._get_content() == reference._get_content()
    assert ours._get_tensor() == reference._get_tensor()


def test_errors_name_the_row() -> None:
    with pytest.raises(SchemaMismatch, match="row 2 is not encodable as UTF-8") as caught:
        check_text("t", objects(["a", "b", "bad \udc80"]))
    assert caught.value.found == repr("\udc80")
    with pytest.raises(SchemaMismatch, match="row 1 is null, not text"):
        serialize_text("t", objects(["a", None]))
    with pytest.raises(SchemaMismatch, match="row 0 is int, not text"):
        check_text("t", objects([3, "a"]))
