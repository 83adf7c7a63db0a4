"""The record of ``python -m bench server_admission``: each round's figures, their median and
spread per mode (fixed windows, admitted windows), the admitted/fixed ratios, the leave/join
phase, and the tables and JSON made of them. No services here: the measuring is in
:mod:`bench.server_admission`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.report import Table, rate
from bench.spread import Spread

Mode = Literal["fixed", "admitted"]
MODES: tuple[Mode, Mode] = ("fixed", "admitted")


@dataclass(frozen=True)
class Round:
    """One mode's run of the consumers over a fresh backlog."""

    mode: Mode
    index: int
    """1-based, per mode."""
    rows_per_s: float
    """The server's requests over the span x rows per request, per second."""
    of_ceiling: float
    queue_ms: float
    """Mean queue time per request over the span (Triton's statistics)."""
    waiting: float
    """Mean requests queued at the server over the span (Little's law)."""
    window_sum: float
    """The consumers' windows summed, the mean of samples over the span."""
    in_flight_sum: float
    """Their requests in flight summed, likewise."""
    cpu_s_per_1k_rows: float
    """This process's CPU seconds (``time.process_time``) over the span per 1,000 rows the
    consumers wrote in it."""
    span_rows_written: int
    rows_left_after_span: int
    """Backlog rows not yet written when the span ended (> 0: the backlog lasted it)."""
    rows_expected: int
    rows_distinct: int
    rows_lost: int
    duplicate_rows: int
    """Rows in the table more than once."""
    skipped_duplicates: int
    """Rows a write skipped as already in the table (``rowbatch_rows_duplicate_total``)."""
    dead_letters: int
    windows: tuple[float, ...]
    """Each consumer's window at the end of the span."""
    saturated: tuple[float, ...]
    """Each consumer's ``rowbatch_server_saturated`` at the end of the span."""

    @property
    def clean(self) -> bool:
        return not (self.rows_lost or self.duplicate_rows or self.dead_letters)


@dataclass(frozen=True)
class Failed:
    """A round that raised: what it raised."""

    mode: Mode
    index: int
    error: str


@dataclass(frozen=True)
class LeaveJoin:
    """Admitted windows: settled, one consumer leaves, one joins."""

    settled_rows_per_s: float
    settled_queue_ms: float
    settled_windows: tuple[float, ...]
    settled_window_mean: float
    """The windows' sum, mean of the span's samples (``*_windows``: each at the span's end)."""
    left_rows_per_s: float
    left_queue_ms: float
    left_windows: tuple[float, ...]
    left_window_mean: float
    reconverge_s: float | None
    """Seconds from the newcomer's first rows written until the windows summed to the settled
    sum + 1 or less; None if they did not within the limit."""
    joined_rows_per_s: float
    joined_queue_ms: float
    joined_windows: tuple[float, ...]
    joined_window_mean: float
    rows_left_after_span: int
    rows_expected: int
    rows_lost: int
    duplicate_rows: int
    dead_letters: int

    @property
    def settled_sum(self) -> float:
        return sum(self.settled_windows)

    @property
    def clean(self) -> bool:
        return not (self.rows_lost or self.duplicate_rows or self.dead_letters)


FIGURES: tuple[tuple[str, str, str], ...] = (
    # (Round field, label, format)
    ("rows_per_s", "server rows/s", "rate"),
    ("of_ceiling", "of ceiling", "pct"),
    ("queue_ms", "queue ms per request", "0f"),
    ("waiting", "requests waiting (mean)", "1f"),
    ("window_sum", "windows' sum (mean)", "1f"),
    ("in_flight_sum", "in flight sum (mean)", "1f"),
    ("cpu_s_per_1k_rows", "consumer CPU s per 1,000 rows", "3f"),
)
COUNTS: tuple[tuple[str, str], ...] = (
    ("rows_lost", "rows lost"),
    ("duplicate_rows", "rows written twice"),
    ("skipped_duplicates", "writes skipped as duplicates"),
    ("dead_letters", "dead letters"),
)


def fmt(value: float, how: str) -> str:
    if how == "rate":
        return rate(value)
    if how == "pct":
        return f"{value:.1%}"
    return f"{value:,.{how[0]}f}"


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


