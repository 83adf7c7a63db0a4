"""Section 5, latency: a steady publish rate at 50 % and 90 % of the end-to-end capacity
(Kafka -> PostgreSQL, section 2), publish-to-written percentiles per row, and the batch fill.

"Written" is the PostgreSQL ``clock_timestamp()`` of the INSERT that stored the row: the
benchmark adds a ``written_at`` column with that default to the result table once the consumer
has created it (the sink accepts extra columns with defaults). "Published" is the wall-clock
time just before the chunk was handed to the Kafka producer (same host, same clock). The first
``WARMUP_S`` seconds of each run are left out."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from bench.e2e import E2eResult
from bench.procs import ConsumerProcess, consumers, drain, wait_ready
from bench.report import Table, rate
from bench.stack import (
    TEXT_BINDING,
    Bench,
    Feed,
    backlog,
    consumer_config,
    create_feed,
    publish,
    publisher,
    remove_table,
    unique,
)
from bench.triton import server_stats
from rowbatch.producer.loadgen.generate import generate_columns
from rowbatch.producer.loadgen.rate import RateLimiter
from rowbatch.producer.loadgen.spec import LoadSpec
from rowbatch.producer.publishers.window import PublishWindow
from rowbatch.wire.chunks.encode import encode_chunk

CHUNK_ROWS = 100
WARMUP_S = 2.0
MAX_WAIT_MS = 100.0
LOADS = (0.5, 0.9)


@dataclass(frozen=True)
class LatencyRun:
    load: float
    target_rows_per_s: float
    published_rows_per_s: float
    rows: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    batch_fill: float
    server_batch_ms: float
    """Triton's compute time per executed batch during the run."""
    server_rows_per_batch: float

    @property
    def p99_bound_ms(self) -> float:
        """The p99 target for the 50 % run: max_wait + 3 x the server's batch time."""
        return MAX_WAIT_MS + 3 * self.server_batch_ms


@dataclass(frozen=True)
class LatencyResult:
    broker: str
    sink: str
    capacity_rows_per_s: float
    capacity_from: str
    max_wait_ms: float
    chunk_rows: int
    duration_s: float
    runs: tuple[LatencyRun, ...]

    def find(self, load: float) -> LatencyRun | None:
        return next((r for r in self.runs if r.load == load), None)

    def table(self) -> Table:
        rows = tuple(
            (
                f"{r.load:.0%}",
                rate(r.target_rows_per_s),
                rate(r.published_rows_per_s),
                f"{r.p50_ms:,.0f}",
                f"{r.p95_ms:,.0f}",
                f"{r.p99_ms:,.0f}",
                f"{r.batch_fill:.0%}",
                f"{r.server_batch_ms:.1f} ({r.server_rows_per_batch:.0f} rows)",
                f"{r.p99_bound_ms:,.0f}",
            )
            for r in self.runs
        )
        return Table(
            f"5. Latency: steady load on {self.broker} -> {self.sink}, embedder, "
            f"publish to written (ms)",
            (
                "load",
                "target rows/s",
                "sent rows/s",
                "p50",
                "p95",
                "p99",
                "fill",
                "server batch ms",
                "max_wait+3xbatch",
            ),
            rows,
            (
                f"Capacity {self.capacity_rows_per_s:,.0f} rows/s ({self.capacity_from}); "
                f"max_wait_ms {self.max_wait_ms:g}; chunks of {self.chunk_rows} rows; "
                f"{self.duration_s:g} s per load, first {WARMUP_S:g} s left out.",
            ),
        )


async def _paced(
    bench: Bench, feed: Feed, rows_per_s: float, seconds: float
) -> tuple[dict[str, float], int]:
    """Publish text chunks at ``rows_per_s`` for ``seconds``: chunk id -> wall time sent, and
    the rows sent."""
    total = int(rows_per_s * seconds)
    spec = LoadSpec(rows=total, chunk_rows=CHUNK_ROWS, kind="text", id_prefix=unique("lat"))
    sent: dict[str, float] = {}
    limiter = RateLimiter(rows_per_s)
    async with publisher(bench.stack, feed) as pub:
        window = PublishWindow(pub, max_in_flight=64)
        for index in range(spec.chunks):
            columns = generate_columns(spec, index)
            await limiter.acquire(len(columns["id"]))
            chunk = encode_chunk(spec.table, columns, spec.encoding, spec.chunk_id(index))
            sent[chunk.headers.chunk_id] = time.time()
            await window.submit(chunk)
        await window.drain()
    return sent, total


