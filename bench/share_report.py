"""The record of ``python -m bench share``: each run's figures (the drain, every process's share
of the rows, consumer CPU, the machine's and the model server's busy share, the table's
checks), each configuration's median and range over the rounds, its ratios to one consumer
(of the same group kind, and of the classic group), the tables and the JSON made of them. No
services here: the measuring is in :mod:`bench.share`."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from bench.report import Table, rate
from bench.spread import Spread

Kind = Literal["share", "classic"]


@dataclass(frozen=True)
class Config:
    """One way of draining the topic: ``processes`` consumer processes in a share group
    (``kind = "kafka-share"``) or in a classic consumer group (``kind = "kafka"``)."""

    kind: Kind
    processes: int

    @property
    def label(self) -> str:
        return f"{self.kind} x{self.processes}"


CONFIGS: tuple[Config, ...] = (
    Config("share", 1),
    Config("share", 2),
    Config("share", 4),
    Config("classic", 1),
    Config("classic", 4),
)
SHARE_ONE = Config("share", 1)
CLASSIC_ONE = Config("classic", 1)


def order(index: int) -> tuple[Config, ...]:
    """The configurations of round ``index`` (1-based) in the order run: :data:`CONFIGS`
    rotated by ``index - 1``, so none always goes first (or always follows the same one)."""
    k = (index - 1) % len(CONFIGS)
    return CONFIGS[k:] + CONFIGS[:k]


# --- one drain's samples ---------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """What the runner reads every few tenths of a second while the backlog drains."""

    at: float
    """Seconds since the backlog's production began."""
    rows: tuple[float, ...]
    """``rowbatch_rows_written_total`` of each process."""

    @property
    def total(self) -> float:
        return sum(self.rows)


def first_rows(samples: Sequence[Sample], processes: int) -> tuple[float | None, ...]:
    """When each process was first seen to have written a row (seconds since production
    began; None: never)."""
    out: list[float | None] = [None] * processes
    for s in samples:
        for i, rows in enumerate(s.rows[:processes]):
            if out[i] is None and rows > 0:
                out[i] = s.at
    return tuple(out)


def middle_rate(
    samples: Sequence[Sample], total: int, low: float = 0.1, high: float = 0.9
) -> float | None:
    """Rows/s between the first sample at >= ``low`` of ``total`` written and the first at
    >= ``high`` (None: the samples never reach both at two different instants)."""
    first = next((s for s in samples if s.total >= low * total), None)
    last = next((s for s in samples if s.total >= high * total), None)
    if first is None or last is None or last.at <= first.at:
        return None
    return (last.total - first.total) / (last.at - first.at)


# --- runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    """One consumer process over one run."""

    rows: int
    """``rowbatch_rows_written_total`` at the end (a row written again counts again)."""
    records: int
    """Records it took: ``rowbatch_kafka_share_records_total`` on a share group (every member
    of the process); 0 on the classic group (no such counter)."""
    first_row_s: float | None
    """When it was first seen to have written a row, seconds since production began."""
    cpu_s: float
    """User + system CPU seconds (every thread, ``/proc/<pid>/stat``) from the start of
    production to the last row in the table."""