def ratios(by_mode: Mapping[Mode, Mapping[str, Spread]]) -> dict[str, float | None]:
    """Admitted median over fixed median, per figure (None where either is missing or the
    fixed one is 0)."""
    fixed, admitted = by_mode.get("fixed"), by_mode.get("admitted")
    out: dict[str, float | None] = {}
    for name, _, _ in FIGURES:
        if fixed is None or admitted is None or not fixed[name].median:
            out[name] = None
        else:
            out[name] = admitted[name].median / fixed[name].median
    return out


def totals(rounds: Sequence[Round]) -> dict[Mode, dict[str, int]]:
    """Rows lost, written twice, skipped and dead letters summed over each mode's rounds."""
    return {
        mode: {
            name: sum(int(getattr(r, name)) for r in rounds if r.mode == mode) for name, _ in COUNTS
        }
        for mode in MODES
        if any(r.mode == mode for r in rounds)
    }


def _cell(
    by_mode: Mapping[Mode, Mapping[str, Spread]], mode: Mode, name: str, how: str
) -> tuple[str, str]:
    got = by_mode.get(mode)
    if got is None:
        return "-", "-"
    s = got[name]
    return fmt(s.median, how), f"{fmt(s.low, how)}..{fmt(s.high, how)}"


@dataclass(frozen=True)
class Params:
    consumers: int
    instances: int
    base_ms: float
    max_batch_size: int
    ceiling_rows_per_s: float
    rows_per_round: int
    rows_per_message: int
    read_ahead: int
    measure_s: float
    settle_s: float
    adapt_interval_s: float
    max_wait_ms: float
    repeat: int