def _latencies(dsn: str, table: str, sent: dict[str, float]) -> np.ndarray[Any, Any]:
    start = min(sent.values()) + WARMUP_S
    query = sql.SQL("SELECT chunk_id, extract(epoch FROM written_at) FROM {}").format(
        sql.Identifier(table)
    )
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    return np.array(
        [float(at) - sent[cid] for cid, at in rows if sent[cid] >= start], dtype=np.float64
    )


def _fill(proc: ConsumerProcess) -> tuple[float, float]:
    m = proc.metrics() or {}
    return (
        m.get("rowbatch_batch_fill_ratio_sum", 0.0),
        m.get("rowbatch_batch_fill_ratio_count", 0.0),
    )


def _one(bench: Bench, load: float, capacity: float, seconds: float) -> LatencyRun:
    feed = create_feed(bench.stack, "kafka")
    table = unique(f"latency_{int(load * 100)}")
    dsn = bench.stack.postgres.dsn
    sink = {"kind": "postgres", "dsn": dsn, "table": table}
    config = consumer_config(
        bench.stack, feed, "embedder", TEXT_BINDING, sink, model_extra={"max_wait_ms": MAX_WAIT_MS}
    )
    target = capacity * load
    with consumers(bench.dir("latency"), table, config) as procs:
        wait_ready(procs)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "ALTER TABLE {} ADD COLUMN written_at timestamptz DEFAULT clock_timestamp()"
                ).format(sql.Identifier(table))
            )
        fill0 = _fill(procs[0])
        stats0 = server_stats(bench.stack.triton.grpc_url, "embedder")
        started = time.monotonic()
        sent, total = asyncio.run(_paced(bench, feed, target, seconds))
        published_s = time.monotonic() - started
        drain(procs, total, started, timeout_s=120)
        stats = server_stats(bench.stack.triton.grpc_url, "embedder").minus(stats0)
        fill1 = _fill(procs[0])
        procs[0].terminate()
    lat = _latencies(dsn, table, sent) * 1000
    remove_table(bench, "postgres", table)
    batches = fill1[1] - fill0[1]
    p50, p95, p99 = (float(np.percentile(lat, q)) for q in (50, 95, 99))
    return LatencyRun(
        load,
        target,
        total / published_s,
        len(lat),
        p50,
        p95,
        p99,
        (fill1[0] - fill0[0]) / batches if batches else 0.0,
        stats.batch_ms,
        stats.rows_per_batch,
    )


def _capacity(bench: Bench, e2e: E2eResult | None) -> tuple[float, str]:
    found = e2e.find("kafka", "postgres") if e2e else None
    if found is not None:
        return found.rows_per_s, "section 2, kafka -> postgres"
    rows = 5_000 if bench.quick else 40_000
    feed = create_feed(bench.stack, "kafka")
    publish(bench.stack, feed, backlog("text", rows, 500, prefix=unique("cap")))
    table = unique("latency_capacity")
    sink = {"kind": "postgres", "dsn": bench.stack.postgres.dsn, "table": table}
    config = consumer_config(bench.stack, feed, "embedder", TEXT_BINDING, sink)
    started = time.monotonic()
    with consumers(bench.dir("latency"), table, config) as procs:
        drained = drain(procs, rows, started)
        procs[0].terminate()
    remove_table(bench, "postgres", table)
    return drained.rows_per_s, f"measured here on a {rows:,}-row backlog"


def run(bench: Bench, e2e: E2eResult | None) -> LatencyResult:
    capacity, source = _capacity(bench, e2e)
    seconds = 5.0 if bench.quick else 20.0
    runs = tuple(_one(bench, load, capacity, seconds) for load in LOADS)
    return LatencyResult(
        "kafka", "postgres", capacity, source, MAX_WAIT_MS, CHUNK_ROWS, seconds, runs
    )
