"""Section 8, saturation: does rowbatch keep the model server busy? Against ``fixed_latency``
(deploy/models/fixed_latency: every execution lasts a fixed wall time asleep, one instance, so
its ceiling does not move with the machine's load and is known in advance), per broker:

- the measured ceiling: a direct client (batch = the preferred size, pre-built tensors) right
  before the broker's cases, next to the analytic one from the model's config;
- backlogs of 500-, 16- and 1-row messages drained by one consumer process into PostgreSQL (and
  Parquet for 500-row messages), with the reference consumer (``bench/reference.py``: one
  request per message, a thread pool; Pub/Sub: Google's subscriber pattern, each message acked
  as it finishes; Kafka: a commit per polled batch) on the same backlog;
- the same for 500- and 1-row messages against ``fixed_latency_batched``, the same model as a
  team would deploy it (dynamic batching on, two instances), where Triton merges the
  reference's concurrent one-message requests: the one-instance model's ratio for 1-row
  messages is set by the model (any one-request-per-message client tops out near 125 rows/s),
  this one's by the clients;
- a steady publisher at 50 % and 80 % of the measured ceiling (100-row messages, PostgreSQL),
  and at 80 % with 10-row messages, with publish-to-written latency per row.

Per case: rows/s, the ratios to both ceilings, Triton's own mean executed batch and busy
fraction (compute_infer time / wall time x instances), the consumer's CPU per row and peak
RSS."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from bench.procs import consumers, wait_ready
from bench.report import Table, rate, ratio, times
from bench.saturation_run import (
    WARMUP_S,
    Observed,
    add_written_at,
    reference,
    steady,
    watch_backlog,
)
from bench.saturation_server import (
    BATCHED_MODEL,
    MODEL,
    PROBE_CONCURRENCY,
    PROBE_WINDOWS,
    ModelTiming,
    Probe,
    model_timing,
    probe,
)
from bench.stack import (
    BROKERS,
    NOOP_NUMERIC_BINDING,
    Bench,
    Broker,
    Feed,
    SinkKind,
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

BUDGET = 256 * MiB
"""The consumer's ``budget_bytes`` (its default), for the peak-RSS target."""
ALLOWANCE_MB = 150.0
MAX_WAIT_MS = 100.0
BACKLOG_ROWS = {500: 160_000, 16: 160_000, 1: 50_000}
"""Rows per backlog by message size: about 8 s at the ceiling for 500- and 16-row messages,
fewer rows of 1-row messages (their cost is per message: 50,000 messages, 4-5 s here)."""
QUICK_BACKLOG_ROWS = {500: 10_000, 16: 3_200, 1: 1_000}
BATCHED_SIZES = (500, 1)
"""Message sizes also run against ``fixed_latency_batched`` (rowbatch and the reference)."""
PARQUET_SIZES = (500,)
STEADY = ((100, 0.5), (100, 0.8), (10, 0.8))
"""Steady cases: (rows per message, share of the measured ceiling) published at that pace."""
STEADY_S = 20.0
QUICK_STEADY_S = 4.0
REFERENCE_S = 10.0
CATCH_UP_S = 1.0
QUICK_REFERENCE_S = 4.0


@dataclass(frozen=True)
class BrokerProbe:
    broker: Broker
    probe: Probe
    model: str = MODEL


@dataclass(frozen=True)
class Case:
    """One consumer run. Backlog: ``load`` is None; steady: ``load`` and the latency fields."""

    broker: Broker
    sink: SinkKind
    rows_per_message: int
    load: float | None
    rows: int
    """Rows in the measured window."""
    rows_per_s: float
    seconds: float
    startup_s: float
    of_analytic: float
    of_measured: float
    measured_ceiling: float
    mean_batch: float
    busy: float
    server_batch_ms: float
    cpu_us_per_row: float
    peak_rss_mib: float
    rows_in_sink: int
    rows_expected: int
    reference_rows_per_s: float | None = None
    speedup: float | None = None
    """rows_per_s / reference_rows_per_s (backlog into PostgreSQL only)."""
    target_rows_per_s: float | None = None
    sent_rows_per_s: float | None = None
    catch_up_s: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p99_bound_ms: float | None = None
    """max_wait_ms + 3 x the server's batch time in this run."""
    keeps_up: bool | None = None
    """Steady: the publisher held at least 95 % of its rate and the consumer wrote the last
    row within ``CATCH_UP_S`` of the last publish."""
    model: str = MODEL


