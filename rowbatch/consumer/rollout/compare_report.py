"""``rowbatch-consumer compare``'s report: a :class:`~.compare.Comparison` as aligned text
tables (numbers right-aligned, a ``#`` histogram of each numeric output's difference) and as
JSON holding the same figures."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Final

from rowbatch.consumer.rollout.compare import (
    MATRIX_VALUES,
)
from rowbatch.consumer.rollout.compare_values import (
    Comparison,
    Differing,
    OutputFigures,
    Quantiles,
)

BAR: Final = 40
"""Width of the histogram's longest bar."""
CELL: Final = 40
"""Longest text shown in a cell (a key, a text output's value)."""
_QUANTILES: Final = ("min", "p50", "p90", "p99", "max")


def report_lines(comparison: Comparison, where: str) -> list[str]:
    """The report (``where``: the table and its store, as the header names them)."""
    c = comparison
    failed = c.candidate_failed
    lines = [
        f"comparison table {where}",
        f"{_n(c.rows, 'row')} compared; the candidate failed on {failed} "
        f"({_share(failed, c.rows)})",
    ]
    if c.errors:
        shown = "" if len(c.errors) == c.distinct_errors else f", the {len(c.errors)} most common"
        lines += [
            "",
            f"candidate errors: {_n(failed, 'row')}, {_n(c.distinct_errors, 'message')}{shown}",
        ]
        lines += _table(("rows", "message"), [(str(k), _cell(m)) for m, k in c.errors])
    lines += ["", "versions (latency_ms: the production request's; candidate_ms: the candidate's)"]
    head = (
        "production",
        "candidate",
        "rows",
        "failed",
        "latency_ms p50",
        "p99",
        "candidate_ms p50",
        "p99",
    )
    lines += _table(
        head,
        [
            (
                _cell(v.production_version),
                f"{_cell(v.candidate_model)}:{_cell(v.candidate_version)}",
                str(v.rows),
                str(v.candidate_failed),
                *_latency(v.latency_ms),
                *_latency(v.candidate_latency_ms),
            )
            for v in c.versions
        ],
    )
    for output in c.outputs:
        lines += ["", *_output_lines(output, c.key_columns)]
    return lines


def _output_lines(o: OutputFigures, keys: tuple[str, ...]) -> list[str]:
    tolerance = (
        "" if o.tolerance is None else f", atol {o.tolerance.atol:g} rtol {o.tolerance.rtol:g}"
    )
    lines = [
        f"output {o.name}: {o.kind} ({o.type}){tolerance}",
        f"  agreement {_share(o.agree, o.compared)}: {o.agree} of {o.compared} rows with both "
        f"answers ({o.missing} without)",
    ]
    figures = [
        ("candidate - production", o.difference),
        (
            "|candidate - production|" if o.kind == "numeric" else "largest |c - p| of a row",
            o.abs_difference,
        ),
        ("cosine similarity", o.cosine),
    ]
    body = [(label, *_quantiles(q)) for label, q in figures if q is not None]
    if body:
        lines += _table(("", *_QUANTILES), body)
    if o.histogram is not None:
        h = o.histogram
        top = max(h.counts) or 1
        lines.append(f"  candidate - production, {len(h.counts)} bins:")
        bars = [
            (_num(lo), "..", _num(hi), str(k), "#" * (max(1, round(BAR * k / top)) if k else 0))
            for lo, hi, k in zip(h.edges, h.edges[1:], h.counts, strict=False)
        ]
        lines += _table(("from", "", "to", "rows", ""), bars, indent="    ")
    if o.confusion is not None:
        lines += _confusion_lines(o)
    if o.differing_total:
        what = "flipped" if o.kind == "class" else "outside the tolerance"
        order = "in key order" if o.kind == "class" else "largest |difference| first"
        shown = len(o.differing)
        lines.append(
            f"  {_n(o.differing_total, 'row')} {what}"
            + (f", {shown} shown ({order}):" if shown else "")
        )
        if shown:
            values = ("production", "candidate") if o.kind != "vector" else ()
            extra = {
                "class": (),
                "numeric": ("|difference|",),
                "vector": ("largest |c - p|", "cosine"),
            }
            lines += _table(
                (*keys, *values, *extra[o.kind]),
                [_differing_cells(d, o) for d in o.differing],
                indent="    ",
            )
    return lines


