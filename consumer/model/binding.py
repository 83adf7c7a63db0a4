"""The model binding: which table column feeds which model input, which model output becomes
which result column, and which input columns pass through to the result row.

Three checks at three moments:

- :func:`check_binding` at start-up: the binding against the model's spec (a
  :class:`BindingError` lists every problem: the consumer cannot run).
- :func:`check_columns` per decoded message: the chunk's column types against the bound inputs
  (a :class:`SchemaMismatch` poisons that one message).
- :func:`build_inputs` per batch: the batch's arrays become ``InferInput`` tensors; nulls in an
  input column, or values the model's datatype cannot hold, raise :class:`SchemaMismatch`.
  :func:`check_chunk` runs the same value checks on one message, without building tensors, so
  a caller can reject a message before it joins a batch. Text becomes a BYTES tensor once,
  per batch (:mod:`consumer.model.text_tensor`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray

from consumer.model.discovery import ModelSpec, TensorSpec
from consumer.model.mismatch import SchemaMismatch as SchemaMismatch  # noqa: PLC0414 (re-export)
from consumer.model.text_tensor import bytes_input, check_text, serialize_text
from wire.chunks import DecodedChunk
from wire.columns import Column, ColumnType, Kind

#: Result-table columns the consumer writes itself; no output or passthrough may take them.
RESERVED_COLUMNS: Final = frozenset(
    {"chunk_id", "row_index", "source_message_id", "model_name", "model_version", "processed_at"}
)

#: Which model datatypes a column kind can feed (a cast happens where the dtypes differ).
_FEEDS: Final[Mapping[Kind, tuple[str, ...]]] = MappingProxyType(
    {
        Kind.STRING: ("BYTES",),
        Kind.BYTES: ("BYTES",),
        Kind.INT64: ("INT64", "INT32"),
        Kind.FLOAT32: ("FP32", "FP64"),
        Kind.FLOAT64: ("FP64", "FP32"),
        Kind.BOOL: ("BOOL",),
        Kind.VECTOR: ("FP32", "FP64"),
    }
)

#: numpy dtype of each datatype a column can feed, and the array dtype kinds accepted for it.
_NUMPY: Final[Mapping[str, tuple[np.dtype[Any], str]]] = MappingProxyType(
    {
        "BYTES": (np.dtype(object), "OUS"),
        "INT64": (np.dtype(np.int64), "iu"),
        "INT32": (np.dtype(np.int32), "iu"),
        "FP32": (np.dtype(np.float32), "f"),
        "FP64": (np.dtype(np.float64), "f"),
        "BOOL": (np.dtype(np.bool_), "b"),
    }
)


class BindingError(ValueError):
    """The configured binding does not fit the model (raised at start-up)."""

    def __init__(self, model: str, problems: Sequence[str]) -> None:
        super().__init__(f"binding does not fit model {model!r}: " + "; ".join(problems))
        self.model = model
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Binding:
    """How table columns map onto the model and model outputs onto the result table."""

    inputs: Mapping[str, str]
    """Table column -> model input."""
    outputs: Mapping[str, str]
    """Model output -> result column."""
    passthrough: tuple[str, ...] = ()
    """Input columns copied unchanged into the result row (keys, typically)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))
        object.__setattr__(self, "outputs", MappingProxyType(dict(self.outputs)))
        object.__setattr__(self, "passthrough", tuple(self.passthrough))

    @property
    def columns(self) -> tuple[str, ...]:
        """Every table column the consumer reads: bound inputs, then passthrough ones."""
        bound = tuple(self.inputs)
        return bound + tuple(c for c in self.passthrough if c not in self.inputs)

    @property
    def result_columns(self) -> tuple[str, ...]:
        """The result table's non-reserved columns: passthrough first, then outputs."""
        return self.passthrough + tuple(self.outputs.values())


# --- start-up ----------------------------------------------------------------------------------


