"""The record of ``python -m bench rollout``: each round's figures (a drain's rate and CPU over
its middle span, the rollout's counters, the tables' checks), each mode's median and range,
its ratios to ``off`` (of the medians, and round by round), the verdict on the target (a shadow
keeps at least 95 % of production's rows/s when its candidate has room), and the tables and
JSON made of them. No services here: the measuring is in :mod:`bench.rollout`."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.report import Table, rate
from bench.server_admission_report import fmt
from bench.spread import Spread

Mode = Literal["off", "shadow", "shadow-down", "canary-10"]
MODES: tuple[Mode, ...] = ("off", "shadow", "shadow-down", "canary-10")
BASELINE: Mode = "off"
TARGET = 0.95
"""A shadow's rows/s over ``off``'s (ratio of the medians) must be at least this."""


def order(index: int) -> tuple[Mode, ...]:
    """The modes of round ``index`` (1-based) in the order run: :data:`MODES` rotated by
    ``index - 1``, so no mode always goes first (or always follows the same one)."""
    k = (index - 1) % len(MODES)
    return MODES[k:] + MODES[:k]


# --- one drain's middle span -----------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What the runner reads every 0.1 s while a backlog drains."""

    at: float
    """``time.monotonic()``."""
    cpu_s: float
    """``time.process_time()``: this process (the consumer), every thread."""
    written: float
    """``rowbatch_rows_written_total``."""
    busy_ticks: int = 0
    """The machine's non-idle CPU ticks (``/proc/stat``: all but idle and iowait)."""
    all_ticks: int = 0


@dataclass(frozen=True)
class Span:
    """The samples from the first at >= ``low`` of the rows written to the first at >=
    ``high``."""

    seconds: float
    rows: float
    cpu_s: float
    fit_rows_per_s: float
    """The least-squares slope of rows written against time over every sample of the span
    (a cross-check of :attr:`rows_per_s`, less sensitive to where a write lands)."""
    machine_busy: float
    """Share of all the machine's cores busy over the span (every process)."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds

    @property
    def cpu_s_per_1k_rows(self) -> float:
        return self.cpu_s / (self.rows / 1e3)


def slope(points: Sequence[tuple[float, float]]) -> float:
    """The least-squares slope of ``y`` against ``x`` (0 with fewer than two distinct x)."""
    if len(points) < 2:
        return 0.0
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in points) / sxx


def span_of(samples: Sequence[Sample], total: int, low: float, high: float) -> Span:
    """The middle span of a drain of ``total`` rows; ValueError if the samples never reach
    ``low`` and ``high`` of it at two different instants (a backlog too small for the
    sampling, or a drain that stopped)."""
    first = next((i for i, s in enumerate(samples) if s.written >= low * total), None)
    last = next((i for i, s in enumerate(samples) if s.written >= high * total), None)
    if first is None or last is None or last <= first:
        raise ValueError(
            f"the drain of {total:,} rows has no span from {low:.0%} to {high:.0%} over "
            f"{len(samples)} samples (more --rows?)"
        )
    a, b = samples[first], samples[last]
    ticks = b.all_ticks - a.all_ticks
    return Span(
        seconds=b.at - a.at,
        rows=b.written - a.written,
        cpu_s=b.cpu_s - a.cpu_s,
        fit_rows_per_s=slope([(s.at, s.written) for s in samples[first : last + 1]]),
        machine_busy=(b.busy_ticks - a.busy_ticks) / ticks if ticks > 0 else 0.0,
    )


# --- rounds ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One mode's consumer over a fresh backlog, subscription and table."""

    mode: Mode
    index: int
    """The round (1-based); every mode runs once in each."""
    position: int
    """Its place in the round's order (1-based)."""
    rows_per_s: float
    """Rows written over the span / its seconds (the span: from the first sample at >= 20 %
    of the backlog written to the first at >= 90 %)."""
    fit_rows_per_s: float
    of_ceiling: float
    span_s: float
    span_rows: int
    cpu_s_per_1k_rows: float
    """This process's CPU seconds (``time.process_time``) over the span per 1,000 rows."""
    machine_busy: float
    prod_busy: float
    """The production model's mean executions running over the span (Triton's statistics;
    one instance: its busy share)."""
    prod_queue_ms: float
    """Mean queue time of a production request over the span."""
    cand_busy: float
    cand_queue_ms: float
    prod_requests: int
    """Requests the production model executed over the span (Triton's statistics)."""
    cand_requests: int
    """The candidate's (a canary splits every batch: about as many as production's, each with
    a tenth of the rows)."""
    drain_s: float
    """From the consumer's start to the backlog's last row written."""
    shadow_lag_s: float | None
    """A shadow: from production's last row to the shadow's backlog empty (None: not a
    shadow, or not empty within the limit)."""
    production_rows: int
    """``rowbatch_rollout_rows_total{arm="production",outcome="answered"}``."""
    candidate_answered: int
    """``{arm="candidate",outcome="answered"}``: a canary counts the rows it gives the
    candidate."""
    candidate_skipped: int
    candidate_failed: int
    candidate_unwritten: int
    candidate_dropped: int
    compared_rows: int | None
    """Rows in the shadow's comparison table (None: not a shadow)."""
    candidate_rows: int
    """Result-table rows written with the candidate's ``model_name``."""
    arm_mismatches: int
    """Result-table rows whose ``model_name`` is not the one their key hash names (a canary:
    the candidate below its share; otherwise production everywhere)."""
    rows_expected: int
    rows_distinct: int
    rows_lost: int
    duplicate_rows: int
    dead_letters: int

    @property
    def candidate_share(self) -> float:
        return self.candidate_rows / self.rows_expected if self.rows_expected else 0.0

    @property
    def clean(self) -> bool:
        return not (self.rows_lost or self.duplicate_rows or self.dead_letters) and not (
            self.arm_mismatches
        )