@dataclass(frozen=True)
class ServerAdmission:
    params: Params
    rounds: tuple[Round, ...]
    failed: tuple[Failed, ...] = ()
    leave_join: LeaveJoin | None = None
    leave_join_error: str | None = None

    @property
    def clean(self) -> bool:
        return (
            not self.failed
            and self.leave_join_error is None
            and all(r.clean for r in self.rounds)
            and (self.leave_join is None or self.leave_join.clean)
        )

    def summary_table(self) -> Table:
        p = self.params
        by_mode = spreads(self.rounds)
        ratio = ratios(by_mode)
        count = totals(self.rounds)
        rows: list[tuple[str, ...]] = []
        for name, label, how in FIGURES:
            r = ratio[name]
            rows.append(
                (
                    label,
                    *_cell(by_mode, "fixed", name, how),
                    *_cell(by_mode, "admitted", name, how),
                    "-" if r is None else f"{r:.2f}",
                )
            )
        for name, label in COUNTS:
            rows.append(
                (
                    f"{label} (all rounds)",
                    str(count.get("fixed", {}).get(name, "-")),
                    "",
                    str(count.get("admitted", {}).get(name, "-")),
                    "",
                    "",
                )
            )
        n = {mode: sum(1 for r in self.rounds if r.mode == mode) for mode in MODES}
        notes = [
            f"{p.consumers} consumers (this process) on one Triton: fixed_latency "
            f"{p.base_ms:g} ms per execution, {p.instances} instances, batch "
            f"{p.max_batch_size}: ceiling {p.ceiling_rows_per_s:,.0f} rows/s",
            f"median and min..max over {n['fixed']} fixed and {n['admitted']} admitted rounds, "
            f"run alternately; each a fresh subscription, table and {p.rows_per_round:,}-row "
            f"backlog, measured over {p.measure_s:g} s once all write (+{p.settle_s:g} s)",
            "server figures from Triton's statistics (queue by Little's law); windows and in "
            f"flight sampled every 50 ms; adapt_interval_s {p.adapt_interval_s:g}",
        ]
        for f in self.failed:
            notes.append(f"FAILED {f.mode} round {f.index}: {f.error}")
        return Table(
            "Server admission: fixed windows vs admitted from the server's queue",
            ("figure", "fixed", "min..max", "admitted", "min..max", "admitted/fixed"),
            tuple(rows),
            tuple(notes),
        )

    def rounds_table(self) -> Table:
        ceiling = self.params.ceiling_rows_per_s
        rows = tuple(
            (
                f"{r.mode} {r.index}",
                rate(r.rows_per_s),
                f"{r.rows_per_s / ceiling:.1%}",
                f"{r.queue_ms:.0f}",
                f"{r.waiting:.1f}",
                f"{r.window_sum:.1f}",
                f"{r.in_flight_sum:.1f}",
                f"{r.cpu_s_per_1k_rows:.3f}",
                f"{r.rows_left_after_span:,}",
                f"{r.rows_lost}/{r.duplicate_rows}/{r.dead_letters}",
                " ".join(f"{w:g}" for w in r.windows),
            )
            for r in self.rounds
        )
        return Table(
            "Each round, in the order run",
            (
                "round",
                "rows/s",
                "of ceiling",
                "queue ms",
                "waiting",
                "windows",
                "in flight",
                "CPU s/1k rows",
                "rows left",
                "lost/twice/DLQ",
                "windows at end",
            ),
            rows,
            ("rows left: backlog not yet written when the span ended (> 0: it lasted the span)",),
        )

    def leave_join_table(self) -> Table | None:
        lj = self.leave_join
        if lj is None:
            if self.leave_join_error is None:
                return None
            return Table(
                "Admitted: one consumer leaves, one joins",
                ("phase", "error"),
                (("leave/join", self.leave_join_error),),
            )
        ceiling = self.params.ceiling_rows_per_s
        back = "not within the limit" if lj.reconverge_s is None else f"{lj.reconverge_s:.1f} s"

        def windows(ws: Sequence[float]) -> str:
            return f"{sum(ws):g} ({' '.join(f'{w:g}' for w in ws)})"

        rows = (
            ("3 settled", rate(lj.settled_rows_per_s), f"{lj.settled_rows_per_s / ceiling:.1%}",
             f"{lj.settled_queue_ms:.0f}", f"{lj.settled_window_mean:.1f}",
             windows(lj.settled_windows), ""),
            ("one left (2)", rate(lj.left_rows_per_s), f"{lj.left_rows_per_s / ceiling:.1%}",
             f"{lj.left_queue_ms:.0f}", f"{lj.left_window_mean:.1f}",
             windows(lj.left_windows), ""),
            ("one joined (3)", rate(lj.joined_rows_per_s), f"{lj.joined_rows_per_s / ceiling:.1%}",
             f"{lj.joined_queue_ms:.0f}", f"{lj.joined_window_mean:.1f}",
             windows(lj.joined_windows), back),
        )  # fmt: skip
        return Table(
            "Admitted: one consumer leaves, one joins",
            (
                "phase",
                "rows/s",
                "of ceiling",
                "queue ms",
                "windows (mean)",
                "at the end (each)",
                "back to settled",
            ),
            rows,
            (
                f"back to settled: the newcomer writing until the windows sum to "
                f"<= {lj.settled_sum + 1:g} (settled sum + 1); each phase then measured over "
                f"{self.params.measure_s:g} s",
                f"{lj.rows_expected:,} rows: {lj.rows_lost} lost, {lj.duplicate_rows} written "
                f"twice, {lj.dead_letters} dead letters; {lj.rows_left_after_span:,} left "
                "after the last span",
            ),
        )

    def tables(self) -> list[Table]:
        out = [self.summary_table(), self.rounds_table()]
        lj = self.leave_join_table()
        if lj is not None:
            out.append(lj)
        return out

    def render(self) -> str:
        return "\n".join(t.render() for t in self.tables())

    def to_json(self, header: Mapping[str, Any]) -> dict[str, Any]:
        """``header`` (command, date, machine, git commit) with the params, every round, the
        spread per mode and the ratios."""
        by_mode = spreads(self.rounds)
        return {
            **header,
            "params": dataclasses.asdict(self.params),
            "clean": self.clean,
            "summary": {
                mode: {
                    name: {"median": s.median, "min": s.low, "max": s.high}
                    for name, s in figures.items()
                }
                for mode, figures in by_mode.items()
            },
            "admitted_over_fixed": ratios(by_mode),
            "totals": totals(self.rounds),
            "rounds": [dataclasses.asdict(r) for r in self.rounds],
            "failed": [dataclasses.asdict(f) for f in self.failed],
            "leave_join": None if self.leave_join is None else dataclasses.asdict(self.leave_join),
            "leave_join_error": self.leave_join_error,
        }


__all__ = ["MODES", "Failed", "LeaveJoin", "Mode", "Params", "Round", "ServerAdmission"]
