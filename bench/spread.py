"""The figures of a run, by name, and their spread over repeated runs (``python -m bench
--repeat N``): each section's JSON form (``dataclasses.asdict`` of its result) flattened into
``{"<section> <case>: <what>": value}``, then the median, least and greatest value of each over
the runs. Works on the JSON a recorded run keeps, so a figure cited in the README can be traced
back to the file (``bench/cite.py``)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Figures = dict[str, float]


@dataclass(frozen=True)
class Spread:
    """One figure over the runs that had it."""

    median: float
    low: float
    high: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values), tuple(values))


def _put(out: Figures, name: str, value: object) -> None:
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        out[name] = float(value)


def _naive(section: Mapping[str, Any], out: Figures) -> None:
    for run in section.get("runs", ()):
        case = f"naive {run['broker']} {run['rows_per_message']}-row"
        _put(out, f"{case}: naive rows/s", run.get("rows_per_s"))
        _put(out, f"{case}: rowbatch rows/s", run.get("rowbatch_rows_per_s"))
        _put(out, f"{case}: speed-up", run.get("speedup"))


def _table(section: Mapping[str, Any], out: Figures) -> None:
    _put(out, "table: measured ceiling rows/s", section.get("measured_ceiling"))
    for w in section.get("ways", ()):
        for key, what in (
            ("rows_per_s", "rows/s"),
            ("of_measured", "of measured ceiling"),
            ("busy", "server busy"),
            ("mean_batch", "rows per execution"),
            ("cpu_us_per_row", "consumer CPU us/row"),
            ("peak_rss_mib", "peak RSS MiB"),
        ):
            _put(out, f"table {w['way']}: {what}", w.get(key))


def _saturation(section: Mapping[str, Any], out: Figures) -> None:
    for probe in section.get("probes", ()):
        model = probe.get("model", "fixed_latency")
        _put(out, f"saturation {probe['broker']} {model}: measured ceiling rows/s",
             probe["probe"]["rows_per_s"])  # fmt: skip
    for c in section.get("cases", ()):
        model = c.get("model", "fixed_latency")
        load = "backlog" if c["load"] is None else f"{c['load']:.0%} load"
        case = f"saturation {c['broker']} {model} {c['rows_per_message']}-row {c['sink']} {load}"
        for key, what in (
            ("rows_per_s", "rows/s"),
            ("of_measured", "of measured ceiling"),
            ("busy", "server busy"),
            ("mean_batch", "rows per execution"),
            ("cpu_us_per_row", "consumer CPU us/row"),
            ("peak_rss_mib", "peak RSS MiB"),
            ("reference_rows_per_s", "reference rows/s"),
            ("speedup", "x reference"),
            ("p99_ms", "p99 ms"),
            ("p99_bound_ms", "p99 bound ms"),
        ):
            _put(out, f"{case}: {what}", c.get(key))
        if c.get("keeps_up") is not None:
            out[f"{case}: keeps up"] = 1.0 if c["keeps_up"] else 0.0


def _e2e(section: Mapping[str, Any], out: Figures) -> None:
    for run in section.get("runs", ()):
        case = f"e2e {run['broker']} -> {run['sink']} {run['model']}"
        _put(out, f"{case}: rows/s", run.get("rows_per_s"))
        _put(out, f"{case}: of ceiling", run.get("ceiling_ratio"))


def _overhead(section: Mapping[str, Any], out: Figures) -> None:
    for case in section.get("cases", ()):
        _put(out, f"overhead {case['encoding']} {case['kind']}: CPU us/row", case.get("us_per_row"))


def _latency(section: Mapping[str, Any], out: Figures) -> None:
    for run in section.get("runs", ()):
        case = f"latency {run['load']:.0%} load"
        for key in ("p50_ms", "p99_ms", "batch_fill"):
            _put(out, f"{case}: {key}", run.get(key))


def _scaling(section: Mapping[str, Any], out: Figures) -> None:
    for run in section.get("runs", ()):
        flight = run.get("max_in_flight")
        case = f"scaling {run['broker']} {run['processes']} proc" + (
            "" if flight is None else f" {flight} in flight"
        )
        _put(out, f"{case}: rows/s", run.get("rows_per_s"))
        _put(out, f"{case}: server busy", run.get("busy"))


def _generic(name: str) -> Callable[[Mapping[str, Any], Figures], None]:
    """A section with no extractor of its own: its top-level numbers, and the numbers of each
    item of its top-level lists (named by the item's string fields)."""

    def extract(section: Mapping[str, Any], out: Figures) -> None:
        for key, value in section.items():
            if isinstance(value, list | tuple):
                for i, item in enumerate(value):
                    if not isinstance(item, Mapping):
                        continue
                    label = " ".join(str(v) for v in item.values() if isinstance(v, str)) or str(i)
                    for field, number in item.items():
                        _put(out, f"{name} {key} {label}: {field}", number)
            else:
                _put(out, f"{name}: {key}", value)

    return extract


EXTRACTORS: dict[str, Callable[[Mapping[str, Any], Figures], None]] = {
    "naive": _naive,
    "saturation": _saturation,
    "table": _table,
    "e2e": _e2e,
    "overhead": _overhead,
    "latency": _latency,
    "scaling": _scaling,
}


def figures(sections: Mapping[str, Mapping[str, Any]]) -> Figures:
    """Every named figure of one run's sections (their JSON form)."""
    out: Figures = {}
    for name, section in sections.items():
        EXTRACTORS.get(name, _generic(name))(section, out)
    return out


def spread(runs: Iterable[Mapping[str, Mapping[str, Any]]]) -> dict[str, Spread]:
    """Each figure's spread over ``runs`` (one mapping of sections per run)."""
    values: dict[str, list[float]] = {}
    for run in runs:
        for name, value in figures(run).items():
            values.setdefault(name, []).append(value)
    return {name: Spread.of(found) for name, found in values.items()}
