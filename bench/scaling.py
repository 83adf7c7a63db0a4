"""Section 7, scaling: 1, 2 and 4 consumer processes in one Kafka group (6 partitions) and on
one Pub/Sub subscription, draining a backlog into PostgreSQL (embedder); rows/s each.

The processes are started and ready (and the Kafka group settled) before the backlog is
published, all at once (publishing is ~50x faster than consuming), so the work can spread."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from bench.procs import consumers, drain, wait_ready
from bench.report import Table, rate
from bench.stack import (
    BROKERS,
    TEXT_BINDING,
    Bench,
    Broker,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    unique,
)

PROCESSES = (1, 2, 4)
CHUNK_ROWS = 500
SETTLE_S: dict[Broker, float] = {"kafka": 8.0, "pubsub": 1.0}
"""After every process is ready and before the backlog is published: a Kafka group rebalances
each time a member joins (members rejoin on their next heartbeat, every 3 s), and a backlog
published earlier would all go to whichever member was assigned first."""


@dataclass(frozen=True)
class ScalingRun:
    broker: Broker
    processes: int
    rows: int
    rows_per_s: float
    rows_in_sink: int
    per_process_rows: tuple[int, ...]
    """Rows each process wrote (how the broker spread the work)."""


@dataclass(frozen=True)
class ScalingResult:
    cpu_count: int
    runs: tuple[ScalingRun, ...]

    def table(self) -> Table:
        base = {r.broker: r.rows_per_s for r in self.runs if r.processes == 1}
        rows = tuple(
            (
                r.broker,
                str(r.processes),
                f"{r.rows:,}",
                rate(r.rows_per_s),
                f"{r.rows_per_s / base[r.broker]:.2f}x" if base.get(r.broker) else "-",
                " / ".join(f"{n:,}" for n in r.per_process_rows),
                "ok" if r.rows_in_sink == r.rows else f"{r.rows_in_sink:,}!",
            )
            for r in self.runs
        )
        return Table(
            "7. Scaling: consumer processes in one group / on one subscription -> PostgreSQL",
            ("broker", "processes", "rows", "rows/s", "vs 1", "rows per process", "in sink"),
            rows,
            (
                f"Backlog published once all processes were ready. This machine has "
                f"{self.cpu_count} CPU cores shared by Triton (one model "
                "instance), the broker, PostgreSQL and the consumers: more processes add "
                "contention, not cores.",
            ),
        )


def run(bench: Bench) -> ScalingResult:
    rows = 10_000 if bench.quick else 100_000
    runs = []
    for broker in BROKERS:
        for count in PROCESSES:
            feed = create_feed(bench.stack, broker)
            messages = backlog("text", rows, CHUNK_ROWS, prefix=unique("scale"))
            table = unique(f"scaling_{broker}_{count}")
            sink = {"kind": "postgres", "dsn": bench.stack.postgres.dsn, "table": table}
            config = consumer_config(bench.stack, feed, "embedder", TEXT_BINDING, sink)
            with consumers(bench.dir("scaling"), table, config, count) as procs:
                wait_ready(procs)
                time.sleep(SETTLE_S[broker])
                started = time.monotonic()
                publish(bench.stack, feed, messages)
                drained = drain(procs, rows, started)
                per_process = tuple(int(p.rows_written()) for p in procs)
                for proc in procs:
                    proc.terminate()
            in_sink = count_rows(bench, "postgres", table)
            remove_table(bench, "postgres", table)
            runs.append(ScalingRun(broker, count, rows, drained.rows_per_s, in_sink, per_process))
    return ScalingResult(os.cpu_count() or 1, tuple(runs))