@dataclass(frozen=True)
class Failed:
    """A round that raised: what it raised."""

    mode: Mode
    index: int
    error: str


FIGURES: tuple[tuple[str, str, str], ...] = (
    # (Round field, label, format)
    ("rows_per_s", "rows/s", "rate"),
    ("fit_rows_per_s", "rows/s (fit)", "rate"),
    ("of_ceiling", "of ceiling", "pct"),
    ("cpu_s_per_1k_rows", "CPU s/1k rows", "3f"),
    ("machine_busy", "machine busy", "pct"),
    ("prod_busy", "prod busy", "pct"),
    ("cand_busy", "cand busy", "pct"),
    ("prod_queue_ms", "prod queue ms", "0f"),
)
COUNTS: tuple[str, ...] = (
    "production_rows",
    "candidate_answered",
    "candidate_skipped",
    "candidate_failed",
    "candidate_unwritten",
    "candidate_dropped",
    "candidate_rows",
    "arm_mismatches",
    "rows_lost",
    "duplicate_rows",
    "dead_letters",
)


def spreads(rounds: Sequence[Round]) -> dict[Mode, dict[str, Spread]]:
    """Each figure's median and range over each mode's rounds (a mode with none is absent)."""
    out: dict[Mode, dict[str, Spread]] = {}
    for mode in MODES:
        mine = [r for r in rounds if r.mode == mode]
        if mine:
            out[mode] = {
                name: Spread.of([float(getattr(r, name)) for r in mine]) for name, _, _ in FIGURES
            }
    return out


@dataclass(frozen=True)
class OverOff:
    """One mode against ``off``: the ratio of the medians, and the ratios of the rounds in
    which both ran (None where either is missing or ``off``'s is 0)."""

    rows_per_s: float | None
    rows_per_s_rounds: Spread | None
    cpu: float | None
    cpu_rounds: Spread | None


def _ratio(over: float, under: float) -> float | None:
    return over / under if under else None


def _per_round(rounds: Sequence[Round], mode: Mode, name: str) -> Spread | None:
    base = {r.index: float(getattr(r, name)) for r in rounds if r.mode == BASELINE}
    got = [
        float(getattr(r, name)) / base[r.index]
        for r in rounds
        if r.mode == mode and base.get(r.index)
    ]
    return Spread.of(got) if got else None


def over_off(rounds: Sequence[Round]) -> dict[Mode, OverOff]:
    """Every mode measured (``off`` included, 1 by definition) against ``off``."""
    by_mode = spreads(rounds)
    base = by_mode.get(BASELINE)
    out: dict[Mode, OverOff] = {}
    for mode, figures in by_mode.items():
        out[mode] = OverOff(
            None if base is None else _ratio(figures["rows_per_s"].median,
                                             base["rows_per_s"].median),
            _per_round(rounds, mode, "rows_per_s"),
            None if base is None else _ratio(figures["cpu_s_per_1k_rows"].median,
                                             base["cpu_s_per_1k_rows"].median),
            _per_round(rounds, mode, "cpu_s_per_1k_rows"),
        )  # fmt: skip
    return out


def totals(rounds: Sequence[Round]) -> dict[Mode, dict[str, int]]:
    """The counters and the tables' checks summed over each mode's rounds (``compared_rows``
    for the shadows)."""
    out: dict[Mode, dict[str, int]] = {}
    for mode in MODES:
        mine = [r for r in rounds if r.mode == mode]
        if mine:
            out[mode] = {name: sum(int(getattr(r, name)) for r in mine) for name in COUNTS}
            if any(r.compared_rows is not None for r in mine):
                out[mode]["compared_rows"] = sum(r.compared_rows or 0 for r in mine)
    return out