def check_binding(spec: ModelSpec, binding: Binding) -> None:
    """Raises :class:`BindingError` listing every way ``binding`` does not fit ``spec``."""
    problems: list[str] = []
    input_names = [t.name for t in spec.inputs]
    output_names = [t.name for t in spec.outputs]
    fed: dict[str, str] = {}
    for column, model_input in binding.inputs.items():
        if model_input not in input_names:
            problems.append(
                f"column {column!r} is bound to model input {model_input!r}, which the model "
                f"does not have (inputs: {input_names})"
            )
        elif model_input in fed:
            problems.append(
                f"model input {model_input!r} is bound to two columns, {fed[model_input]!r} and "
                f"{column!r}"
            )
        else:
            fed[model_input] = column
    problems.extend(
        f"model input {t} is not bound to any column" for t in spec.inputs if t.name not in fed
    )
    if not binding.outputs:
        problems.append(f"no model output is bound to a result column (outputs: {output_names})")
    for model_output in binding.outputs:
        if model_output not in output_names:
            problems.append(
                f"model output {model_output!r} is bound, but the model does not have it "
                f"(outputs: {output_names})"
            )
    seen: set[str] = set()
    for result in binding.result_columns:
        if result in RESERVED_COLUMNS:
            problems.append(
                f"result column {result!r} clashes with a column the consumer writes itself "
                f"({sorted(RESERVED_COLUMNS)})"
            )
        elif result in seen:
            problems.append(f"result column {result!r} appears twice (passthrough and outputs)")
        seen.add(result)
    if problems:
        raise BindingError(spec.name, problems)


# --- per message -------------------------------------------------------------------------------


def _fit_dims(row_shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...] | None:
    """The per-row tensor shape for a column whose rows have ``row_shape``, fed to an input of
    ``dims``; None when they do not fit. A scalar fits ``[]``, ``[1]`` or ``[-1]``."""
    if row_shape in ((), (1,)):
        if dims == ():
            return ()
        return (1,) if dims in ((1,), (-1,)) else None
    if len(row_shape) == len(dims) and all(
        d in (-1, r) for d, r in zip(dims, row_shape, strict=True)
    ):
        return row_shape
    return None


def _row_shape(ctype: ColumnType) -> tuple[int, ...]:
    return (ctype.dim,) if ctype.kind is Kind.VECTOR and ctype.dim is not None else ()


def _expected(tensor: TensorSpec) -> str:
    """The column types that can feed ``tensor``, for messages."""
    names: list[str] = []
    for kind, feeds in _FEEDS.items():
        if tensor.datatype not in feeds:
            continue
        if kind is Kind.VECTOR:
            if len(tensor.dims) == 1:
                dim = tensor.dims[0]
                names.append(f"vector[float32,{dim if dim > 0 else 'any'}]")
        elif _fit_dims((), tensor.dims) is not None:
            names.append(kind.value)
    return " or ".join(names) or "no column type (the consumer cannot feed this input)"


def _check_type(column: str, ctype: ColumnType, tensor: TensorSpec) -> None:
    fits_dims = _fit_dims(_row_shape(ctype), tensor.dims) is not None
    if tensor.datatype not in _FEEDS[ctype.kind] or not fits_dims:
        expected = _expected(tensor)
        raise SchemaMismatch(
            f"column {column!r} ({ctype}) cannot feed model input {tensor}; expected {expected}",
            column=column,
            expected=expected,
            found=str(ctype),
        )


def check_columns(spec: ModelSpec, binding: Binding, types: Mapping[str, ColumnType]) -> None:
    """Raises :class:`SchemaMismatch` for the first bound or passthrough column that is missing
    from ``types`` (a decoded chunk's column types) or whose type cannot feed its input."""
    for column in binding.columns:
        if column not in types:
            model_input = binding.inputs.get(column)
            role = f"model input {model_input!r}" if model_input else "a passthrough column"
            raise SchemaMismatch(
                f"column {column!r} ({role}) is missing; the chunk has {sorted(types)}",
                column=column,
                expected=f"a column named {column!r}",
                found="absent",
                code="missing_column",
            )
    for column, model_input in binding.inputs.items():
        tensor = spec.input(model_input)
        if tensor is None:  # check_binding's job; keep the message clear anyway
            raise BindingError(spec.name, [f"model input {model_input!r} does not exist"])
        _check_type(column, types[column], tensor)