@dataclass(frozen=True)
class Run:
    """One configuration draining a fresh one-partition topic into a fresh table."""

    kind: Kind
    processes: int
    index: int
    """The round (1-based); every configuration runs once in each."""
    position: int
    """Its place in the round (1-based)."""
    rows: int
    """The backlog."""
    produce_s: float
    """The backlog's production, from its start to the broker's last acknowledgement."""
    drain_s: float
    """From the start of production to the last row in the table (the processes were
    already running, every member in its group)."""
    middle_rows_per_s: float | None
    """Rows/s from 10 % to 90 % of the rows written (production and the tail left out)."""
    per_process: tuple[Process, ...]
    machine_busy: float
    """Share of all the machine's cores busy over the drain (every process on it)."""
    server_busy: float
    """The model's executions over the drain: their time / (the drain x its instances)."""
    server_requests: int
    server_execution_ms: float
    """Mean time of one execution (the fixed latency, plus what the server adds)."""
    server_queue_ms: float
    """Mean time a request waited in the server's queue."""
    in_table: int
    """``count(*)`` of the result table."""
    distinct: int
    """Distinct ids in 0..rows-1 in it."""
    redelivered: int
    """Records taken with a delivery count above 1 (share group)."""
    refused_acks: int
    """Acknowledgement commits the broker refused (their locks had run out)."""
    dead_letters: int

    @property
    def config(self) -> Config:
        return Config(self.kind, self.processes)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.drain_s if self.drain_s > 0 else 0.0

    @property
    def written(self) -> int:
        return sum(p.rows for p in self.per_process)

    @property
    def rewritten(self) -> int:
        """Rows written more than once (no-ops in the keyed table, but work done twice)."""
        return max(0, self.written - self.rows)

    @property
    def shares(self) -> tuple[float, ...]:
        """Each process's share of the rows written."""
        total = self.written
        return tuple(p.rows / total if total else 0.0 for p in self.per_process)

    @property
    def working(self) -> int:
        """Processes that wrote any row."""
        return sum(1 for p in self.per_process if p.rows > 0)

    @property
    def cpu_s(self) -> float:
        return sum(p.cpu_s for p in self.per_process)

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_s / self.rows * 1e6 if self.rows else 0.0

    @property
    def lost(self) -> int:
        return self.rows - self.distinct

    @property
    def twice(self) -> int:
        """Table rows beyond the distinct ones (the table is keyed: 0 unless ids repeat)."""
        return self.in_table - self.distinct

    @property
    def clean(self) -> bool:
        """Every row exactly once in the table, nothing dead-lettered."""
        return (
            self.lost == 0
            and self.twice == 0
            and self.in_table == self.rows
            and self.dead_letters == 0
        )

    def cycle_ms(self, batch_rows: int) -> float:
        """One working process's time per request: ``batch_rows`` x the processes that
        wrote / rows/s (with one request in flight each: the model's latency plus what the
        consumer adds between requests)."""
        return batch_rows * self.working / self.rows_per_s * 1e3 if self.rows_per_s else 0.0


@dataclass(frozen=True)
class Failed:
    """A run that raised: what it raised."""

    kind: Kind
    processes: int
    index: int
    error: str


# --- over the rounds -------------------------------------------------------------------------


FIGURES: tuple[str, ...] = (
    "rows_per_s",
    "drain_s",
    "cpu_us_per_row",
    "machine_busy",
    "server_busy",
)


def _figure(run: Run, name: str) -> float:
    return float(getattr(run, name))


def spreads(runs: Sequence[Run]) -> dict[Config, dict[str, Spread]]:
    """Each figure's median and range over each configuration's runs (one with none is
    absent), in :data:`CONFIGS`' order."""
    out: dict[Config, dict[str, Spread]] = {}
    for config in CONFIGS:
        mine = [r for r in runs if r.config == config]
        if mine:
            out[config] = {name: Spread.of([_figure(r, name) for r in mine]) for name in FIGURES}
    return out


@dataclass(frozen=True)
class Ratio:
    """rows/s of a configuration over a baseline's: the ratio of the medians, and each
    round's own (None where either is missing)."""

    medians: float | None
    rounds: Spread | None


def ratio_to(runs: Sequence[Run], config: Config, base: Config) -> Ratio:
    mine = [r.rows_per_s for r in runs if r.config == config]
    theirs = [r.rows_per_s for r in runs if r.config == base]
    if not mine or not theirs:
        return Ratio(None, None)
    below = statistics.median(theirs)
    medians = statistics.median(mine) / below if below else None
    by_round = {r.index: r.rows_per_s for r in runs if r.config == base}
    each = [
        r.rows_per_s / by_round[r.index]
        for r in runs
        if r.config == config and by_round.get(r.index)
    ]
    return Ratio(medians, Spread.of(each) if each else None)


def same_kind_one(config: Config) -> Config:
    return Config(config.kind, 1)


@dataclass(frozen=True)
class ShareSpread:
    """How the rows were spread among a configuration's processes over its runs: the largest
    and the smallest process's share in each run, their ranges, and the processes that wrote
    nothing."""

    largest: Spread
    smallest: Spread
    idle_processes: int
    """Over all the runs: processes that wrote no row."""
    last_first_row_s: Spread | None
    """When the last process to write its first row did (seconds since production began),
    over the runs in which every process wrote."""


