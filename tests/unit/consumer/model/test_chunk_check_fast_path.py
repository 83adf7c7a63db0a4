"""The per-message check remembers column signatures that passed its type checks and then
runs only the value checks: whatever the order of messages, each one passes or fails exactly
as the full check says (same error, same message, same code)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.consumer.model import chunk_check as binding_module
from rowbatch.consumer.model import handler as handler_module
from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.chunk_check import memoized_check
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.columns.canonical import Column, make_column
from rowbatch.wire.columns.column_type import BYTES, FLOAT64, INT64, STRING, ColumnType
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import Encoding

SPEC = ModelSpec(
    "m",
    "1",
    (
        TensorSpec("A", "INT32", (1,)),
        TensorSpec("T", "BYTES", (1,)),
        TensorSpec("V", "FP32", (4,)),
        TensorSpec("D", "FP32", (1,)),
    ),
    (TensorSpec("OUT", "FP32", (1,)),),
    8,
)
BINDING = Binding({"a": "A", "t": "T", "v": "V", "d": "D"}, {"OUT": "out"}, ("id", "a"))
PASSTHROUGH = {"id": INT64}
HEADERS = ChunkHeaders("c", "t", 2, Encoding.JSON, dt.datetime(2024, 1, 1, tzinfo=dt.UTC))


def col(name: str, values: Any, ctype: ColumnType = INT64, nulls: Any = None) -> Column:
    mask = None if nulls is None else np.array(nulls, dtype=np.bool_)
    return make_column(name, np.asarray(values), ctype, mask)


def text(values: list[Any], ctype: ColumnType = STRING, nulls: Any = None) -> Column:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return col("t", arr, ctype, nulls)


GOOD = {
    "id": col("id", np.array([1, 2])),
    "a": col("a", np.array([3, 4])),
    "t": text(["x", "y"]),
    "v": col("v", np.zeros((2, 4), np.float32), ColumnType.vector(4)),
    "d": col("d", np.array([0.5, 1e30]), FLOAT64),
}
VARIANTS: dict[str, dict[str, Column | None]] = {
    "good": {},
    "good_again": {"a": col("a", np.array([-5, 6]))},
    "extra_column": {"x": col("x", np.array([1, 2]))},
    "a_null": {"a": col("a", np.array([3, 0]), nulls=[False, True])},
    "a_mask_without_nulls": {"a": Column("a", INT64, np.array([3, 4]), np.zeros(2, np.bool_))},
    "a_too_big": {"a": col("a", np.array([3, 2**40]))},
    "a_too_small": {"a": col("a", np.array([-(2**31) - 1, 0]))},
    "a_int32_array": {"a": Column("a", INT64, np.array([3, 4], np.int32))},
    "a_float": {"a": col("a", np.array([3.0, 4.0]), FLOAT64)},
    "d_overflows_fp32": {"d": col("d", np.array([0.5, 1e300]), FLOAT64)},
    "d_infinite": {"d": col("d", np.array([np.inf, -np.inf]), FLOAT64)},
    "t_surrogate": {"t": text(["x", "\ud800"])},
    "t_null": {"t": text(["x", None], nulls=[False, True])},
    "t_none_unmasked": {"t": text(["x", None])},
    "t_bytes": {"t": text([b"x", b"y"], BYTES)},
    "t_mixed": {"t": text(["x", b"y"])},
    "t_number": {"t": text(["x", 5])},
    "v_missing": {"v": None},
    "v_dim3": {"v": col("v", np.zeros((2, 3), np.float32), ColumnType.vector(3))},
    "id_string": {"id": text(["1", "2"])},
    "id_missing": {"id": None},
}


def chunk(variant: str) -> DecodedChunk:
    cols = {**GOOD, **VARIANTS[variant]}
    present = {k: c for k, c in cols.items() if c is not None}
    if variant == "id_string":
        present["id"] = Column("id", STRING, present["id"].values)
    rows = len(next(iter(present.values())))
    return DecodedChunk(
        headers=HEADERS,
        columns=MappingProxyType({k: c.values for k, c in present.items()}),
        types=MappingProxyType({k: c.type for k, c in present.items()}),
        null_masks=MappingProxyType(
            {k: c.nulls for k, c in present.items() if c.nulls is not None}
        ),
        row_count=rows,
    )


def outcome(check: Callable[[DecodedChunk], None], variant: str) -> Any:
    try:
        check(chunk(variant))
    except SchemaMismatch as exc:
        return ("mismatch", str(exc), exc.code, exc.column, exc.expected, exc.found, exc.row)
    except (KeyError, TypeError, ValueError) as exc:
        return (type(exc).__name__, str(exc))
    return "ok"


def make_check(passthrough: Mapping[str, ColumnType]) -> Callable[[DecodedChunk], None]:
    """The model handler's per-message check (its inferencer is never called here)."""
    return handler_module.OipHandler(mock.Mock(), SPEC, BINDING, passthrough, 1).check