def _differing_cells(d: Differing, o: OutputFigures) -> tuple[str, ...]:
    keys = tuple(_cell(k) for k in d.key)
    if o.kind == "class":
        return (*keys, _cell(d.production), _cell(d.candidate))
    if o.kind == "numeric":
        return (*keys, _num(d.production), _num(d.candidate), _num(d.abs_difference))
    return (*keys, _num(d.abs_difference), _num(d.cosine))


def _confusion_lines(o: OutputFigures) -> list[str]:
    assert o.confusion is not None
    pairs = o.confusion.pairs
    production = sorted({p for p, _, _ in pairs}, key=str)
    candidate = sorted({c for _, c, _ in pairs}, key=str)
    if o.confusion.complete and max(len(production), len(candidate)) <= MATRIX_VALUES:
        counts = {(p, c): k for p, c, k in pairs}
        lines = ["  confusion (rows: the production value; columns: the candidate's):"]
        return lines + _table(
            ("", *(_cell(c) for c in candidate)),
            [(_cell(p), *(str(counts.get((p, c), 0)) for c in candidate)) for p in production],
            indent="    ",
        )
    lines = [f"  confusion: the {len(pairs)} most common of {o.confusion.distinct} pairs"]
    return lines + _table(
        ("production", "candidate", "rows"),
        [(_cell(p), _cell(c), str(k)) for p, c, k in pairs],
        indent="    ",
    )


def _table(head: tuple[str, ...], body: Sequence[tuple[str, ...]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; a column of numbers (or ``-``) right-aligned."""
    rows = [head, *body]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = [bool(body) and all(_numeric(r[i]) for r in body) for i in range(len(head))]
    return [
        indent
        + "  ".join(
            cell.rjust(w) if r else cell.ljust(w)
            for cell, w, r in zip(row, widths, right, strict=True)
        ).rstrip()
        for row in rows
    ]


def _numeric(cell: str) -> bool:
    try:
        float(cell.removesuffix("%"))
    except ValueError:
        return cell == "-"
    return True


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f}%" if whole else "-"


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = value.hex() if isinstance(value, bytes) else str(value)
    return text if len(text) <= CELL else text[: CELL - 3] + "..."


def _quantiles(q: Quantiles | None) -> tuple[str, ...]:
    return tuple(_num(None if q is None else getattr(q, name)) for name in _QUANTILES)


def _latency(q: Quantiles | None) -> tuple[str, str]:
    return (_num(None), _num(None)) if q is None else (_num(q.p50), _num(q.p99))


# --- JSON ----------------------------------------------------------------------------------------


def report_json(comparison: Comparison, table: str, store: str) -> dict[str, Any]:
    """The report's figures (every float finite or ``null``; bytes as hex)."""
    c = comparison
    found: dict[str, Any] = _plain(
        {
            "table": table,
            "store": store,
            "rows": c.rows,
            "candidate_failed": c.candidate_failed,
            "candidate_errors": {
                "distinct": c.distinct_errors,
                "most_common": [{"message": m, "rows": k} for m, k in c.errors],
            },
            "versions": [asdict(v) for v in c.versions],
            "key_columns": list(c.key_columns),
            "outputs": [_output_json(o, c.key_columns) for o in c.outputs],
        }
    )
    return found


def _output_json(o: OutputFigures, keys: tuple[str, ...]) -> dict[str, Any]:
    """The output's figures (those of its kind only); the rows that differ by their keys."""
    out = {k: v for k, v in asdict(o).items() if v is not None and k not in ("differing",)}
    out["agreement"] = o.agreement
    if o.confusion is not None:
        pairs = o.confusion.pairs
        out["confusion"] = {
            "distinct_pairs": o.confusion.distinct,
            "pairs": [{"production": p, "candidate": c, "rows": k} for p, c, k in pairs],
        }
    rows = [
        dict(zip(keys, d.key, strict=True))
        | {k: v for k, v in asdict(d).items() if k != "key" and v is not None}
        for d in o.differing
    ]
    what = "flipped" if o.kind == "class" else "outside_tolerance"
    out[what] = {"total": o.differing_total, "rows": rows}
    return out


def _plain(value: Any) -> Any:
    """``value`` with JSON's types only: non-finite floats ``None``, bytes hex, tuples lists."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, bytes):
        return value.hex()
    return value