def share_spread(runs: Sequence[Run], config: Config) -> ShareSpread | None:
    mine = [r for r in runs if r.config == config and r.per_process]
    if not mine:
        return None
    last = [
        max(p.first_row_s for p in r.per_process if p.first_row_s is not None)
        for r in mine
        if all(p.first_row_s is not None for p in r.per_process)
    ]
    return ShareSpread(
        largest=Spread.of([max(r.shares) for r in mine]),
        smallest=Spread.of([min(r.shares) for r in mine]),
        idle_processes=sum(r.processes - r.working for r in mine),
        last_first_row_s=Spread.of(last) if last else None,
    )


def totals(runs: Sequence[Run], config: Config) -> dict[str, int]:
    """The checks summed over a configuration's runs."""
    mine = [r for r in runs if r.config == config]
    return {
        "lost": sum(r.lost for r in mine),
        "twice": sum(r.twice for r in mine),
        "dead_letters": sum(r.dead_letters for r in mine),
        "rewritten": sum(r.rewritten for r in mine),
        "redelivered": sum(r.redelivered for r in mine),
        "refused_acks": sum(r.refused_acks for r in mine),
    }


# --- the record ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    rows: int
    record_rows: int
    producer_batch_records: int
    """``batch.num.messages``: the broker hands share-group members whole producer batches."""
    model: str
    base_ms: float
    instances: int
    batch_rows: int
    """``model.batch_size``: rows per request."""
    max_in_flight: int
    """``model.max_in_flight`` (``adapt`` off): requests each process has out at once."""
    max_wait_ms: float
    members: int
    """``source.members`` of a share-group process."""
    max_poll_records: int
    lock_s: float
    settle_s: float
    sample_s: float
    repeat: int
    cores: int

    @property
    def one_consumer_bound(self) -> float:
        """Rows/s one process can reach: its requests in flight, each of ``batch_rows``, each
        taking the model's fixed latency (the consumer's own time between requests aside)."""
        return self.max_in_flight * self.batch_rows / (self.base_ms / 1e3)

    @property
    def server_ceiling(self) -> float:
        return self.instances * self.batch_rows / (self.base_ms / 1e3)


def _pct(value: float) -> str:
    return f"{value:.0%}"


def _range(s: Spread | None, how: str) -> str:
    if s is None:
        return "-"
    return f"{_fmt(s.low, how)}..{_fmt(s.high, how)}"


def _fmt(value: float, how: str) -> str:
    if how == "rate":
        return rate(value)
    if how == "pct":
        return _pct(value)
    if how == "x":
        return f"{value:.2f}"
    return f"{value:,.{how[0]}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