@dataclass(frozen=True)
class SaturationResult:
    model: str
    timing: ModelTiming
    analytic_ceiling: float
    analytic_batch_ms: float
    probes: tuple[BrokerProbe, ...]
    cases: tuple[Case, ...]
    backlog_rows: dict[int, int]
    steady_s: float
    reference_s: float
    max_wait_ms: float
    budget_mib: float
    publish_s: dict[str, float]
    batched_timing: ModelTiming | None = None
    """``fixed_latency_batched``'s config (its cases have ``model`` set to it)."""

    @property
    def rss_limit_mib(self) -> float:
        return self.budget_mib + ALLOWANCE_MB * 1e6 / MiB

    def find(
        self,
        broker: Broker,
        rows_per_message: int,
        sink: SinkKind = "postgres",
        load: float | None = None,
        model: str = MODEL,
    ) -> Case | None:
        key = (broker, rows_per_message, sink, load, model)
        return next(
            (
                c
                for c in self.cases
                if (c.broker, c.rows_per_message, c.sink, c.load, c.model) == key
            ),
            None,
        )

    def table(self) -> Table:
        t = self.timing
        probes = "; ".join(
            f"{p.broker} {p.model} {rate(p.probe.rows_per_s)} rows/s (busy {p.probe.busy:.0%}, "
            f"batch {p.probe.mean_batch:.0f}, one request at a time {p.probe.round_trip_ms:.1f} ms)"
            for p in self.probes
        )
        rows = tuple(
            (
                f"{c.broker} -> {c.sink}",
                "batched" if c.model == BATCHED_MODEL else "1 inst",
                str(c.rows_per_message),
                "backlog" if c.load is None else f"{c.load:.0%} = {rate(c.target_rows_per_s or 0)}",
                f"{c.rows_expected:,}",
                rate(c.rows_per_s),
                ratio(c.of_analytic),
                ratio(c.of_measured),
                f"{c.mean_batch:.0f}",
                ratio(c.busy),
                f"{c.cpu_us_per_row:.1f}",
                f"{c.peak_rss_mib:.0f}",
                "-" if c.reference_rows_per_s is None else rate(c.reference_rows_per_s),
                times(c.speedup),
                "-"
                if c.p99_ms is None
                else f"{c.p50_ms or 0:,.0f}/{c.p95_ms or 0:,.0f}/{c.p99_ms:,.0f} "
                f"(<= {c.p99_bound_ms or 0:,.0f})",
                "-" if c.load is None else f"{'yes' if c.keeps_up else 'NO'} {c.catch_up_s:.1f} s",
                "ok" if c.rows_in_sink == c.rows_expected else f"{c.rows_in_sink:,}!",
            )
            for c in self.cases
        )
        return Table(
            f"8. Saturation: {self.model} ({t.base_ms:g} ms + {t.per_row_us:g} us/row per "
            f"execution, {t.instances} instance), analytic ceiling "
            f"{rate(self.analytic_ceiling)} rows/s at batch {t.batch}"
            + (
                ""
                if self.batched_timing is None
                else f"; {self.batched_timing.model} ({self.batched_timing.instances} "
                f"instances, dynamic batching) {rate(self.batched_timing.ceiling)} rows/s"
            ),
            (
                "broker -> sink",
                "model",
                "rows/msg",
                "load",
                "rows",
                "rows/s",
                "of analytic",
                "of measured",
                "batch",
                "busy",
                "CPU us/row",
                "RSS MiB",
                "ref rows/s",
                "x ref",
                "p50/p95/p99 ms (bound)",
                "keeps up",
                "in sink",
            ),
            rows,
            (
                f"Measured ceiling (direct aio client, batch {t.batch}, concurrency "
                f"{PROBE_CONCURRENCY}, best of {PROBE_WINDOWS} windows; busy and batch over all "
                f"of them) before each broker's cases: {probes}. Analytic batch time "
                f"{t.batch_ms:.2f} ms.",
                "backlog: numeric rows (16 float32 + int64) in Arrow chunks, published before "
                "the consumer starts; rows/s from the first row written to the last. batch and "
                "busy: Triton's statistics over that window (mean rows per execution; "
                "compute_infer / wall x instances). CPU: user+sys of the consumer process over "
                "the window, per row; RSS: its peak (VmHWM).",
                "model: 1 inst = fixed_latency (one instance, no dynamic batching: every request "
                f"is an execution); batched = {BATCHED_MODEL} (the same model with dynamic "
                "batching and two instances, as a team would deploy it; of analytic/measured "
                "against its own ceilings).",
                "ref: bench/reference.py (8 threads; per message its own requests, one per "
                f"{t.max_batch} rows, and one INSERT+COMMIT; Pub/Sub: streaming pull, each "
                "message acked as it finishes, 100 outstanding; Kafka: 100 records per poll, "
                "one commit after them) on the same backlog into "
                f"PostgreSQL, at most {self.reference_s:g} s; x ref = rowbatch / reference.",
                "50 % / 80 %: 100- and 10-row messages published steadily at that "
                f"share of the measured ceiling for {self.steady_s:g} s, max_wait_ms "
                f"{self.max_wait_ms:g}; publish-to-written per row (first {WARMUP_S:g} s left "
                "out); bound = max_wait + 3 x Triton's batch time; keeps up = sent >= 95 % of "
                f"the target and the last row written <= {CATCH_UP_S:g} s after the last publish "
                f"(catch-up shown). Budget {self.budget_mib:.0f} MiB, RSS limit "
                f"{self.rss_limit_mib:.0f} MiB.",
            ),
        )


