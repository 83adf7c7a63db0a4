"""Section 7, scaling: does adding consumers help? A backlog of numeric rows in 500-row Arrow
messages waits on the broker, then N consumer processes are started at once and drain it into
PostgreSQL against ``fixed_latency`` (deploy/models/fixed_latency: a fixed wall time per
execution on one instance, like an accelerator, so the server and not this machine's CPUs sets
the ceiling). On Kafka (6 partitions, N = 1, 2, 3) the members join the group one after
another while the backlog drains, so the group rebalances mid-drain, as when an autoscaler adds
replicas; on Pub/Sub (N = 1, 2) flow control bounds what each process holds. One consumer with
its default requests in flight keeps this server nearly always busy, so N = 1, 2, 3 are run
once more with one request in flight each: then one process leaves the server idle between
requests, and more processes have room to help.

Per run: rows/s (first row written to the last row in the table), the ratio to one process,
the rows each process wrote, the server's busy fraction, the rows the server executed more
than once (Triton's inference count minus the rows published) and the Kafka records taken
back from the pipeline at revokes (``rowbatch_kafka_records_withdrawn_total``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from bench.procs import ConsumerProcess, Drain, consumers, wait_for
from bench.report import Table, rate
from bench.saturation import MAX_WAIT_MS
from bench.saturation_server import MODEL, ServerWindow, model_timing, snapshot
from bench.stack import (
    KAFKA_PARTITIONS,
    NOOP_NUMERIC_BINDING,
    Bench,
    Broker,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    sink_config,
    unique,
)

CASES: tuple[tuple[Broker, int, int | None], ...] = (
    ("kafka", 1, None),
    ("kafka", 2, None),
    ("kafka", 3, None),
    ("pubsub", 1, None),
    ("pubsub", 2, None),
    ("kafka", 1, 1),
    ("kafka", 2, 1),
    ("kafka", 3, 1),
)
"""(broker, processes, ``model.max_in_flight``: None for the default)."""
ROWS = 300_000
QUICK_ROWS = 30_000
CHUNK_ROWS = 500
WITHDRAWN = "rowbatch_kafka_records_withdrawn_total"
TARGET_RATIO = 0.95
"""N processes drain at least as fast as one (within 5 % for run-to-run noise)..."""
TARGET_REPEATED = 0.02
"""...and the server executes fewer than 2 % of the rows twice."""


@dataclass(frozen=True)
class ScalingRun:
    broker: Broker
    processes: int
    max_in_flight: int | None
    """``model.max_in_flight`` (None: the default, from the model's config)."""
    rows: int
    rows_per_s: float
    seconds: float
    """From the first row written to the last row in the table."""
    startup_s: float
    """From starting the processes to their first row written."""
    rows_in_sink: int
    per_process_rows: tuple[int, ...]
    """Rows each process wrote (how the broker spread the work; rewrites included)."""
    executed_rows: int
    """Rows the server executed during the run (Triton's inference count)."""
    busy: float
    """The server's compute time over the drain's wall time."""
    withdrawn: int
    """Records taken back from the pipelines at revokes (Kafka)."""

    @property
    def repeated(self) -> float:
        """The share of the rows the server executed more than once."""
        return max(0, self.executed_rows - self.rows) / self.rows if self.rows else 0.0


@dataclass(frozen=True)
class ScalingResult:
    cpu_count: int
    model: str
    ceiling: float
    """The model's analytic ceiling, rows/s."""
    chunk_rows: int
    runs: tuple[ScalingRun, ...]

    def ratio(self, run: ScalingRun) -> float | None:
        one = next(
            (
                r
                for r in self.runs
                if (r.broker, r.max_in_flight, r.processes) == (run.broker, run.max_in_flight, 1)
            ),
            None,
        )
        return run.rows_per_s / one.rows_per_s if one and one.rows_per_s else None

    def meets(self, run: ScalingRun) -> bool:
        ratio = self.ratio(run)
        return (
            (ratio is None or ratio >= TARGET_RATIO)
            and run.repeated < TARGET_REPEATED
            and run.rows_in_sink == run.rows
        )

    def table(self) -> Table:
        rows = []
        for r in self.runs:
            ratio = self.ratio(r)
            rows.append(
                (
                    r.broker,
                    "default" if r.max_in_flight is None else str(r.max_in_flight),
                    str(r.processes),
                    f"{r.rows:,}",
                    rate(r.rows_per_s),
                    "-" if ratio is None else f"{ratio:.2f}x",
                    f"{r.busy:.0%}",
                    " / ".join(f"{n:,}" for n in r.per_process_rows),
                    f"{r.executed_rows:,} ({r.repeated:.1%})",
                    str(r.withdrawn) if r.broker == "kafka" else "-",
                    f"{r.startup_s:.1f}",
                    "ok" if r.rows_in_sink == r.rows else f"{r.rows_in_sink:,}!",
                    "yes" if self.meets(r) else "NO",
                )
            )
        return Table(
            f"7. Scaling: N consumer processes draining one backlog against {self.model} "
            f"(ceiling {rate(self.ceiling)} rows/s) -> PostgreSQL",
            (
                "broker",
                "in flight",
                "N",
                "rows",
                "rows/s",
                "vs 1",
                "busy",
                "rows per process",
                "executed (repeated)",
                "taken back",
                "start s",
                "in sink",
                "target",
            ),
            tuple(rows),
            (
                f"Backlog ({self.chunk_rows}-row Arrow messages; Kafka: {KAFKA_PARTITIONS} "
                "partitions) published before the processes start; they start at once and "
                "join one after another (Kafka: the group rebalances while it drains). rows/s "
                "from the first row written to the last row in the table; busy: the server's "
                "compute time in the run over that window (above 100 %: it also computed "
                "outside it, e.g. rows run again after the table was complete); executed: "
                "rows Triton ran (repeated: more than once); taken back: records of revoked "
                "partitions the pipelines dropped before sending them to the model.",
                f"Target: N processes >= {TARGET_RATIO:.2f}x one, repeated < "
                f"{TARGET_REPEATED:.0%}. This machine has {self.cpu_count} CPU cores shared by "
                "Triton, the broker, PostgreSQL and the consumers; the model's time per batch "
                "is fixed, so the server has room only while one process leaves it idle.",
            ),
        )


def _drain(
    bench: Bench, table: str, procs: list[ConsumerProcess], rows: int, started: float
) -> Drain:
    """Wait until every row is in ``table``, then until no process holds anything (so that
    a row executed again late is counted too). Timed from the first row written."""
    first: list[float] = []

    def complete() -> bool:
        written = sum(p.rows_written() for p in procs)
        if written and not first:
            first.append(time.monotonic())
        return written >= rows and count_rows(bench, "postgres", table) >= rows

    wait_for(complete, 600, f"{rows:,} rows in the table", procs)
    done = time.monotonic()

    def idle() -> bool:
        held = (p.metric("rowbatch_inflight_messages") for p in procs)
        return not any(held)

    wait_for(idle, 30, "the processes to finish what they hold", procs)
    began = first[0] if first else started
    return Drain(rows, max(done - began, 1e-3), began - started)


def _run(bench: Bench, broker: Broker, count: int, in_flight: int | None, rows: int) -> ScalingRun:
    feed = create_feed(bench.stack, broker)
    publish(bench.stack, feed, backlog("numeric", rows, CHUNK_ROWS, prefix=unique("scale")))
    table = unique(f"scaling_{broker}_{count}")
    config = consumer_config(
        bench.stack,
        feed,
        MODEL,
        NOOP_NUMERIC_BINDING,
        sink_config(bench, "postgres", table),
        model_extra={"max_wait_ms": MAX_WAIT_MS}
        | ({} if in_flight is None else {"max_in_flight": in_flight}),
    )
    url = bench.stack.triton.grpc_url
    instances = model_timing(url).instances
    before = snapshot(url)
    started = time.monotonic()
    with consumers(bench.dir("scaling"), table, config, count) as procs:
        drained = _drain(bench, table, procs, rows, started)
        after = snapshot(url)
        per_process = tuple(int(p.rows_written()) for p in procs)
        withdrawn = sum(int(p.metric(WITHDRAWN) or 0) for p in procs)
        for proc in procs:
            proc.terminate()
    in_sink = count_rows(bench, "postgres", table)
    remove_table(bench, "postgres", table)
    server = ServerWindow.between(before, after, instances)
    return ScalingRun(
        broker,
        count,
        in_flight,
        rows,
        drained.rows_per_s,
        round(drained.seconds, 2),
        round(drained.startup_s, 2),
        in_sink,
        per_process,
        server.rows,
        server.infer_s / (drained.seconds * instances),
        withdrawn,
    )


def run(bench: Bench) -> ScalingResult:
    rows = QUICK_ROWS if bench.quick else ROWS
    timing = model_timing(bench.stack.triton.grpc_url)
    runs = []
    for broker, count, in_flight in CASES:
        done = _run(bench, broker, count, in_flight, rows)
        print(
            f"  {broker} x{count} (in flight {in_flight or 'default'}): "
            f"{rate(done.rows_per_s)} rows/s, repeated {done.repeated:.1%}",
            flush=True,
        )
        runs.append(done)
    return ScalingResult(os.cpu_count() or 1, MODEL, timing.ceiling, CHUNK_ROWS, tuple(runs))