def full_check(passthrough: Mapping[str, ColumnType] = PASSTHROUGH) -> Any:
    with mock.patch.object(handler_module, "memoized_check", lambda spec, binding, full, *_: full):
        return make_check(passthrough)


def assert_alike(variants: list[str]) -> None:
    memoized = make_check(PASSTHROUGH)
    full = full_check()
    for variant in variants:
        assert outcome(memoized, variant) == outcome(full, variant), variant


def test_every_variant_alike_after_a_good_one() -> None:
    assert_alike([v for name in VARIANTS for v in ("good", name, name, "good")])


def test_outcomes_are_what_the_check_is_for() -> None:
    full = full_check()
    assert outcome(full, "good") == "ok"
    assert outcome(full, "a_mask_without_nulls") == "ok"
    assert outcome(full, "a_null")[2] == "null_not_allowed"
    assert outcome(full, "a_too_big")[2] == "invalid_value"
    assert outcome(full, "d_overflows_fp32")[2] == "invalid_value"
    assert outcome(full, "t_surrogate")[2] == "invalid_value"
    assert outcome(full, "v_missing")[2] == "missing_column"


def test_type_checks_run_once_per_signature() -> None:
    calls: list[str] = []

    def full(chunk: DecodedChunk) -> None:
        calls.append("full")

    check = memoized_check(SPEC, BINDING, full, ("id",))
    for variant in ("good", "good_again", "good", "extra_column", "a_null", "good", "t_bytes"):
        check(chunk(variant))
    # good (new), a_null (a null: the full check words it), t_bytes (a new signature)
    assert calls == ["full"] * 3


def test_signatures_are_forgotten_past_the_limit() -> None:
    calls: list[int] = []
    check = memoized_check(SPEC, BINDING, lambda chunk: calls.append(1), ("id",))
    with mock.patch.object(binding_module, "MAX_KNOWN_SIGNATURES", 1):
        check(chunk("good"))
        check(chunk("t_bytes"))
        check(chunk("good"))
    assert len(calls) == 3


@settings(max_examples=300, deadline=None)
@given(variants=st.lists(st.sampled_from(sorted(VARIANTS)), max_size=12))
def test_any_order_of_messages_alike(variants: list[str]) -> None:
    assert_alike(variants)


@pytest.mark.parametrize("passthrough", [{}, {"id": INT64}, {"id": STRING}, {"zz": INT64}])
def test_passthrough_types_alike(passthrough: dict[str, ColumnType]) -> None:
    memoized = make_check(passthrough)
    full = full_check(passthrough)
    for variant in ("good", "good", "id_string", "good", "id_missing", "good"):
        assert outcome(memoized, variant) == outcome(full, variant), variant


SAME_SIGNATURE = ("good", "good_again", "a_too_big", "a_too_small", "d_overflows_fp32", "good")


def shared(variant: str, types: Mapping[str, ColumnType]) -> DecodedChunk:
    """``chunk(variant)`` as one Arrow layout's chunks come: sharing one types mapping."""
    c = chunk(variant)
    return DecodedChunk(c.headers, c.columns, types, c.null_masks, c.row_count, True)


def test_chunks_sharing_their_types_are_checked_alike() -> None:
    """Chunks of one layout (one types mapping): the signature is found once, the values are
    still checked per chunk."""
    types = chunk("good").types
    memoized, full = make_check(PASSTHROUGH), full_check()
    for variant in SAME_SIGNATURE:

        def run(check: Callable[[DecodedChunk], None], v: str = variant) -> Any:
            try:
                check(shared(v, types))
            except SchemaMismatch as exc:
                return (str(exc), exc.code)
            return "ok"

        assert run(memoized) == run(full), variant
    assert run(full_check(), "a_too_big")[1] == "invalid_value"