@dataclass(frozen=True)
class Verdict:
    """The target: shadow rows/s >= :data:`TARGET` of ``off``'s, as the ratio of the medians
    (None: not measured); the rounds' own ratios beside it."""

    ratio: float | None
    rounds: Spread | None
    met: bool | None
    rounds_met: int
    """Rounds whose own shadow/off ratio meets the target."""

    def line(self) -> str:
        want = f"target: shadow rows/s >= {TARGET:.0%} of off"
        if self.ratio is None or self.met is None:
            return f"{want}: not measured"
        each = ""
        if self.rounds is not None:
            n = len(self.rounds.values)
            each = (
                f"; per round {self.rounds.low:.1%}..{self.rounds.high:.1%}, met in "
                f"{self.rounds_met} of {n}"
            )
        met = "MET" if self.met else "MISSED"
        return f"{want}: {self.ratio:.1%} (ratio of medians){each}: {met}"


def verdict(rounds: Sequence[Round]) -> Verdict:
    got = over_off(rounds).get("shadow")
    if got is None or got.rows_per_s is None:
        return Verdict(None, None, None, 0)
    each = got.rows_per_s_rounds
    met_rounds = 0 if each is None else sum(1 for v in each.values if v >= TARGET)
    return Verdict(got.rows_per_s, each, got.rows_per_s >= TARGET, met_rounds)


# --- the record ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    model: str
    candidate: str
    base_ms: float
    max_batch_size: int
    instances: int
    ceiling_rows_per_s: float
    """One model's: its instances always busy with full requests (each model has its own)."""
    rows_per_round: int
    rows_per_message: int
    backlog_rows: int
    """The shadow's ``backlog_rows``."""
    canary_share: float
    span_low: float
    span_high: float
    sample_s: float
    repeat: int