@dataclass(frozen=True)
class _Ctx:
    """What every run of one broker's cases shares."""

    bench: Bench
    timing: ModelTiming
    measured: float
    """The measured ceiling probed before this broker's cases."""

    def config(self, feed: Feed, reader: int, sink: SinkKind, table: str) -> dict[str, object]:
        return consumer_config(
            self.bench.stack,
            feed,
            self.timing.model,
            NOOP_NUMERIC_BINDING,
            sink_config(self.bench, sink, table),
            reader=reader,
            model_extra={"max_wait_ms": MAX_WAIT_MS},
            budget_bytes=BUDGET,
        )

    def case(
        self,
        feed: Feed,
        sink: SinkKind,
        observed: Observed,
        *,
        rows_per_message: int,
        in_sink: int,
        expected: int,
        load: float | None = None,
    ) -> Case:
        return Case(
            feed.broker,
            sink,
            rows_per_message,
            load,
            observed.rows,
            observed.rows_per_s,
            round(observed.seconds, 2),
            round(observed.startup_s, 2),
            observed.rows_per_s / self.timing.ceiling,
            observed.rows_per_s / self.measured if self.measured else 0.0,
            self.measured,
            observed.server.mean_batch,
            observed.server.busy,
            observed.server.batch_ms,
            observed.cpu_us_per_row,
            observed.peak_rss_mib,
            in_sink,
            expected,
            model=self.timing.model,
        )


def _backlog(
    ctx: _Ctx, feed: Feed, reader: int, sink: SinkKind, *, rows_per_message: int, rows: int
) -> Case:
    bench = ctx.bench
    table = unique(f"saturation_{feed.broker}_{ctx.timing.model}_{rows_per_message}_{sink}")
    config = ctx.config(feed, reader, sink, table)
    started = time.monotonic()
    with consumers(bench.dir("saturation"), table, config) as procs:
        observed = watch_backlog(
            procs[0], bench.stack.triton.grpc_url, ctx.timing, total=rows, started=started
        )
        procs[0].terminate()
    in_sink = count_rows(bench, sink, table)
    remove_table(bench, sink, table)
    return ctx.case(
        feed, sink, observed, rows_per_message=rows_per_message, in_sink=in_sink, expected=rows
    )


