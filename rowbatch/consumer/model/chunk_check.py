"""The per-message check of a decoded chunk against the binding: its column types against the
bound inputs (:func:`check_columns`), plus the value checks of tensor building
(:func:`check_chunk`), so a bad message is poisoned alone before it joins a batch;
:func:`memoized_check` runs the type checks once per column signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final

import numpy as np

from rowbatch.consumer.model.binding import Binding, BindingError
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.model.tensors import NUMPY_DTYPES, check_range, check_values, fit_dims
from rowbatch.consumer.model.text_tensor import check_text
from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.columns.column_type import ColumnType, Kind

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
        elif fit_dims((), tensor.dims) is not None:
            names.append(kind.value)
    return " or ".join(names) or "no column type (the consumer cannot feed this input)"


def _check_type(column: str, ctype: ColumnType, tensor: TensorSpec) -> None:
    fits_dims = fit_dims(_row_shape(ctype), tensor.dims) is not None
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
        check_values(column, tensor, col.values, col.nulls)


#: Column-type signatures remembered by a :func:`memoized_check` (a table has one or a few).
MAX_KNOWN_SIGNATURES: Final = 256

_InputPlan = tuple[tuple[str, "np.dtype[Any] | None", bool], ...]
"""Per bound input column, in ``binding.inputs`` order: the column, the dtype its values must
fit (a narrowing cast: ``check_range``) or None, and whether it is text (``check_text``)."""


def _values_fit(chunk: DecodedChunk, checks: _InputPlan) -> bool:
    """Whether the chunk's values pass the value checks of its signature's plan."""
    masks, columns = chunk.null_masks, chunk.columns
    try:
        for column, ranged, text in checks:
            if column in masks:
                return False  # a null: the full check words it
            values = columns[column]
            if ranged is not None:
                check_range(column, values, ranged)
            if text:
                check_text(column, values)
    except SchemaMismatch:
        return False
    return True


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
    # The last chunk's types mapping and signature: chunks read by one Arrow layout share
    # their types mapping, and their arrays' dtypes and row shapes are the layout's, so the
    # same mapping (held here, so its id cannot be reused) means the same signature.
    # With it, that signature's value checks once found (so a layout's chunks skip hashing
    # the signature to look them up).
    last: list[Any] = [None, None, None]

    def signature(chunk: DecodedChunk) -> tuple[Any, ...] | None:
        types_of = chunk.types
        if types_of is last[0]:
            return last[1]  # type: ignore[no-any-return]
        key = _signature(chunk)
        if chunk.shared_types:
            last[:] = [types_of, key, None]
        return key

    def _signature(chunk: DecodedChunk) -> tuple[Any, ...] | None:
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
            dtype = NUMPY_DTYPES[tensor.datatype][0]
            narrows = dtype.itemsize < values.dtype.itemsize or dtype.kind != values.dtype.kind
            ranged = tensor.datatype != "BYTES" and values.dtype != dtype and narrows
            out.append((column, dtype if ranged else None, tensor.datatype == "BYTES"))
        return tuple(out)

    def lookup(chunk: DecodedChunk) -> _InputPlan | None:
        """The value checks of the chunk's signature; None when the signature is new (then
        ``full_check`` ran, and the plan for the next ones is made) or cannot be made."""
        key = signature(chunk)
        if key is None:
            full_check(chunk)
            return None
        checks = known.get(key)
        if checks is None:
            full_check(chunk)
            if len(known) >= MAX_KNOWN_SIGNATURES:
                known.clear()
            known[key] = plan(chunk)
        if chunk.types is last[0]:
            last[2] = known[key]
        return checks

    def check(chunk: DecodedChunk) -> None:
        # The last layout's chunks: their plan without hashing their signature.
        checks = last[2] if chunk.types is last[0] else None
        if checks is None:
            checks = lookup(chunk)
        if checks is not None and not _values_fit(chunk, checks):
            full_check(chunk)

    return check


def check_passthrough(chunk: DecodedChunk, passthrough: Mapping[str, ColumnType]) -> None:
    """Raises :class:`SchemaMismatch` naming the first passthrough column whose type is not
    the configured one."""
    for name, want in passthrough.items():
        got = chunk.types[name]
        if got != want:
            raise SchemaMismatch(
                f"passthrough column {name!r} is {got}, configured as {want}",
                column=name,
                expected=str(want),
                found=str(got),
            )
