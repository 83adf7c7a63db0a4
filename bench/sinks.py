"""Section ``sinks``: rows/s into the three result-table sinks side by side, PostgreSQL
(``[sink] kind = "postgres"``), Parquet (``kind = "parquet"``, a local directory) and Apache
Iceberg (``kind = "iceberg"``: pyiceberg's SQL catalog in the bench's PostgreSQL, a local
``file://`` warehouse), on the same model and the same backlog.

The model is ``scorer`` (16 float32 + int64 -> score + label, dynamic batching; its measured
ceiling is over 100,000 rows/s, well above what one consumer drains on a small machine), so the
consumer and its sink are what is measured, not the server. One Kafka topic holds the backlog
(numeric rows, ``bench.stack.backlog``, in 500-row messages), published once before the first
consumer starts; every run is one ``rowbatch-consumer run`` process reading the whole topic with
a consumer group of its own, with the same binding, model and consumer settings: only ``[sink]``
differs. The file sinks get the same ``target_file_mb`` and ``commit_interval_s`` (Parquet where
its ``[sink]`` has them). The three run one after another in one stack, ``ROUNDS`` rounds, the
order rotated each round (each sink first, second and third once in three rounds).

Per run, polled on ``/metrics`` as in the other sections: rows/s from the first row written
(less the rows already written at that first poll: start-up is left out) to the last message
acked. A file sink writes rows into files before it commits them and acks a message only once
its rows are committed, so that is also the last row committed (for Iceberg the window also
waits for ``rowbatch_iceberg_rows_committed_total`` to reach the backlog). Also: rows/s to the
last row written, the tail from there to the last ack, the consumer's CPU (user + sys) per row
from the first row written to the last, its peak RSS, Triton's busy fraction, and data files
(Parquet: the visible ``*.parquet`` files of the dataset; Iceberg: the current snapshot's files,
``plan_files``) with rows per file; for Iceberg the commits and the time they took
(``rowbatch_iceberg_commit_seconds``). Per sink: the median and range over the rounds, and the
ratio to PostgreSQL measured side by side (each round's ratio, then their median and range)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import pyarrow.dataset as ds

from bench.procs import ConsumerProcess, consumers
from bench.report import Table, rate
from bench.saturation_server import ServerWindow, Snapshot, snapshot
from bench.spread import Spread
from bench.stack import (
    SCORER_BINDING,
    Bench,
    Feed,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    sink_config,
    unique,
)
from rowbatch.consumer.section import MiB
from rowbatch.consumer.sinks.settings import ParquetSinkSettings

Sink = Literal["postgres", "parquet", "iceberg"]
SINK_KINDS: tuple[Sink, ...] = ("postgres", "parquet", "iceberg")
BASE: Sink = "postgres"
"""What the ratios are to."""

MODEL = "scorer"
ROWS = 200_000
QUICK_ROWS = 20_000
CHUNK_ROWS = 500
ROUNDS = 3
BUDGET = 256 * MiB
TARGET_FILE_MB = 128.0
COMMIT_INTERVAL_S = 10.0
"""The file sinks' ``target_file_mb`` and ``commit_interval_s`` (Iceberg; Parquet too where
its ``[sink]`` has them: a Parquet sink that rolls large files and publishes them at a commit)."""
ICEBERG_NAMESPACE = "bench"
RUN_TIMEOUT_S = 300.0
POLL_S = 0.1

_WRITTEN = "rowbatch_rows_written_total"
_ACKED = "rowbatch_messages_acked_total"
_COMMITTED = "rowbatch_iceberg_rows_committed_total"
_COMMITS = "rowbatch_iceberg_commits_total"
_COMMIT_S = "rowbatch_iceberg_commit_seconds_sum"


# --- results -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkRun:
    """One consumer draining the backlog into one sink."""

    sink: str
    case: str
    """``round N``: names the run among the others of its sink (the JSON's figures)."""
    round: int
    position: int
    """1 = the first sink of its round."""
    rows: int
    """Rows in the measured window."""
    seconds: float
    """First row written to the last message acked (Iceberg: committed)."""
    written_s: float
    """First row written to the last row written."""
    startup_s: float
    """Process start to its first row written (not measured)."""
    rows_per_s: float
    written_rows_per_s: float
    cpu_us_per_row: float
    """The consumer's user + sys CPU from the first row written to the last, per row (the
    commits made meanwhile included; the wait for the last commit not)."""
    tail_cpu_s: float
    """Its CPU from the last row written to the last ack: the last commit, and idling."""
    peak_rss_mib: float
    busy: float
    """Triton's compute time from the first row written to the last (one instance)."""
    data_files: int | None
    """Parquet and Iceberg: the data files holding the rows; PostgreSQL: ``None``."""
    rows_per_file: float | None
    commits: int | None
    """Iceberg: commits made (``rowbatch_iceberg_commits_total``)."""
    commit_s: float | None
    """Iceberg: time spent committing, all commits (``rowbatch_iceberg_commit_seconds``)."""
    rows_in_sink: int
    rows_expected: int

    @property
    def tail_s(self) -> float:
        """From the last row written to the last ack."""
        return max(self.seconds - self.written_s, 0.0)


@dataclass(frozen=True)
class SinkSummary:
    """One sink over the rounds: medians, and the least and greatest value."""

    sink: str
    runs: int
    rows_per_s: float
    rows_per_s_low: float
    rows_per_s_high: float
    written_rows_per_s: float
    tail_s: float
    tail_cpu_s: float
    vs_base: float | None
    """This sink's rows/s over PostgreSQL's in the same round, median over the rounds."""
    vs_base_low: float | None
    vs_base_high: float | None
    written_vs_base: float | None
    """The same with rows/s to the last row written."""
    cpu_us_per_row: float
    cpu_us_per_row_low: float
    cpu_us_per_row_high: float
    peak_rss_mib: float
    data_files: float | None
    rows_per_file: float | None
    commits: float | None
    commit_s_mean: float | None
    """Mean time per commit over every commit of every round."""
    all_in_sink: bool


def _median_range(values: Sequence[float]) -> Spread:
    return Spread.of(values)


def _optional(values: Iterable[float | int | None]) -> Spread | None:
    found = [float(v) for v in values if v is not None]
    return Spread.of(found) if found else None


_T = TypeVar("_T")


def round_orders(sinks: Sequence[_T], rounds: int) -> list[tuple[_T, ...]]:
    """The sinks' order in each round: rotated by one each round, so over ``len(sinks)``
    rounds each sink runs once in each position."""
    n = len(sinks)
    return [tuple(sinks[(r + i) % n] for i in range(n)) for r in range(rounds)]


def ratios_to(
    runs: Sequence[SinkRun], sink: str, base: str = BASE, *, written: bool = False
) -> list[float]:
    """``sink``'s rows/s over ``base``'s, per round that ran both (``written``: rows/s to the
    last row written)."""
    by_round: dict[int, dict[str, float]] = {}
    for run in runs:
        speed = run.written_rows_per_s if written else run.rows_per_s
        by_round.setdefault(run.round, {})[run.sink] = speed
    return [
        pair[sink] / pair[base]
        for _, pair in sorted(by_round.items())
        if sink in pair and pair.get(base, 0.0) > 0
    ]


def summarize(
    runs: Sequence[SinkRun], sinks: Sequence[str] = SINK_KINDS
) -> tuple[SinkSummary, ...]:
    """One summary per sink that ran, in ``sinks`` order."""
    out: list[SinkSummary] = []
    for sink in sinks:
        mine = [r for r in runs if r.sink == sink]
        if not mine:
            continue
        speed = _median_range([r.rows_per_s for r in mine])
        cpu = _median_range([r.cpu_us_per_row for r in mine])
        vs = _optional(ratios_to(runs, sink)) if sink != BASE else None
        vs_written = _optional(ratios_to(runs, sink, written=True)) if sink != BASE else None
        files = _optional(r.data_files for r in mine)
        per_file = _optional(r.rows_per_file for r in mine)
        commits = _optional(r.commits for r in mine)
        n_commits = sum(r.commits or 0 for r in mine)
        commit_s = sum(r.commit_s or 0.0 for r in mine)
        out.append(
            SinkSummary(
                sink,
                len(mine),
                speed.median,
                speed.low,
                speed.high,
                _median_range([r.written_rows_per_s for r in mine]).median,
                _median_range([r.tail_s for r in mine]).median,
                _median_range([r.tail_cpu_s for r in mine]).median,
                None if vs is None else vs.median,
                None if vs is None else vs.low,
                None if vs is None else vs.high,
                None if vs_written is None else vs_written.median,
                cpu.median,
                cpu.low,
                cpu.high,
                _median_range([r.peak_rss_mib for r in mine]).median,
                None if files is None else files.median,
                None if per_file is None else per_file.median,
                None if commits is None else commits.median,
                commit_s / n_commits if n_commits else None,
                all(r.rows_in_sink == r.rows_expected for r in mine),
            )
        )
    return tuple(out)


def _range(low: float, high: float) -> str:
    return f"{rate(low)}-{rate(high)}"


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _times_range(low: float | None, high: float | None) -> str:
    return "-" if low is None or high is None else f"{low:.2f}-{high:.2f}x"


def _count(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


@dataclass(frozen=True)
class SinksResult:
    model: str
    rows: int
    chunk_rows: int
    messages: int
    rounds: int
    orders: tuple[tuple[str, ...], ...]
    target_file_mb: float
    commit_interval_s: float
    parquet_settings: dict[str, float]
    """What the Parquet ``[sink]`` was given of ``target_file_mb`` and ``commit_interval_s``
    (those it has)."""
    runs: tuple[SinkRun, ...]
    sinks: tuple[SinkSummary, ...]

    def find(self, sink: str) -> SinkSummary | None:
        return next((s for s in self.sinks if s.sink == sink), None)

    def table(self) -> Table:
        rows = tuple(
            (
                s.sink,
                rate(s.rows_per_s),
                _range(s.rows_per_s_low, s.rows_per_s_high),
                "1" if s.sink == BASE else _times(s.vs_base),
                "-" if s.sink == BASE else _times_range(s.vs_base_low, s.vs_base_high),
                rate(s.written_rows_per_s),
                "1" if s.sink == BASE else _times(s.written_vs_base),
                f"{s.tail_s:.1f}",
                f"{s.cpu_us_per_row:.1f}",
                f"{s.peak_rss_mib:.0f}",
                _count(s.data_files),
                _count(s.rows_per_file),
                _count(s.commits),
                "-" if s.commit_s_mean is None else f"{s.commit_s_mean:.2f}",
                "ok" if s.all_in_sink else "MISSING",
            )
            for s in self.sinks
        )
        orders = "; ".join(" > ".join(order) for order in self.orders)
        parquet = (
            ", ".join(f"{k} {v:g}" for k, v in self.parquet_settings.items())
            if self.parquet_settings
            else "none (one file per write, no commits)"
        )
        return Table(
            f"10. Result-table sinks side by side: {self.model}, {self.rows:,} rows, "
            f"median of {self.rounds} round(s)",
            (
                "sink",
                "rows/s",
                "range",
                "vs postgres",
                "range",
                "written/s",
                "written vs pg",
                "tail s",
                "CPU us/row",
                "RSS MiB",
                "files",
                "rows/file",
                "commits",
                "s/commit",
                "in sink",
            ),
            rows,
            (
                f"The same {self.rows:,} numeric rows ({self.messages} Kafka messages of "
                f"{self.chunk_rows} rows, published once) drained by one consumer per run, each "
                "with a consumer group of its own; same model, binding and settings, only "
                f"[sink] differs. Order per round: {orders}.",
                "rows/s: first row written to the last message acked (a file sink acks a "
                "message only after the commit holding its rows, so that is also the last row "
                "committed); range: least and greatest over the rounds; vs postgres: each "
                "round's ratio to PostgreSQL in that round, median (and range); written/s: to "
                "the last row written (written vs pg: its ratio, the same way); tail: last "
                "write to last ack.",
                "CPU: the consumer process's user+sys from the first row written to the last, "
                "per row (the PostgreSQL server's own work is not in it). files: Parquet, the "
                "dataset's visible *.parquet files; Iceberg, the current snapshot's data files. "
                f"Iceberg: target_file_mb {self.target_file_mb:g}, commit_interval_s "
                f"{self.commit_interval_s:g}, catalog in the bench's PostgreSQL, warehouse a "
                "local file:// directory; s/commit: rowbatch_iceberg_commit_seconds per commit. "
                f"Parquet [sink] extras: {parquet}.",
                "A file sink commits when its oldest uncommitted message has waited "
                "commit_interval_s (or its files reach target_file_mb): on a backlog it writes "
                "in a few intervals, its rows/s is about rows / (k x commit_interval_s), bound "
                "by when rows become visible; written/s is its write rate.",
            ),
        )


# --- the runs ------------------------------------------------------------------------------------


def _iceberg_sink(bench: Bench, name: str) -> dict[str, Any]:
    return {
        "kind": "iceberg",
        "catalog_uri": bench.stack.postgres.dsn.replace(
            "postgresql://", "postgresql+psycopg://", 1
        ),
        "catalog_name": unique("bench_sinks"),
        "warehouse": (bench.dir("iceberg") / name).as_uri(),
        "namespace": ICEBERG_NAMESPACE,
        "table": name,
        "target_file_mb": TARGET_FILE_MB,
        "commit_interval_s": COMMIT_INTERVAL_S,
    }


def parquet_extras() -> dict[str, float]:
    """The file-sink settings the Parquet ``[sink]`` takes here (none where it writes one
    file per write and has no commits)."""
    wanted = {"target_file_mb": TARGET_FILE_MB, "commit_interval_s": COMMIT_INTERVAL_S}
    return {k: v for k, v in wanted.items() if k in ParquetSinkSettings.model_fields}


def _sink_section(bench: Bench, sink: Sink, name: str) -> dict[str, Any]:
    if sink == "iceberg":
        return _iceberg_sink(bench, name)
    section = sink_config(bench, sink, name)
    return {**section, **parquet_extras()} if sink == "parquet" else section


def _open_catalog(section: Mapping[str, Any]) -> Any:
    from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog  # noqa: PLC0415

    return LedgerCatalog(
        section["catalog_name"], uri=section["catalog_uri"], warehouse=section["warehouse"]
    )


def _iceberg_files(section: Mapping[str, Any]) -> tuple[int, int]:
    """Rows and data files of the table's current snapshot."""
    catalog = _open_catalog(section)
    try:
        table = catalog.load_table(f"{section['namespace']}.{section['table']}")
        tasks = list(table.scan().plan_files())
        return sum(int(t.file.record_count) for t in tasks), len(tasks)
    finally:
        catalog.close()


def _drop_iceberg(bench: Bench, section: Mapping[str, Any]) -> None:
    """The table out of the catalog, its ledger rows out of the database, its files deleted."""
    import sqlalchemy as sa  # noqa: PLC0415

    from rowbatch.consumer.sinks.iceberg import ledger  # noqa: PLC0415

    ident = f"{section['namespace']}.{section['table']}"
    catalog = _open_catalog(section)
    try:
        catalog.drop_table(ident)
        catalog.drop_namespace(section["namespace"])
        key = f"{catalog.name}.{ident}"
        with catalog.engine.begin() as conn:
            conn.execute(
                sa.delete(ledger.ledger_rows).where(ledger.ledger_rows.c.table_ident == key)
            )
            conn.execute(sa.delete(ledger.commits).where(ledger.commits.c.table_ident == key))
    finally:
        catalog.close()
    shutil.rmtree(bench.dir("iceberg") / str(section["table"]), ignore_errors=True)


@dataclass(frozen=True)
class _Watched:
    rows: int
    seconds: float
    written_s: float
    startup_s: float
    cpu_s: float
    """First row written to the last."""
    tail_cpu_s: float
    peak_rss_mib: float
    server: ServerWindow
    """First row written to the last."""
    final: dict[str, float]
    """The last ``/metrics`` read."""


@dataclass(frozen=True)
class _Mark:
    at: float
    rows: float
    server: Snapshot
    cpu_s: float


def _watch(
    proc: ConsumerProcess, url: str, *, rows: int, messages: int, iceberg: bool, started: float
) -> _Watched:
    """Poll ``/metrics`` until every message is acked (and, for Iceberg, every row committed).
    The window runs from the first poll that saw rows written (less those rows); when that
    poll already saw (nearly) all of them, from the process's start (a backlog too small to
    measure: ``startup_s`` 0)."""
    first: _Mark | None = None
    last: _Mark | None = None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        found = proc.metrics() or {}
        now = time.monotonic()
        written = found.get(_WRITTEN, 0.0)
        if written > 0 and first is None:
            first = _Mark(now, written, snapshot(url, MODEL), proc.cpu().total_s)
        if written >= rows and last is None:
            last = _Mark(now, written, snapshot(url, MODEL), proc.cpu().total_s)
        acked = found.get(_ACKED, 0.0)
        done = acked >= messages and last is not None
        if iceberg:
            done = done and found.get(_COMMITTED, 0.0) >= rows
        if done:
            break
        proc.check_alive(f"{messages} messages acked ({acked:.0f} so far)")
        if now > deadline:
            raise TimeoutError(
                f"{written:.0f} of {rows} rows written, {acked:.0f} of {messages} messages "
                f"acked after {RUN_TIMEOUT_S:.0f} s"
            )
        time.sleep(POLL_S)
    cpu_end = proc.cpu().total_s
    peak = proc.memory_kib()["VmHWM"] / 1024
    assert first is not None and last is not None
    tail_cpu = cpu_end - last.cpu_s
    if last.at - first.at < 0.2:  # everything was written before the first polls
        server = ServerWindow(last.at - started, 0, 0, 0.0, 1)
        return _Watched(
            rows, now - started, last.at - started, 0.0, last.cpu_s, tail_cpu, peak, server, found
        )
    return _Watched(
        int(rows - first.rows),
        now - first.at,
        last.at - first.at,
        first.at - started,
        last.cpu_s - first.cpu_s,
        tail_cpu,
        peak,
        ServerWindow.between(first.server, last.server, 1),
        found,
    )


def _one_run(
    bench: Bench,
    feed: Feed,
    sink: Sink,
    *,
    reader: int,
    round_no: int,
    place: int,
    total: int,
    messages: int,
) -> SinkRun:
    name = unique(f"sinks_{sink}")
    section = _sink_section(bench, sink, name)
    config = consumer_config(
        bench.stack, feed, MODEL, SCORER_BINDING, section, reader=reader, budget_bytes=BUDGET
    )
    started = time.monotonic()
    with consumers(bench.dir("sinks"), name, config) as procs:
        seen = _watch(
            procs[0],
            bench.stack.triton.grpc_url,
            rows=total,
            messages=messages,
            iceberg=sink == "iceberg",
            started=started,
        )
        procs[0].terminate()
    files: int | None = None
    commits: int | None = None
    commit_s: float | None = None
    if sink == "iceberg":
        in_sink, files = _iceberg_files(section)
        commits = int(seen.final.get(_COMMITS, 0.0))
        commit_s = seen.final.get(_COMMIT_S, 0.0)
        _drop_iceberg(bench, section)
    else:
        in_sink = count_rows(bench, sink, name)
        if sink == "parquet":
            files = len(ds.dataset(bench.dir("parquet") / name, partitioning="hive").files)
        remove_table(bench, sink, name)
    return SinkRun(
        sink,
        f"round {round_no}",
        round_no,
        place,
        seen.rows,
        round(seen.seconds, 2),
        round(seen.written_s, 2),
        round(seen.startup_s, 2),
        seen.rows / seen.seconds if seen.seconds > 0 else 0.0,
        seen.rows / seen.written_s if seen.written_s > 0 else 0.0,
        seen.cpu_s / seen.rows * 1e6 if seen.rows else 0.0,
        round(seen.tail_cpu_s, 2),
        seen.peak_rss_mib,
        seen.server.busy,
        files,
        in_sink / files if files else None,
        commits,
        None if commit_s is None else round(commit_s, 3),
        in_sink,
        total,
    )


def run(bench: Bench, rounds: int = ROUNDS) -> SinksResult:
    rows = QUICK_ROWS if bench.quick else ROWS
    orders = round_orders(SINK_KINDS, rounds)
    feed = create_feed(bench.stack, "kafka", readers=rounds * len(SINK_KINDS))
    published = publish(
        bench.stack, feed, backlog("numeric", rows, CHUNK_ROWS, prefix=unique("sk"))
    )
    if published.rows != rows:
        raise RuntimeError(f"published {published.rows} rows, meant {rows}")
    runs: list[SinkRun] = []
    reader = 0
    for r, order in enumerate(orders, 1):
        for place, sink in enumerate(order, 1):
            done = _one_run(
                bench,
                feed,
                sink,
                reader=reader,
                round_no=r,
                place=place,
                total=rows,
                messages=published.messages,
            )
            reader += 1
            runs.append(done)
            print(
                f"  round {r} {sink}: {rate(done.rows_per_s)} rows/s "
                f"({rate(done.written_rows_per_s)} written/s), "
                f"{done.cpu_us_per_row:.1f} us/row"
                + ("" if done.data_files is None else f", {done.data_files} files"),
                flush=True,
            )
    return SinksResult(
        MODEL,
        rows,
        CHUNK_ROWS,
        published.messages,
        rounds,
        tuple(orders),
        TARGET_FILE_MB,
        COMMIT_INTERVAL_S,
        parquet_extras(),
        tuple(runs),
        summarize(runs),
    )


__all__ = ["SinkRun", "SinkSummary", "SinksResult", "round_orders", "run", "summarize"]