def _x(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _range(s: Spread | None, how: str) -> str:
    return "-" if s is None else f"{fmt(s.low, how)}..{fmt(s.high, how)}"


@dataclass(frozen=True)
class Rollout:
    params: Params
    rounds: tuple[Round, ...]
    failed: tuple[Failed, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.failed and all(r.clean for r in self.rounds)

    def summary_table(self) -> Table:
        p = self.params
        by_mode = spreads(self.rounds)
        ratio = over_off(self.rounds)
        count = totals(self.rounds)
        rows: list[tuple[str, ...]] = []
        for mode, figures in by_mode.items():
            r, c, n = figures["rows_per_s"], figures["cpu_s_per_1k_rows"], count[mode]
            compared = n.get("compared_rows")
            rows.append(
                (
                    mode,
                    rate(r.median),
                    _range(r, "rate"),
                    fmt(figures["of_ceiling"].median, "pct"),
                    _x(ratio[mode].rows_per_s),
                    _range(ratio[mode].rows_per_s_rounds, "2f"),
                    fmt(c.median, "3f"),
                    _range(c, "3f"),
                    _x(ratio[mode].cpu),
                    f"{n['candidate_answered']:,}/{n['candidate_skipped']:,}/"
                    f"{n['candidate_failed']:,}",
                    "-" if compared is None else f"{compared:,}",
                    f"{n['rows_lost']}/{n['duplicate_rows']}/{n['dead_letters']}/"
                    f"{n['arm_mismatches']}",
                )
            )
        n_rounds = ", ".join(f"{m} {sum(1 for r in self.rounds if r.mode == m)}" for m in by_mode)
        notes = [
            f"one consumer (this process) on one Triton: {p.model} and {p.candidate} each "
            f"fixed_latency {p.base_ms:g} ms per execution, {p.instances} instance, batch "
            f"{p.max_batch_size}: ceiling {p.ceiling_rows_per_s:,.0f} rows/s each",
            f"median and min..max over the rounds ({n_rounds}), "
            f"modes rotated round by round; each a fresh subscription, table and "
            f"{p.rows_per_round:,}-row backlog ({p.rows_per_message}-row messages)",
            f"rows/s and CPU over the drain's middle: from {p.span_low:.0%} to {p.span_high:.0%} "
            f"of the rows written (sampled every {p.sample_s:g} s); CPU: this process, "
            f"time.process_time; x off: ratio of the medians, per round: each round's own",
            "candidate: rowbatch_rollout_rows_total{arm=candidate}: answered/skipped/failed (a "
            "canary counts the rows given to it); compared: the comparison table's rows",
            f"shadow: backlog_rows {p.backlog_rows:,}; shadow-down: candidate url where nothing "
            f"listens; canary-10: share {p.canary_share:g}",
            "checks (all rounds): lost/written twice/dead letters/rows not by the arm their key "
            "names",
            verdict(self.rounds).line(),
        ]
        for f in self.failed:
            notes.append(f"FAILED {f.mode} round {f.index}: {f.error}")
        return Table(
            "Rollout: production drain rate and consumer CPU with a shadow or a canary",
            (
                "mode",
                "rows/s",
                "min..max",
                "of ceiling",
                "x off",
                "per round",
                "CPU s/1k rows",
                "min..max",
                "x off",
                "cand answered/skipped/failed",
                "compared",
                "checks",
            ),
            tuple(rows),
            tuple(notes),
        )

    def rounds_table(self) -> Table:
        rows = tuple(
            (
                f"{r.index}.{r.position} {r.mode}",
                rate(r.rows_per_s),
                rate(r.fit_rows_per_s),
                f"{r.of_ceiling:.1%}",
                f"{r.cpu_s_per_1k_rows:.3f}",
                f"{r.machine_busy:.0%}",
                f"{r.prod_busy:.0%}",
                f"{r.cand_busy:.0%}",
                f"{r.prod_queue_ms:.0f}",
                f"{r.prod_requests}/{r.cand_requests}",
                f"{r.drain_s:.1f}",
                "-" if r.shadow_lag_s is None else f"{r.shadow_lag_s:.1f}",
                f"{r.candidate_answered:,}/{r.candidate_skipped:,}/{r.candidate_failed:,}",
                "-" if r.compared_rows is None else f"{r.compared_rows:,}",
                f"{r.candidate_share:.2%}",
                f"{r.rows_lost}/{r.duplicate_rows}/{r.dead_letters}/{r.arm_mismatches}",
            )
            for r in self.rounds
        )
        return Table(
            "Each round, in the order run",
            (
                "round",
                "rows/s",
                "fit",
                "of ceiling",
                "CPU s/1k",
                "machine",
                "prod busy",
                "cand busy",
                "prod queue ms",
                "requests",
                "drain s",
                "lag s",
                "cand a/s/f",
                "compared",
                "by cand",
                "checks",
            ),
            rows,
            (
                "round: index.position; fit: least-squares rows/s over the span; machine: all "
                "cores busy over the span; prod/cand busy: the model's instance busy (Triton)",
                "requests: production's/the candidate's over the span (Triton)",
                "drain s: consumer start to last row written; lag s: a shadow's backlog empty "
                "after production's last row; by cand: result rows with the candidate's "
                "model_name",
            ),
        )

    def tables(self) -> list[Table]:
        return [self.summary_table(), self.rounds_table()]

    def render(self) -> str:
        return "\n".join(t.render() for t in self.tables())

    def to_json(self, header: Mapping[str, Any]) -> dict[str, Any]:
        """``header`` (command, date, machine, git commit) with the params, every round, the
        spread per mode, the ratios to ``off`` and the verdict."""
        v = verdict(self.rounds)

        def spread_json(s: Spread | None) -> dict[str, float] | None:
            return None if s is None else {"median": s.median, "min": s.low, "max": s.high}

        return {
            **header,
            "params": dataclasses.asdict(self.params),
            "clean": self.clean,
            "summary": {
                mode: {name: spread_json(s) for name, s in figures.items()}
                for mode, figures in spreads(self.rounds).items()
            },
            "over_off": {
                mode: {
                    "rows_per_s": o.rows_per_s,
                    "rows_per_s_per_round": spread_json(o.rows_per_s_rounds),
                    "cpu_s_per_1k_rows": o.cpu,
                    "cpu_s_per_1k_rows_per_round": spread_json(o.cpu_rounds),
                }
                for mode, o in over_off(self.rounds).items()
            },
            "target": {
                "what": f"shadow rows/s >= {TARGET:g} x off's (ratio of the medians)",
                "ratio": v.ratio,
                "met": v.met,
                "rounds_met": v.rounds_met,
                "line": v.line(),
            },
            "totals": totals(self.rounds),
            "rounds": [
                {**dataclasses.asdict(r), "candidate_share": r.candidate_share} for r in self.rounds
            ],
            "failed": [dataclasses.asdict(f) for f in self.failed],
        }


__all__ = [
    "BASELINE",
    "MODES",
    "TARGET",
    "Failed",
    "Mode",
    "OverOff",
    "Params",
    "Rollout",
    "Round",
    "Sample",
    "Span",
    "Verdict",
    "order",
    "over_off",
    "slope",
    "span_of",
    "spreads",
    "totals",
    "verdict",
]
