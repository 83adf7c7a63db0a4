"""The figures of ``rowbatch-consumer compare``: a shadow rollout's comparison table (the
production and the candidate model's answers to the same rows) reduced to frozen values that
:mod:`.compare_report` prints.

The outputs compared are the table's columns ``X`` with an ``X__candidate`` beside them, each
on the rows where both answers are there (a failed candidate leaves its columns NULL):
integers, bools and text exactly (*class* outputs: a confusion table and the rows that
flipped); floats (*numeric*) and vectors (*vector*) within a tolerance,
``|candidate - production| <= atol + rtol * |production|`` (element by element for vectors; NaN
agrees with NaN only), with the difference's quantiles and histogram (numeric) or each row's
largest element difference and cosine similarity (vector)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from rowbatch.consumer.rollout.compare_values import (
    Comparison,
    Confusion,
    Differing,
    Floats,
    Histogram,
    Kind,
    NotComparable,
    OutputFigures,
    Quantiles,
    Tolerance,
    VersionFigures,
)
from rowbatch.consumer.rollout.comparison import (
    CANDIDATE_ERROR,
    CANDIDATE_LATENCY,
    CANDIDATE_SUFFIX,
    LATENCY,
    PRODUCTION_VERSION,
)

KEYS: Final = ("chunk_id", "row_index")
_CANDIDATE: Final = (CANDIDATE_LATENCY, CANDIDATE_ERROR, "model_name", "model_version")
LAYOUT: Final = (*KEYS, PRODUCTION_VERSION, LATENCY, *_CANDIDATE)
"""The columns every comparison table has besides the outputs and passthrough ones."""
_NOT_PASSTHROUGH: Final = frozenset({*LAYOUT, "source_message_id", "processed_at"})
TOP_ERRORS: Final = 10
TOP_PAIRS: Final = 20
MATRIX_VALUES: Final = 10
"""A confusion table keeps every pair when each side has at most this many values."""
BINS: Final = 16


def output_names(columns: list[str]) -> list[str]:
    """The compared outputs: ``X`` for every ``X__candidate`` whose ``X`` is a column too."""
    present = set(columns)
    return [
        c.removesuffix(CANDIDATE_SUFFIX)
        for c in columns
        if c.endswith(CANDIDATE_SUFFIX) and c[: -len(CANDIDATE_SUFFIX)] in present
    ]


def check_layout(columns: list[str]) -> list[str]:
    """The compared outputs (:func:`output_names`); :class:`NotComparable` if ``columns``
    are not a comparison table's."""
    outputs = output_names(columns)
    lacking = [c for c in LAYOUT if c not in columns]
    if not outputs or lacking:
        why = f"it lacks {', '.join(lacking)}" if lacking else "no column ends in "
        raise NotComparable(f"not a comparison table: {why}{'' if lacking else CANDIDATE_SUFFIX}")
    return outputs


def compare_table(
    table: pa.Table, tolerances: Mapping[str, Tolerance], *, flipped: int = 20
) -> Comparison:
    """The comparison's figures (``tolerances``: by numeric or vector output; the others get
    :class:`Tolerance`'s defaults); :class:`NotComparable` if the table lacks the layout."""
    names = list(table.column_names)
    outputs = check_layout(names)
    table = table.sort_by([(k, "ascending") for k in KEYS])
    kinds = {name: _kind(table.schema.field(name).type) for name in outputs}
    for name in tolerances:
        if kinds.get(name) in (None, "class"):
            numeric = [n for n, k in kinds.items() if k != "class"]
            raise NotComparable(
                f"--tolerance {name}: not a float or vector output of the table (those: "
                f"{', '.join(numeric) or 'none'}; integers, bools and text compare exactly)"
            )
    derived = {*outputs, *(f"{o}{CANDIDATE_SUFFIX}" for o in outputs)}
    passthrough = [n for n in names if n not in _NOT_PASSTHROUGH | derived]
    keys = (*KEYS, *passthrough)
    error = _values(table.column(CANDIDATE_ERROR))[0]
    failed = np.array([e is not None for e in error], dtype=bool)
    messages = Counter(e for e in error.tolist() if e is not None)
    return Comparison(
        rows=table.num_rows,
        candidate_failed=int(failed.sum()),
        errors=tuple(sorted(messages.items(), key=lambda m: (-m[1], m[0]))[:TOP_ERRORS]),
        distinct_errors=len(messages),
        versions=_versions(table, failed),
        key_columns=keys,
        outputs=tuple(
            _output(table, o, kinds[o], tolerances.get(o, Tolerance()), keys, flipped)
            for o in outputs
        ),
    )


