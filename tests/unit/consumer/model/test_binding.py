"""The model binding: start-up checks against the model spec, per-message column checks, and
tensors built from a batch's columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tritonclient.utils import deserialize_bytes_tensor

from harness.model_specs import EMBEDDER, SCORER
from rowbatch.consumer.model.binding import RESERVED_COLUMNS, Binding, BindingError, check_binding
from rowbatch.consumer.model.chunk_check import check_chunk, check_columns
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.model.tensors import build_inputs
from rowbatch.wire.columns.canonical import Column, make_column
from rowbatch.wire.columns.column_type import (
    BOOL,
    BYTES,
    FLOAT32,
    FLOAT64,
    INT64,
    STRING,
    ColumnType,
)

EMBED_BINDING = Binding({"text": "TEXT"}, {"EMBEDDING": "embedding"}, ("id",))
SCORE_BINDING = Binding(
    {"features": "FEATURES", "n": "COUNT"}, {"SCORE": "score", "LABEL": "label"}, ("id", "n")
)


def content(infer_input: Any) -> bytes:
    raw: bytes = infer_input._get_content()
    return raw


# --- Binding / check_binding ------------------------------------------------------------------


def test_binding_is_immutable_and_lists_columns() -> None:
    inputs = {"features": "FEATURES", "n": "COUNT"}
    binding = Binding(inputs, {"SCORE": "score"}, ["id", "n"])  # type: ignore[arg-type]
    inputs["x"] = "X"
    assert dict(binding.inputs) == {"features": "FEATURES", "n": "COUNT"}
    with pytest.raises(TypeError):
        binding.inputs["y"] = "Y"  # type: ignore[index]
    assert binding.passthrough == ("id", "n")
    assert binding.columns == ("features", "n", "id")
    assert binding.result_columns == ("id", "n", "score")


def test_good_bindings_pass() -> None:
    check_binding(EMBEDDER, EMBED_BINDING)
    check_binding(SCORER, SCORE_BINDING)
    check_binding(SCORER, Binding({"f": "FEATURES", "c": "COUNT"}, {"LABEL": "label"}))


def problems(spec: ModelSpec, binding: Binding) -> list[str]:
    with pytest.raises(BindingError) as caught:
        check_binding(spec, binding)
    assert caught.value.model == spec.name
    assert all(p in str(caught.value) for p in caught.value.problems)
    return list(caught.value.problems)


def test_unknown_and_unbound_inputs() -> None:
    found = problems(SCORER, Binding({"features": "FEATURE", "n": "COUNT"}, {"SCORE": "s"}))
    assert found == [
        "column 'features' is bound to model input 'FEATURE', which the model does not have "
        "(inputs: ['FEATURES', 'COUNT'])",
        "model input FEATURES (FP32 [16]) is not bound to any column",
    ]


def test_input_bound_twice() -> None:
    [found] = problems(
        SCORER, Binding({"a": "FEATURES", "b": "FEATURES", "n": "COUNT"}, {"SCORE": "s"})
    )
    assert "'FEATURES' is bound to two columns, 'a' and 'b'" in found


def test_outputs() -> None:
    [found] = problems(EMBEDDER, Binding({"text": "TEXT"}, {}))
    assert "no model output is bound" in found
    [found] = problems(EMBEDDER, Binding({"text": "TEXT"}, {"EMBEDDING": "e", "EMB": "x"}))
    assert "model output 'EMB' is bound, but the model does not have it" in found


@pytest.mark.parametrize("name", sorted(RESERVED_COLUMNS))
def test_reserved_result_columns(name: str) -> None:
    [found] = problems(EMBEDDER, Binding({"text": "TEXT"}, {"EMBEDDING": name}))
    assert f"result column {name!r} clashes" in found
    [found] = problems(EMBEDDER, Binding({"text": "TEXT"}, {"EMBEDDING": "e"}, (name,)))
    assert f"result column {name!r} clashes" in found


def test_duplicate_result_columns() -> None:
    [found] = problems(SCORER, Binding(SCORE_BINDING.inputs, {"SCORE": "x", "LABEL": "x"}))
    assert "result column 'x' appears twice" in found
    [found] = problems(SCORER, Binding(SCORE_BINDING.inputs, {"SCORE": "id"}, ("id",)))
    assert "result column 'id' appears twice" in found
    [found] = problems(SCORER, Binding(SCORE_BINDING.inputs, {"SCORE": "s"}, ("id", "id")))
    assert "result column 'id' appears twice" in found


def test_all_problems_at_once() -> None:
    found = problems(SCORER, Binding({"f": "FEATURES", "x": "X"}, {"Y": "processed_at"}))
    assert len(found) == 4  # unknown input X, COUNT unbound, unknown output Y, reserved name


# --- check_columns ---------------------------------------------------------------------------


def test_matching_types_pass() -> None:
    check_columns(EMBEDDER, EMBED_BINDING, {"text": STRING, "id": INT64, "extra": BOOL})
    check_columns(EMBEDDER, EMBED_BINDING, {"text": BYTES, "id": STRING})
    scorer_types = {"features": ColumnType.vector(16), "n": INT64, "id": STRING}
    check_columns(SCORER, SCORE_BINDING, scorer_types)


def mismatch(spec: ModelSpec, binding: Binding, types: dict[str, ColumnType]) -> SchemaMismatch:
    with pytest.raises(SchemaMismatch) as caught:
        check_columns(spec, binding, types)
    assert caught.value.reason == "schema_mismatch"
    return caught.value


def test_missing_columns() -> None:
    err = mismatch(EMBEDDER, EMBED_BINDING, {"id": INT64})
    assert (err.column, err.expected, err.found) == ("text", "a column named 'text'", "absent")
    assert "model input 'TEXT'" in str(err)
    err = mismatch(EMBEDDER, EMBED_BINDING, {"text": STRING})
    assert err.column == "id"
    assert "passthrough" in str(err)


@pytest.mark.parametrize(
    ("spec", "binding", "types", "column", "expected", "found"),
    [
        (EMBEDDER, EMBED_BINDING, {"text": INT64, "id": INT64}, "text", "string or bytes", "int64"),
        (
            SCORER,
            SCORE_BINDING,
            {"features": ColumnType.vector(8), "n": INT64, "id": INT64},
            "features",
            "vector[float32,16]",
            "vector[float32,8]",
        ),
        (
            SCORER,
            SCORE_BINDING,
            {"features": FLOAT32, "n": INT64, "id": INT64},
            "features",
            "vector[float32,16]",
            "float32",
        ),
        (
            SCORER,
            SCORE_BINDING,
            {"features": ColumnType.vector(16), "n": FLOAT64, "id": INT64},
            "n",
            "int64",
            "float64",
        ),
        (
            SCORER,
            SCORE_BINDING,
            {"features": ColumnType.vector(16), "n": BOOL, "id": INT64},
            "n",
            "int64",
            "bool",
        ),
    ],
)
def test_type_mismatches(
    spec: ModelSpec,
    binding: Binding,
    types: dict[str, ColumnType],
    column: str,
    expected: str,
    found: str,
) -> None:
    err = mismatch(spec, binding, types)
    assert (err.column, err.expected, err.found) == (column, expected, found)
    assert f"column {column!r} ({found}) cannot feed model input" in str(err)


def one_input(datatype: str, dims: tuple[int, ...]) -> tuple[ModelSpec, Binding]:
    spec = ModelSpec("m", "", (TensorSpec("X", datatype, dims),), (TensorSpec("Y", "FP32", ()),), 8)
    return spec, Binding({"x": "X"}, {"Y": "y"})


@pytest.mark.parametrize(
    ("ctype", "datatype", "dims", "fits"),
    [
        (INT64, "INT64", (1,), True),
        (INT64, "INT64", (), True),
        (INT64, "INT64", (-1,), True),
        (INT64, "INT32", (1,), True),
        (INT64, "INT64", (2,), False),
        (INT64, "FP32", (1,), False),
        (FLOAT32, "FP32", (1,), True),
        (FLOAT32, "FP64", (1,), True),
        (FLOAT64, "FP64", (1,), True),
        (FLOAT64, "FP32", (), True),
        (FLOAT64, "INT64", (1,), False),
        (BOOL, "BOOL", (1,), True),
        (BOOL, "INT32", (1,), False),
        (STRING, "BYTES", (1,), True),
        (STRING, "BYTES", (), True),
        (STRING, "BYTES", (2,), False),
        (BYTES, "BYTES", (1,), True),
        (ColumnType.vector(4), "FP32", (4,), True),
        (ColumnType.vector(4), "FP32", (-1,), True),
        (ColumnType.vector(4), "FP64", (4,), True),
        (ColumnType.vector(4), "FP32", (1, 4), False),
        (ColumnType.vector(4), "FP16", (4,), False),
        (ColumnType.vector(1), "FP32", (1,), True),
        (FLOAT32, "UINT8", (1,), False),
    ],
)
def test_type_table(ctype: ColumnType, datatype: str, dims: tuple[int, ...], fits: bool) -> None:
    spec, binding = one_input(datatype, dims)
    if fits:
        check_columns(spec, binding, {"x": ctype})
    else:
        with pytest.raises(SchemaMismatch):
            check_columns(spec, binding, {"x": ctype})


def test_unfeedable_datatype_says_so() -> None:
    spec, binding = one_input("UINT8", (1,))
    err = mismatch(spec, binding, {"x": INT64})
    assert err.expected == "no column type (the consumer cannot feed this input)"


# --- build_inputs ----------------------------------------------------------------------------


def test_build_embedder_inputs() -> None:
    texts = np.array(["", "héllo", "日本語 🤖", "a\x00b"], dtype=object)
    [text] = build_inputs(EMBEDDER, EMBED_BINDING, {"text": texts, "id": np.arange(4)})
    assert (text.name(), text.datatype(), list(text.shape())) == ("TEXT", "BYTES", [4, 1])
    decoded = deserialize_bytes_tensor(content(text))
    assert [v.decode("utf-8") for v in decoded] == list(texts)


def test_build_bytes_column() -> None:
    raw = np.array([b"\xff\x00", b"", np.bytes_(b"x")], dtype=object)
    [text] = build_inputs(EMBEDDER, EMBED_BINDING, {"text": raw})
    assert list(deserialize_bytes_tensor(content(text))) == [b"\xff\x00", b"", b"x"]
    unicode_array = np.array(["ab", "c"])  # dtype <U2 works too
    [text] = build_inputs(EMBEDDER, EMBED_BINDING, {"text": unicode_array})
    assert list(deserialize_bytes_tensor(content(text))) == [b"ab", b"c"]


def test_build_scorer_inputs_no_copy_when_dtypes_match() -> None:
    rng = np.random.default_rng(1)
    features = rng.normal(size=(5, 16)).astype(np.float32)
    count = np.array([0, 1, -2, 3, 2**40], dtype=np.int64)
    inputs = build_inputs(SCORER, SCORE_BINDING, {"features": features, "n": count})
    assert [(i.name(), i.datatype(), list(i.shape())) for i in inputs] == [
        ("FEATURES", "FP32", [5, 16]),
        ("COUNT", "INT64", [5, 1]),
    ]
    assert content(inputs[0]) == features.tobytes()
    assert content(inputs[1]) == count.tobytes()


def test_build_casts_where_needed() -> None:
    spec, binding = one_input("INT32", (1,))
    [x] = build_inputs(spec, binding, {"x": np.array([1, -2, 2**31 - 1], dtype=np.int64)})
    assert np.frombuffer(content(x), np.int32).tolist() == [1, -2, 2**31 - 1]
    spec, binding = one_input("FP64", ())
    [x] = build_inputs(spec, binding, {"x": np.array([0.5, 1.5], dtype=np.float32)})
    assert list(x.shape()) == [2]
    assert np.frombuffer(content(x), np.float64).tolist() == [0.5, 1.5]
    spec, binding = one_input("FP32", (-1,))
    vectors = np.arange(6, dtype=np.float64).reshape(3, 2)
    [x] = build_inputs(spec, binding, {"x": vectors})
    assert list(x.shape()) == [3, 2]
    assert np.frombuffer(content(x), np.float32).tolist() == list(range(6))
    spec, binding = one_input("BOOL", (1,))
    [x] = build_inputs(spec, binding, {"x": np.array([True, False])})
    assert np.frombuffer(content(x), np.bool_).tolist() == [True, False]


def test_build_empty_batch() -> None:
    [text] = build_inputs(EMBEDDER, EMBED_BINDING, {"text": np.empty(0, dtype=object)})
    assert list(text.shape()) == [0, 1]
    spec, binding = one_input("INT32", (1,))
    [x] = build_inputs(spec, binding, {"x": np.empty(0, dtype=np.int64)})
    assert list(x.shape()) == [0, 1]


@pytest.mark.parametrize(
    ("datatype", "values", "row", "found"),
    [
        ("INT32", np.array([0, 2**31], dtype=np.int64), 1, "2147483648"),
        ("INT32", np.array([-(2**31) - 1, 0], dtype=np.int64), 0, "-2147483649"),
        ("FP32", np.array([1.0, np.inf, 1e39], dtype=np.float64), 2, "1e+39"),
    ],
)
def test_out_of_range_values(datatype: str, values: NDArray[Any], row: int, found: str) -> None:
    spec, binding = one_input(datatype, (1,))
    with pytest.raises(SchemaMismatch) as caught:
        build_inputs(spec, binding, {"x": values})
    assert (caught.value.column, caught.value.row) == ("x", row)
    assert found in caught.value.found


def test_nulls_are_schema_mismatch() -> None:
    texts = np.array(["a", None, None], dtype=object)
    nulls = np.array([False, True, True])
    with pytest.raises(SchemaMismatch) as caught:
        build_inputs(EMBEDDER, EMBED_BINDING, {"text": texts}, {"text": nulls})
    err = caught.value
    assert (err.column, err.row, err.expected) == ("text", 1, "no nulls")
    assert "row 1 is null (2 null row(s))" in str(err)
    # A None without a mask is caught too; a null in a passthrough column is fine.
    with pytest.raises(SchemaMismatch, match="row 1 is null, not text"):
        build_inputs(EMBEDDER, EMBED_BINDING, {"text": texts})
    ok = np.array(["a", "b"], dtype=object)
    build_inputs(EMBEDDER, EMBED_BINDING, {"text": ok}, {"id": np.array([True, False])})
    build_inputs(EMBEDDER, EMBED_BINDING, {"text": ok}, {"text": np.array([False, False])})


def test_unencodable_text() -> None:
    texts = np.array(["ok", "bad \udc80 surrogate"], dtype=object)
    with pytest.raises(SchemaMismatch, match="row 1 is not encodable as UTF-8") as caught:
        build_inputs(EMBEDDER, EMBED_BINDING, {"text": texts})
    assert caught.value.found == repr("\udc80")


def test_arrays_that_cannot_feed() -> None:
    with pytest.raises(SchemaMismatch, match="cannot feed model input TEXT"):
        build_inputs(EMBEDDER, EMBED_BINDING, {"text": np.arange(3)})
    with pytest.raises(SchemaMismatch, match="cannot feed model input FEATURES"):
        build_inputs(
            SCORER,
            SCORE_BINDING,
            {"features": np.zeros((2, 8), np.float32), "n": np.zeros(2, np.int64)},
        )
    with pytest.raises(SchemaMismatch, match="no column for model input COUNT"):
        build_inputs(SCORER, SCORE_BINDING, {"features": np.zeros((2, 16), np.float32)})
    with pytest.raises(ValueError, match="has 3 rows, the others 2"):
        build_inputs(
            SCORER,
            SCORE_BINDING,
            {"features": np.zeros((2, 16), np.float32), "n": np.zeros(3, np.int64)},
        )


def test_check_chunk() -> None:
    good = {
        "features": make_column(
            "features", np.zeros((2, 16), np.float32), ColumnType.vector(16), None
        ),
        "n": make_column("n", np.array([1, 2]), INT64, None),
        "id": make_column(
            "id", np.array(["a", None], dtype=object), STRING, np.array([False, True])
        ),
    }
    check_chunk(SCORER, SCORE_BINDING, good)  # a null passthrough is fine
    with_null = dict(good, n=make_column("n", np.array([1, 0]), INT64, np.array([False, True])))
    with pytest.raises(SchemaMismatch, match="'n' feeds model input 'COUNT' but row 1 is null"):
        check_chunk(SCORER, SCORE_BINDING, with_null)
    wrong = dict(good, n=Column("n", FLOAT64, np.array([1.0, 2.0])))
    with pytest.raises(SchemaMismatch, match=r"column 'n' \(float64\) cannot feed"):
        check_chunk(SCORER, SCORE_BINDING, wrong)