@dataclass(frozen=True)
class ShareBench:
    params: Params
    runs: tuple[Run, ...]
    failed: tuple[Failed, ...] = ()

    @property
    def clean(self) -> bool:
        return not self.failed and all(r.clean for r in self.runs)

    def summary_table(self) -> Table:
        p = self.params
        rows: list[tuple[str, ...]] = []
        for config, figures in spreads(self.runs).items():
            r, c = figures["rows_per_s"], figures["cpu_us_per_row"]
            same = ratio_to(self.runs, config, same_kind_one(config))
            classic = ratio_to(self.runs, config, CLASSIC_ONE)
            spread = share_spread(self.runs, config)
            t = totals(self.runs, config)
            mine = [x for x in self.runs if x.config == config]
            cycle = Spread.of([x.cycle_ms(p.batch_rows) for x in mine])
            rows.append(
                (
                    config.label,
                    str(len(mine)),
                    rate(r.median),
                    _range(r, "rate"),
                    _x(same.medians),
                    _range(same.rounds, "x"),
                    _x(classic.medians),
                    f"{figures['drain_s'].median:.1f}",
                    f"{cycle.median:.0f}",
                    f"{c.median:.0f}",
                    _range(c, "0f"),
                    _pct(figures["machine_busy"].median),
                    _pct(figures["server_busy"].median),
                    "-" if spread is None else _range(spread.largest, "pct"),
                    "-" if spread is None else _range(spread.smallest, "pct"),
                    f"{t['lost']}/{t['twice']}/{t['dead_letters']}",
                    f"{t['rewritten']:,}/{t['redelivered']}",
                )
            )
        return Table(
            f"Share group vs classic group, one partition, {p.rows:,} rows: drain rate with N "
            "consumer processes",
            (
                "config",
                "runs",
                "rows/s",
                "min..max",
                "x N=1",
                "per round",
                "x classic 1",
                "drain s",
                "cycle ms",
                "CPU us/row",
                "min..max",
                "machine",
                "server",
                "largest share",
                "smallest share",
                "lost/twice/dlq",
                "rewritten/redelivered",
            ),
            tuple(rows),
            self.notes(),
        )

    def notes(self) -> tuple[str, ...]:
        p = self.params
        n_runs = ", ".join(
            f"{c.label} {sum(1 for r in self.runs if r.config == c)}" for c in CONFIGS
        )
        return (
            f"Each run: a fresh 1-partition topic on one Kafka 4.4.0 broker, N consumer "
            f"processes (rowbatch-consumer) started and ready, every member in its group, "
            f"then {p.rows:,} rows produced at once as {p.rows // p.record_rows:,} records of "
            f"{p.record_rows} rows in producer batches of {p.producer_batch_records} records, "
            "drained into a fresh PostgreSQL table.",
            f"Latency-bound consumers, as a replica limited per replica would be: model "
            f"{p.model}, fixed_latency {p.base_ms:g} ms per execution on {p.instances} "
            f"instances (ceiling {rate(p.server_ceiling)} rows/s, more than 4 processes can "
            f"ask for); each process sends {p.batch_rows}-row requests, {p.max_in_flight} in "
            f"flight (adapt off), max_wait_ms {p.max_wait_ms:g}: one process <= "
            f"{rate(p.one_consumer_bound)} rows/s.",
            f"Share group: {p.members} members a process, max_poll_records "
            f'{p.max_poll_records}, lock {p.lock_s:g} s. Classic group: kind = "kafka", its '
            "defaults (one member a process; one partition: one process gets it).",
            f"rows/s: rows / drain s (production start to the last row in the table, sampled "
            f"every {p.sample_s:g} s); x N=1: over one process of the same group kind, x "
            "classic 1: over one classic consumer (ratios of the medians; per round: each "
            "round's own); cycle ms: a working process's time per request (batch x working "
            "processes / rows/s).",
            "CPU us/row: every consumer process's CPU (user + system, idle ones included) over "
            "the drain / rows; machine: all the machine's cores busy over the drain (every "
            "process, other users' included); server: the model's instances busy (Triton's "
            "statistics).",
            "largest/smallest share: the processes' largest and smallest share of the rows "
            "written, min..max over the runs; lost/twice/dlq: rows missing from the table, "
            "rows in it beyond the distinct ids, dead letters (all 0: every row exactly once); "
            "rewritten: rows written again (no-ops in the keyed table), redelivered: records "
            "taken with a delivery count above 1.",
            f"Median and min..max over the runs ({n_runs}), configurations rotated round by "
            f"round; {p.cores} cores shared by the broker, Triton, PostgreSQL, the consumers "
            "and this runner (and, on a shared machine, whatever else ran).",
        )

    def runs_table(self) -> Table:
        p = self.params
        rows = tuple(
            (
                f"{r.index}.{r.position} {r.config.label}",
                f"{r.produce_s:.1f}",
                f"{r.drain_s:.1f}",
                rate(r.rows_per_s),
                "-" if r.middle_rows_per_s is None else rate(r.middle_rows_per_s),
                f"{r.cycle_ms(p.batch_rows):.0f}",
                f"{r.cpu_us_per_row:.0f}",
                _pct(r.machine_busy),
                _pct(r.server_busy),
                f"{r.server_execution_ms:.0f}/{r.server_queue_ms:.1f}",
                " / ".join(f"{s:.1%}" for s in r.shares),
                " / ".join(
                    "-" if x.first_row_s is None else f"{x.first_row_s:.1f}" for x in r.per_process
                ),
                f"{r.lost}/{r.twice}/{r.dead_letters}",
                f"{r.rewritten:,}/{r.redelivered}/{r.refused_acks}",
                "ok" if r.clean else "FAILED",
            )
            for r in self.runs
        )
        return Table(
            "Each run, in the order run",
            (
                "run",
                "produce s",
                "drain s",
                "rows/s",
                "middle",
                "cycle ms",
                "CPU us/row",
                "machine",
                "server",
                "exec/queue ms",
                "share of the rows, each process",
                "first row s, each process",
                "lost/twice/dlq",
                "rewr/redel/refused",
                "check",
            ),
            rows,
            (
                "run: round.position; middle: rows/s from 10 % to 90 % of the rows written; "
                "exec/queue ms: the server's mean execution and queue time per request",
                "first row s: when each process was first seen to have written (seconds after "
                "production began); refused: acknowledgement commits the broker refused",
            ),
        )

    def failed_lines(self) -> list[str]:
        return [f"FAILED {f.kind} x{f.processes} round {f.index}: {f.error}" for f in self.failed]

    def tables(self) -> list[Table]:
        return [self.summary_table(), self.runs_table()]

    def render(self) -> str:
        text = "\n".join(t.render() for t in self.tables())
        bad = self.failed_lines() + [
            f"ROW CHECK FAILED {r.config.label} round {r.index}: {r.lost} lost, {r.twice} "
            f"twice, {r.in_table:,} in the table for {r.rows:,}, {r.dead_letters} dead letters"
            for r in self.runs
            if not r.clean
        ]
        return text + ("\n" + "\n".join(bad) if bad else "")

    def to_json(self, header: Mapping[str, Any]) -> dict[str, Any]:
        """``header`` (command, date, machine, git commit) with the params, every run, each
        configuration's spread, its ratios and how its rows were spread."""

        def spread_json(s: Spread | None) -> dict[str, float] | None:
            return None if s is None else {"median": s.median, "min": s.low, "max": s.high}

        summary: dict[str, Any] = {}
        for config, figures in spreads(self.runs).items():
            same = ratio_to(self.runs, config, same_kind_one(config))
            classic = ratio_to(self.runs, config, CLASSIC_ONE)
            spread = share_spread(self.runs, config)
            summary[config.label] = {
                **{name: spread_json(s) for name, s in figures.items()},
                "x_same_kind_one": same.medians,
                "x_same_kind_one_per_round": spread_json(same.rounds),
                "x_classic_one": classic.medians,
                "x_classic_one_per_round": spread_json(classic.rounds),
                "largest_share": None if spread is None else spread_json(spread.largest),
                "smallest_share": None if spread is None else spread_json(spread.smallest),
                "idle_processes": None if spread is None else spread.idle_processes,
                "totals": totals(self.runs, config),
            }
        return {
            **header,
            "params": {
                **dataclasses.asdict(self.params),
                "one_consumer_bound_rows_per_s": self.params.one_consumer_bound,
                "server_ceiling_rows_per_s": self.params.server_ceiling,
            },
            "clean": self.clean,
            "summary": summary,
            "runs": [
                {
                    **dataclasses.asdict(r),
                    "config": r.config.label,
                    "rows_per_s": r.rows_per_s,
                    "cpu_us_per_row": r.cpu_us_per_row,
                    "shares": list(r.shares),
                    "working": r.working,
                    "rewritten": r.rewritten,
                    "lost": r.lost,
                    "twice": r.twice,
                    "clean": r.clean,
                }
                for r in self.runs
            ],
            "failed": [dataclasses.asdict(f) for f in self.failed],
        }


__all__ = [
    "CLASSIC_ONE",
    "CONFIGS",
    "SHARE_ONE",
    "Config",
    "Failed",
    "Kind",
    "Params",
    "Process",
    "Ratio",
    "Run",
    "Sample",
    "ShareBench",
    "ShareSpread",
    "first_rows",
    "middle_rate",
    "order",
    "ratio_to",
    "same_kind_one",
    "share_spread",
    "spreads",
    "totals",
]
