"""Building one batch's model inputs: the batch's arrays become ``InferInput`` tensors in the
model's order (:func:`build_inputs`); nulls in an input column, values the model's datatype
cannot hold, or arrays of the wrong shape raise :class:`SchemaMismatch`. Text becomes a BYTES
tensor once per batch (:mod:`rowbatch.consumer.model.text_tensor`). The same value checks run per
message in :mod:`rowbatch.consumer.model.chunk_check`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import numpy as np
import tritonclient.grpc as grpcclient
from numpy.typing import NDArray

from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.model.text_tensor import bytes_input, check_text, serialize_text

#: numpy dtype of each datatype a column can feed, and the array dtype kinds accepted for it.
NUMPY_DTYPES: Final[Mapping[str, tuple[np.dtype[Any], str]]] = MappingProxyType(
    {
        "BYTES": (np.dtype(object), "OUS"),
        "INT64": (np.dtype(np.int64), "iu"),
        "INT32": (np.dtype(np.int32), "iu"),
        "FP32": (np.dtype(np.float32), "f"),
        "FP64": (np.dtype(np.float64), "f"),
        "BOOL": (np.dtype(np.bool_), "b"),
    }
)


def fit_dims(row_shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...] | None:
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


def check_range(column: str, values: NDArray[Any], dtype: np.dtype[Any]) -> None:
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
    known = NUMPY_DTYPES.get(tensor.datatype)
    dims = fit_dims(tuple(values.shape[1:]), tensor.dims)
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
        check_range(column, values, dtype)
    return dtype, (values.shape[0], *dims)


def check_values(
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
    batch's columns (canonical numpy form, see :mod:`rowbatch.wire.columns`; every array has one
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