def _steady(ctx: _Ctx, broker: Broker, load: float, seconds: float, chunk_rows: int) -> Case:
    bench = ctx.bench
    feed = create_feed(bench.stack, broker)
    table = unique(f"saturation_{broker}_steady_{chunk_rows}_{int(load * 100)}")
    config = ctx.config(feed, 0, "postgres", table)
    with consumers(bench.dir("saturation"), table, config) as procs:
        wait_ready(procs)
        add_written_at(bench.stack.postgres.dsn, table)
        run = steady(
            bench,
            procs[0],
            feed,
            table,
            ctx.timing,
            rows_per_s=ctx.measured * load,
            seconds=seconds,
            chunk_rows=chunk_rows,
        )
        procs[0].terminate()
    in_sink = count_rows(bench, "postgres", table)
    remove_table(bench, "postgres", table)
    case = ctx.case(
        feed,
        "postgres",
        run.observed,
        rows_per_message=chunk_rows,
        in_sink=in_sink,
        expected=run.observed.rows + chunk_rows,  # and the warm-up chunk
        load=load,
    )
    p50, p95, p99 = run.latencies_ms
    keeps_up = run.sent_rows_per_s >= 0.95 * run.target_rows_per_s and run.catch_up_s <= CATCH_UP_S
    bound = MAX_WAIT_MS + 3 * (run.observed.server.batch_ms or ctx.timing.batch_ms)
    return replace(
        case,
        target_rows_per_s=run.target_rows_per_s,
        sent_rows_per_s=run.sent_rows_per_s,
        catch_up_s=round(run.catch_up_s, 2),
        p50_ms=p50,
        p95_ms=p95,
        p99_ms=p99,
        p99_bound_ms=bound,
        keeps_up=keeps_up,
    )


def _backlogs(
    ctx: _Ctx,
    broker: Broker,
    sizes: dict[int, int],
    *,
    reference_s: float,
    publish_s: dict[str, float],
) -> list[Case]:
    """Per message size: one backlog, drained by rowbatch into each sink and by the reference
    into PostgreSQL, all against ``ctx.timing.model``."""
    bench, timing = ctx.bench, ctx.timing
    cases: list[Case] = []
    for rows_per_message, rows in sizes.items():
        sinks: tuple[SinkKind, ...] = (
            ("postgres", "parquet")
            if rows_per_message in PARQUET_SIZES and timing.model == MODEL
            else ("postgres",)
        )
        feed = create_feed(bench.stack, broker, readers=len(sinks) + 1)
        messages = backlog("numeric", rows, rows_per_message, prefix=unique("sat"))
        published = publish(bench.stack, feed, messages)
        publish_s[f"{broker} {timing.model} {rows_per_message}"] = round(published.seconds, 2)
        runs = [
            _backlog(ctx, feed, i, sink, rows_per_message=rows_per_message, rows=rows)
            for i, sink in enumerate(sinks)
        ]
        ref = reference(
            bench,
            feed,
            len(sinks),
            rows=rows,
            model=timing.model,
            max_batch=timing.max_batch,
            timeout_s=reference_s,
            log_name=f"reference_{broker}_{timing.model}_{rows_per_message}",
        )
        for case in runs:
            if case.sink == "postgres":
                speedup = case.rows_per_s / ref.rows_per_s if ref.rows_per_s > 0 else None
                case = replace(case, reference_rows_per_s=ref.rows_per_s, speedup=speedup)  # noqa: PLW2901
            cases.append(case)
    return cases


def run(bench: Bench) -> SaturationResult:
    url = bench.stack.triton.grpc_url
    timing = model_timing(url)
    batched = model_timing(url, BATCHED_MODEL)
    sizes = QUICK_BACKLOG_ROWS if bench.quick else BACKLOG_ROWS
    steady_s = QUICK_STEADY_S if bench.quick else STEADY_S
    reference_s = QUICK_REFERENCE_S if bench.quick else REFERENCE_S
    step_s = 0.5 if bench.quick else 1.5
    probes: list[BrokerProbe] = []
    cases: list[Case] = []
    publish_s: dict[str, float] = {}
    for broker in BROKERS:
        found = probe(url, timing, step_s)
        probes.append(BrokerProbe(broker, found))
        ctx = _Ctx(bench, timing, found.rows_per_s)
        cases += _backlogs(ctx, broker, sizes, reference_s=reference_s, publish_s=publish_s)
        for chunk_rows, load in STEADY:
            cases.append(_steady(ctx, broker, load, steady_s, chunk_rows))
        found = probe(url, batched, step_s)
        probes.append(BrokerProbe(broker, found, BATCHED_MODEL))
        ctx = _Ctx(bench, batched, found.rows_per_s)
        batched_sizes = {size: sizes[size] for size in BATCHED_SIZES}
        cases += _backlogs(ctx, broker, batched_sizes, reference_s=reference_s, publish_s=publish_s)
    return SaturationResult(
        MODEL,
        timing,
        timing.ceiling,
        timing.batch_ms,
        tuple(probes),
        tuple(cases),
        dict(sizes),
        steady_s,
        reference_s,
        MAX_WAIT_MS,
        BUDGET / MiB,
        publish_s,
        batched,
    )