def _kind(kind: pa.DataType) -> Kind:
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind):
        return "vector"
    return "numeric" if pa.types.is_floating(kind) else "class"


def _type_name(kind: pa.DataType, dim: int = 0) -> str:
    """``float32``, ``int64``, ``string``; a vector ``float32[384]``."""
    if pa.types.is_list(kind) or pa.types.is_fixed_size_list(kind):
        return f"{_type_name(kind.value_type)}[{dim}]"
    if pa.types.is_floating(kind) or pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return str(np.dtype(kind.to_pandas_dtype()).name)
    return str(kind)


def _values(column: pa.ChunkedArray) -> tuple[NDArray[Any], NDArray[np.bool_]]:
    """The column as numpy (vectors 2-D, floats as float64, text as objects; nulls 0, False,
    None) and its null mask."""
    array = column.combine_chunks()
    null = np.asarray(array.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    kind = array.type
    if _kind(kind) == "vector":
        valid = array.filter(pa.array(~null))
        lengths = set(valid.value_lengths().to_pylist()) if len(valid) else {0}
        if len(lengths) != 1:
            raise NotComparable(f"vectors of several lengths ({sorted(lengths)}) in one column")
        dim = lengths.pop()
        flat = valid.flatten().to_numpy(zero_copy_only=False).astype(np.float64)
        out = np.zeros((len(array), dim), dtype=np.float64)
        out[~null] = flat.reshape(len(valid), dim)
        return out, null
    if pa.types.is_floating(kind):
        return array.fill_null(0).to_numpy().astype(np.float64), null
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return array.fill_null(False if pa.types.is_boolean(kind) else 0).to_numpy(), null
    return np.array(array.to_pylist(), dtype=object), null


def _output(
    table: pa.Table, name: str, kind: Kind, tolerance: Tolerance, keys: tuple[str, ...], n: int
) -> OutputFigures:
    production, p_null = _values(table.column(name))
    candidate, c_null = _values(table.column(f"{name}{CANDIDATE_SUFFIX}"))
    both = ~(p_null | c_null)
    rows = np.flatnonzero(both)
    p, c = production[both], candidate[both]
    if p.shape[1:] != c.shape[1:]:  # vectors: one side has none (all NULL), or another length
        if len(rows):
            raise NotComparable(f"{name}: vectors of {p.shape[1]} and {c.shape[1]} elements")
        c = p
    dim = production.shape[1] if production.ndim == 2 else 0
    missing = table.num_rows - len(rows)
    head = (name, kind, _type_name(table.schema.field(name).type, dim), len(rows), missing)
    if kind == "class":
        same = np.asarray(p == c, dtype=bool)
        apart = np.flatnonzero(~same)[:n]
        shown = zip(
            _keys(table, keys, rows[apart]), p[apart].tolist(), c[apart].tolist(), strict=True
        )
        return OutputFigures(
            *head,
            agree=int(same.sum()),
            differing=tuple(Differing(key, pv, cv) for key, pv, cv in shown),
            confusion=_confusion(p.tolist(), c.tolist()),
        )
    diff = c - p
    within = (np.abs(diff) <= tolerance.atol + tolerance.rtol * np.abs(p)) | (
        np.isnan(p) & np.isnan(c)
    )
    size = np.where(np.isnan(diff), np.inf, np.abs(diff))  # NaN against a number: first
    vector = kind == "vector"
    if vector:
        within, size, cosine = within.all(axis=1), size.max(axis=1, initial=0.0), _cosine(p, c)
    apart = np.flatnonzero(~within)
    apart = apart[np.argsort(-size[apart], kind="stable")][:n]
    return OutputFigures(
        *head,
        agree=int(within.sum()),
        differing=tuple(
            Differing(key, None, None, float(size[i]), float(cosine[i]))
            if vector
            else Differing(key, float(p[i]), float(c[i]), float(size[i]))
            for key, i in zip(_keys(table, keys, rows[apart]), apart.tolist(), strict=True)
        ),
        tolerance=tolerance,
        difference=None if vector else _quantiles(diff),
        abs_difference=_quantiles(size),
        cosine=_quantiles(cosine) if vector else None,
        histogram=None if vector else _histogram(diff),
    )


def _cosine(p: Floats, c: Floats) -> Floats:
    """Each row's cosine similarity: 1 when both vectors are zero, 0 when one is."""
    p_norm, c_norm = np.linalg.norm(p, axis=1), np.linalg.norm(c, axis=1)
    norms = p_norm * c_norm
    dot = np.einsum("ij,ij->i", p, c)
    cosine = np.where(norms > 0, dot / np.where(norms > 0, norms, 1.0), 1.0 * (p_norm == c_norm))
    return np.clip(np.asarray(cosine, dtype=np.float64), -1.0, 1.0)  # rounding past 1


def _keys(table: pa.Table, keys: tuple[str, ...], rows: NDArray[np.intp]) -> list[tuple[Any, ...]]:
    picked = pa.array(rows, type=pa.int64())
    columns = [table.column(k).take(picked).to_pylist() for k in keys]
    return list(zip(*columns, strict=True)) if columns else []


def _confusion(production: list[Any], candidate: list[Any]) -> Confusion:
    counts = Counter(zip(production, candidate, strict=True))
    pairs = sorted(counts.items(), key=lambda pc: (-pc[1], str(pc[0][0]), str(pc[0][1])))
    small = max(len(set(production)), len(set(candidate))) <= MATRIX_VALUES
    kept = pairs if small else pairs[:TOP_PAIRS]
    return Confusion(tuple((pv, cv, k) for (pv, cv), k in kept), len(pairs))


def _quantiles(values: Floats) -> Quantiles | None:
    finite = values[np.isfinite(values)]
    if not finite.size:
        return None
    p50, p90, p99 = (float(q) for q in np.quantile(finite, [0.5, 0.9, 0.99]))
    return Quantiles(float(finite.min()), p50, p90, p99, float(finite.max()))


def _histogram(diff: Floats) -> Histogram | None:
    finite = diff[np.isfinite(diff)]
    if not finite.size:
        return None
    counts, edges = np.histogram(finite, bins=BINS)
    return Histogram(tuple(float(e) for e in edges), tuple(int(k) for k in counts))


def _versions(table: pa.Table, failed: NDArray[np.bool_]) -> tuple[VersionFigures, ...]:
    names = (PRODUCTION_VERSION, "model_name", "model_version")
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, group in enumerate(zip(*(table.column(n).to_pylist() for n in names), strict=True)):
        groups.setdefault(group, []).append(i)
    times = _values(table.column(LATENCY))
    candidate_times = _values(table.column(CANDIDATE_LATENCY))

    def figures(group: tuple[Any, ...]) -> VersionFigures:
        rows = np.array(groups[group], dtype=np.intp)
        latencies = [_quantiles(v[rows][~null[rows]]) for v, null in (times, candidate_times)]
        production, model, version = group
        return VersionFigures(
            production, model, version, len(rows), int(failed[rows].sum()), *latencies
        )

    return tuple(figures(g) for g in sorted(groups, key=lambda g: tuple(map(str, g))))