def check_chunk(spec: ModelSpec, binding: Binding, columns: Mapping[str, Column]) -> None:
    """:func:`check_columns` plus the value checks of :func:`build_inputs` (nulls, ranges) for
    one decoded message, so that a bad message is rejected before it joins a batch."""
    check_columns(spec, binding, {name: col.type for name, col in columns.items()})
    for column, model_input in binding.inputs.items():
        col = columns[column]
        tensor = spec.input(model_input)
        assert tensor is not None  # check_columns saw it
        _check_values(column, tensor, col.values, col.nulls)


#: Column-type signatures remembered by a :func:`memoized_check` (a table has one or a few).
MAX_KNOWN_SIGNATURES: Final = 256

_InputPlan = tuple[tuple[str, "np.dtype[Any] | None", bool], ...]
"""Per bound input column, in ``binding.inputs`` order: the column, the dtype its values must
fit (a narrowing cast: ``_check_range``) or None, and whether it is text (``check_text``)."""


def memoized_check(
    spec: ModelSpec,
    binding: Binding,
    full_check: Callable[[DecodedChunk], None],
    also_typed: Sequence[str] = (),
) -> Callable[[DecodedChunk], None]:
    """``full_check`` (a per-message check made of :func:`check_chunk` plus checks on the
    types of ``binding.columns`` and ``also_typed``) with its type checks run once per column
    signature: the types of those columns and the dtype and row shape of the bound inputs'
    arrays. A chunk whose signature passed before gets only the value checks (no nulls, the
    range of a narrowing cast, UTF-8 text); if any of them fails, or the signature is new,
    ``full_check`` runs, so every error (and its wording) is ``full_check``'s own."""
    names = tuple(dict.fromkeys((*binding.columns, *also_typed)))
    inputs = tuple(binding.inputs)
    tensors = {column: spec.input(model_input) for column, model_input in binding.inputs.items()}
    known: dict[tuple[Any, ...], _InputPlan] = {}

    def signature(chunk: DecodedChunk) -> tuple[Any, ...] | None:
        try:
            types = tuple(map(chunk.types.__getitem__, names))
            arrays = tuple(map(chunk.columns.__getitem__, inputs))
        except KeyError:
            return None  # a missing column: full_check says which
        return (*types, *((a.dtype, a.shape[1:]) for a in arrays))

    def plan(chunk: DecodedChunk) -> _InputPlan:
        out = []
        for column in inputs:
            tensor = tensors[column]
            assert tensor is not None  # full_check passed: check_columns saw it
            values = chunk.columns[column]
            dtype = _NUMPY[tensor.datatype][0]
            narrows = dtype.itemsize < values.dtype.itemsize or dtype.kind != values.dtype.kind
            ranged = tensor.datatype != "BYTES" and values.dtype != dtype and narrows
            out.append((column, dtype if ranged else None, tensor.datatype == "BYTES"))
        return tuple(out)

    def values_fit(chunk: DecodedChunk, checks: _InputPlan) -> bool:
        masks, columns = chunk.null_masks, chunk.columns
        try:
            for column, ranged, text in checks:
                if column in masks:
                    return False  # a null: full_check words it
                values = columns[column]
                if ranged is not None:
                    _check_range(column, values, ranged)
                if text:
                    check_text(column, values)
        except SchemaMismatch:
            return False
        return True

    def check(chunk: DecodedChunk) -> None:
        key = signature(chunk)
        checks = known.get(key) if key is not None else None
        if checks is not None and values_fit(chunk, checks):
            return
        full_check(chunk)
        if key is not None and checks is None:
            if len(known) >= MAX_KNOWN_SIGNATURES:
                known.clear()
            known[key] = plan(chunk)

    return check


# --- per batch -----------------------------------------------------------------------------------


def _null_error(column: str, tensor: TensorSpec, nulls: NDArray[np.bool_]) -> SchemaMismatch:
    row = int(np.argmax(nulls))
    return SchemaMismatch(
        f"column {column!r} feeds model input {tensor.name!r} but row {row} is null "
        f"({int(nulls.sum())} null row(s)); model inputs take no nulls",
        column=column,
        expected="no nulls",
        found=f"null at row {row}",
        row=row,
        code="null_not_allowed",
    )


