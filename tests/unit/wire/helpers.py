"""Shared strategies and checks for the wire-contract tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from numpy.typing import NDArray

from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    STRING,
    ColumnType,
    Kind,
)

SCALAR_TYPES = (INT64, FLOAT32, FLOAT64, BOOL, STRING, BYTES)


def masked(data: Any, mask: Any) -> NDArray[Any]:
    """``np.ma.masked_array``, typed as the plain array it is to callers."""
    out: NDArray[Any] = np.ma.masked_array(data, mask=mask)
    return out


def element_strategy(ctype: ColumnType) -> st.SearchStrategy[Any]:
    kind = ctype.kind
    if kind is Kind.INT64:
        return st.integers(-(2**63), 2**63 - 1)
    if kind is Kind.FLOAT32:
        return st.floats(width=32)
    if kind is Kind.FLOAT64:
        return st.floats()
    if kind is Kind.BOOL:
        return st.booleans()
    if kind is Kind.STRING:
        return st.text(max_size=20)
    if kind is Kind.BYTES:
        return st.binary(max_size=20)
    assert ctype.dim is not None
    return st.lists(st.floats(width=32), min_size=ctype.dim, max_size=ctype.dim)


column_types: st.SearchStrategy[ColumnType] = st.one_of(
    st.sampled_from(SCALAR_TYPES), st.integers(1, 4).map(ColumnType.vector)
)


@dataclass(frozen=True)
class ChunkCase:
    rows: int
    columns: dict[str, list[Any]]
    types: dict[str, ColumnType]


@st.composite
def chunk_cases(draw: st.DrawFn, max_rows: int = 8, max_columns: int = 4) -> ChunkCase:
    rows = draw(st.integers(0, max_rows))
    names = draw(
        st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=max_columns, unique=True)
    )
    columns: dict[str, list[Any]] = {}
    types: dict[str, ColumnType] = {}
    for name in names:
        ctype = draw(column_types)
        elements = element_strategy(ctype)
        if draw(st.booleans()):
            elements = st.none() | elements
        columns[name] = draw(st.lists(elements, min_size=rows, max_size=rows))
        types[name] = ctype
    return ChunkCase(rows, columns, types)


def canonical(ctype: ColumnType, values: Sequence[Any]) -> tuple[NDArray[Any], NDArray[np.bool_]]:
    """What decode must return for ``values`` (Python values, ``None`` = null), computed
    without the library."""
    nulls = np.array([v is None for v in values], dtype=np.bool_)
    n = len(values)
    kind = ctype.kind
    out: NDArray[Any]
    if kind in (Kind.STRING, Kind.BYTES):
        out = np.empty(n, dtype=object)
        out[:] = list(values)
    elif kind is Kind.VECTOR:
        dim = ctype.dim or 0
        out = np.array([[0.0] * dim if v is None else v for v in values], dtype=np.float32)
        out = out.reshape(n, dim)
    else:
        fill = False if kind is Kind.BOOL else 0
        out = np.array([fill if v is None else v for v in values], dtype=ctype.numpy_dtype)
        out = out.reshape(n)
    return out, nulls


def assert_column_equal(name: str, actual: NDArray[Any], expected: NDArray[Any]) -> None:
    assert actual.dtype == expected.dtype, (name, actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (name, actual.shape, expected.shape)
    if expected.dtype == object:
        assert [type(v) for v in actual] == [type(v) for v in expected], name
        assert list(actual) == list(expected), name
        return
    np.testing.assert_array_equal(actual, expected, err_msg=name)
    if expected.dtype.kind == "f":
        both = ~np.isnan(expected)
        np.testing.assert_array_equal(np.signbit(actual[both]), np.signbit(expected[both]))


def assert_decoded_matches(
    decoded: DecodedChunk,
    columns: Mapping[str, Sequence[Any]],
    types: Mapping[str, ColumnType],
    rows: int,
) -> None:
    assert decoded.row_count == rows
    assert decoded.headers.row_count == rows
    assert list(decoded.columns) == list(columns)
    for name, values in columns.items():
        expected, nulls = canonical(types[name], values)
        assert decoded.types[name] == types[name]
        assert_column_equal(name, decoded.columns[name], expected)
        assert not decoded.columns[name].flags.writeable
        if nulls.any():
            np.testing.assert_array_equal(decoded.null_masks[name], nulls)
        else:
            assert name not in decoded.null_masks
