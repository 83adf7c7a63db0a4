"""Canonical columns -> the JSON payload (:func:`encode_json`): floats in their shortest text
that reads back the same, non-finite floats as strings, bytes as base64."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from numpy.typing import NDArray

from rowbatch.wire.columns.canonical import Column, has_surrogate
from rowbatch.wire.columns.column_type import Kind
from rowbatch.wire.errors import InvalidValue


def _float_list(values: NDArray[Any]) -> list[Any]:
    """Python floats (nested for 2-D) with shortest round-trip text; non-finite as strings."""
    if values.dtype == np.float32:
        # float32 -> shortest decimal -> float64: its repr is the short text ("0.1", not
        # "0.10000000149011612"). A reader parses it as float64 and narrows it to float32; where
        # that double rounding would not give the same float32 back, keep the exact value.
        with np.errstate(all="ignore"):
            short = values.astype(str).astype(np.float64)
            exact = short.astype(np.float32) == values
        exact |= np.isnan(values)
        if not exact.all():
            short[~exact] = values[~exact]
        values = short
    out = cast("list[Any]", values.tolist())
    if not np.isfinite(values).all():
        if values.ndim == 1:
            out = [x if math.isfinite(x) else _nonfinite_text(x) for x in out]
        else:
            for i in np.flatnonzero(~np.isfinite(values).all(axis=1)).tolist():
                out[i] = [x if math.isfinite(x) else _nonfinite_text(x) for x in out[i]]
    return out


def _nonfinite_text(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    return "Infinity" if x > 0 else "-Infinity"


def _json_values(col: Column) -> list[Any]:
    kind = col.type.kind
    values: list[Any]
    if kind in (Kind.FLOAT32, Kind.FLOAT64, Kind.VECTOR):
        values = _float_list(col.values)
    elif kind is Kind.BYTES:
        values = [None if v is None else base64.b64encode(v).decode("ascii") for v in col.values]
    else:
        values = cast("list[Any]", col.values.tolist())
    if col.nulls is not None and kind not in (Kind.STRING, Kind.BYTES):
        for i in np.flatnonzero(col.nulls).tolist():
            values[i] = None
    return values


def encode_json(columns: Sequence[Column]) -> bytes:
    entries: list[dict[str, Any]] = []
    for col in columns:
        entry: dict[str, Any] = {"name": col.name, "type": col.type.kind.value}
        if col.type.kind is Kind.VECTOR:
            entry["dim"] = col.type.dim
        entry["values"] = _json_values(col)
        entries.append(entry)
    text = json.dumps(
        {"columns": entries}, ensure_ascii=False, separators=(",", ":"), allow_nan=False
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _unencodable(columns, exc) from exc


def _unencodable(columns: Sequence[Column], exc: UnicodeEncodeError) -> InvalidValue:
    for col in columns:
        bad_name = has_surrogate(col.name)
        if bad_name or col.type.kind is Kind.STRING:
            rows = [] if bad_name else [i for i, v in enumerate(col.values) if has_surrogate(v)]
            if bad_name or rows:
                where = "its name" if bad_name else f"row {rows[0]}"
                return InvalidValue(
                    f"column {col.name!r}: {where} is not encodable as UTF-8 ({exc.reason})",
                    column=col.name,
                    expected="valid Unicode text",
                    found=where,
                )
    return InvalidValue(f"chunk is not encodable as UTF-8: {exc}")