def _check_range(column: str, values: NDArray[Any], dtype: np.dtype[Any]) -> None:
    """Integers out of the target's range, or finite floats that overflow it."""
    if values.size == 0:
        return
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        low, high = int(values.min()), int(values.max())
        if low >= info.min and high <= info.max:
            return
        bad = (values < info.min) | (values > info.max)
        expected = f"{dtype} ({info.min}..{info.max})"
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            narrowed = values.astype(dtype)
        bad = np.isinf(narrowed) & np.isfinite(values)
        if not bad.any():
            return
        expected = f"{dtype} range"
    index = tuple(int(i) for i in np.argwhere(bad)[0])
    raise SchemaMismatch(
        f"column {column!r}: value {values[index]!r} at row {index[0]} does not fit {expected}",
        column=column,
        expected=expected,
        found=repr(values[index]),
        row=index[0],
        code="invalid_value",
    )


def _fit(
    column: str, tensor: TensorSpec, values: NDArray[Any], nulls: NDArray[np.bool_] | None
) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The dtype and shape ``(rows, *dims)`` that ``values`` (one entry per row) take as
    ``tensor``, after the checks every value passes (no nulls, integers and floats in range)."""
    if nulls is not None and nulls.any():
        raise _null_error(column, tensor, nulls)
    known = _NUMPY.get(tensor.datatype)
    dims = _fit_dims(tuple(values.shape[1:]), tensor.dims)
    if known is None or values.dtype.kind not in known[1] or dims is None:
        raise SchemaMismatch(
            f"column {column!r} (numpy {values.dtype} {list(values.shape[1:])} per row) cannot "
            f"feed model input {tensor}",
            column=column,
            expected=str(tensor),
            found=f"{values.dtype} {list(values.shape[1:])}",
        )
    dtype = known[0]
    narrows = dtype.itemsize < values.dtype.itemsize or dtype.kind != values.dtype.kind
    if tensor.datatype != "BYTES" and values.dtype != dtype and narrows:
        _check_range(column, values, dtype)
    return dtype, (values.shape[0], *dims)


def _check_values(
    column: str, tensor: TensorSpec, values: NDArray[Any], nulls: NDArray[np.bool_] | None
) -> None:
    """Raises :class:`SchemaMismatch` where :func:`_to_input` would, without building it."""
    _fit(column, tensor, values, nulls)
    if tensor.datatype == "BYTES":
        check_text(column, values)


def _to_input(
    column: str, tensor: TensorSpec, values: NDArray[Any], nulls: NDArray[np.bool_] | None
) -> Any:
    """``values`` (one entry per row) as the ``InferInput`` for ``tensor``."""
    dtype, shape = _fit(column, tensor, values, nulls)
    if tensor.datatype == "BYTES":
        return bytes_input(tensor.name, list(shape), serialize_text(column, values))
    data = np.ascontiguousarray(values.astype(dtype, copy=False).reshape(shape))
    infer_input = grpcclient.InferInput(tensor.name, list(shape), tensor.datatype)
    infer_input.set_data_from_numpy(data)
    return infer_input


def build_inputs(
    spec: ModelSpec,
    binding: Binding,
    columns: Mapping[str, NDArray[Any]],
    nulls: Mapping[str, NDArray[np.bool_] | None] | None = None,
) -> list[Any]:
    """One ``tritonclient.grpc.InferInput`` per model input, in the model's order, from one
    batch's columns (canonical numpy form, see :mod:`wire.columns`; every array has one
    entry per row). ``nulls`` maps a column to its null mask (``True`` = null), as
    ``Column.nulls``. Raises :class:`SchemaMismatch` for a null in an input column, a value
    the input's datatype cannot hold, or an array that cannot feed the input."""
    by_input = {model_input: column for column, model_input in binding.inputs.items()}
    masks = nulls or {}
    rows: int | None = None
    out: list[Any] = []
    for tensor in spec.inputs:
        column = by_input.get(tensor.name)
        if column is None or column not in columns:
            raise SchemaMismatch(
                f"no column for model input {tensor} (bound column: {column!r})",
                column=str(column),
                expected=f"a column feeding {tensor.name!r}",
                found="absent",
            )
        values = columns[column]
        if rows is None:
            rows = values.shape[0]
        elif values.shape[0] != rows:
            raise ValueError(
                f"column {column!r} has {values.shape[0]} rows, the others {rows} rows"
            )
        out.append(_to_input(column, tensor, values, masks.get(column)))
    return out
