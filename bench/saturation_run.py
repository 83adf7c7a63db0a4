"""The runs of the saturation section (``bench/saturation.py``): a rowbatch consumer draining a
backlog and one under a steady publisher (both with Triton's statistics over the run, from
``bench/saturation_server.py``), and the reference consumer (``bench/reference.py``) on a
backlog."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from bench.procs import ConsumerProcess, wait_for
from bench.saturation_server import ModelTiming, ServerWindow, Snapshot, snapshot
from bench.stack import Bench, Feed, backlog, publish, publisher, unique
from harness.service import REPO_ROOT
from rowbatch.producer.loadgen.generate import generate_columns
from rowbatch.producer.loadgen.rate import RateLimiter
from rowbatch.producer.loadgen.spec import LoadSpec
from rowbatch.producer.publishers.window import PublishWindow
from rowbatch.wire.chunks.encode import encode_chunk

WARMUP_S = 2.0
"""Steady runs: rows published in the first seconds are left out of the latency figures."""


# --- rowbatch on a backlog --------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    """One consumer process over a measured window."""

    rows: int
    seconds: float
    startup_s: float
    """Backlog: process start to the first row written (not counted). Steady: 0."""
    server: ServerWindow
    cpu_s: float
    """User + system CPU of the consumer process over the window (``/proc/<pid>/stat``)."""
    peak_rss_mib: float
    """``VmHWM`` of the consumer process at the end."""

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_row(self) -> float:
        return self.cpu_s / self.rows * 1e6 if self.rows else 0.0


def watch_backlog(
    proc: ConsumerProcess,
    url: str,
    timing: ModelTiming,
    *,
    total: int,
    started: float,
    timeout_s: float = 300.0,
) -> Observed:
    """Poll ``/metrics`` until ``total`` rows are written. The window runs from the first poll
    that saw rows (less those rows) to the last row: start-up is left out, and Triton's
    statistics and the process's CPU are read at both ends of it."""
    first: tuple[float, float, Snapshot, float] | None = None
    deadline = time.monotonic() + timeout_s
    while True:
        written = proc.rows_written()
        now = time.monotonic()
        if written > 0 and first is None:
            first = (now, written, snapshot(url, timing.model), proc.cpu().total_s)
        if written >= total:
            break
        proc.check_alive(f"{total} rows written ({written:.0f} so far)")
        if now > deadline:
            raise TimeoutError(f"{written:.0f} of {total} rows written after {timeout_s:.0f} s")
        time.sleep(0.1)
    end, cpu_end = snapshot(url, timing.model), proc.cpu().total_s
    peak = proc.memory_kib()["VmHWM"] / 1024
    assert first is not None
    first_at, first_rows, first_snap, first_cpu = first
    server = ServerWindow.between(first_snap, end, timing.instances)
    if end.at - first_at < 0.2:  # everything was written before the first polls
        return Observed(total, end.at - started, 0.0, server, cpu_end, peak)
    return Observed(
        int(total - first_rows),
        now - first_at,
        first_at - started,
        server,
        cpu_end - first_cpu,
        peak,
    )


# --- rowbatch under a steady publisher --------------------------------------------------------


@dataclass(frozen=True)
class Steady:
    observed: Observed
    """Rows, CPU and RSS from the first publish to the last row written; Triton's statistics
    over the publishing time."""
    target_rows_per_s: float
    sent_rows_per_s: float
    catch_up_s: float
    """From the last publish to the last row written."""
    latencies_ms: tuple[float, float, float]
    """Publish-to-written p50, p95, p99 of the rows published after ``WARMUP_S``."""
    latency_rows: int


async def _paced(
    bench: Bench, feed: Feed, rows_per_s: float, seconds: float, chunk_rows: int
) -> tuple[dict[str, float], int]:
    """Numeric chunks at ``rows_per_s`` for ``seconds``: chunk id -> wall time just before it
    went to the publisher, and the rows sent."""
    total = int(rows_per_s * seconds) // chunk_rows * chunk_rows
    spec = LoadSpec(rows=total, chunk_rows=chunk_rows, kind="numeric", id_prefix=unique("sat"))
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


def add_written_at(dsn: str, table: str) -> None:
    """A ``written_at`` column stamped by PostgreSQL at INSERT (the sink accepts extra columns
    with defaults), added once the consumer has created the table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL(
                "ALTER TABLE {} ADD COLUMN written_at timestamptz DEFAULT clock_timestamp()"
            ).format(sql.Identifier(table))
        )


def _latencies(dsn: str, table: str, sent: dict[str, float]) -> np.ndarray[Any, Any]:
    start = min(sent.values()) + WARMUP_S
    query = sql.SQL("SELECT chunk_id, extract(epoch FROM written_at) FROM {}").format(
        sql.Identifier(table)
    )
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    return np.array(
        [float(at) - sent[cid] for cid, at in rows if sent.get(cid, 0.0) >= start],
        dtype=np.float64,
    )


def steady(
    bench: Bench,
    proc: ConsumerProcess,
    feed: Feed,
    table: str,
    timing: ModelTiming,
    *,
    rows_per_s: float,
    seconds: float,
    chunk_rows: int,
) -> Steady:
    """Publish at ``rows_per_s`` for ``seconds`` to a ready consumer writing into PostgreSQL
    ``table`` (with ``written_at``); wait for every row. One chunk goes first, unmeasured, and
    is waited for, so the consumer is connected (a Kafka group joined) when the clock starts."""
    url = bench.stack.triton.grpc_url
    publish(bench.stack, feed, backlog("numeric", chunk_rows, chunk_rows, prefix=unique("warm")))
    wait_for(
        lambda: proc.rows_written() >= chunk_rows, 60, "the warm-up chunk written", [proc], 0.05
    )
    base = proc.rows_written()
    snap0, cpu0 = snapshot(url, timing.model), proc.cpu().total_s
    started = time.monotonic()
    sent, total = asyncio.run(_paced(bench, feed, rows_per_s, seconds, chunk_rows))
    published_at = time.monotonic()
    snap1 = snapshot(url, timing.model)
    deadline = published_at + 120
    while proc.rows_written() < base + total:
        proc.check_alive(f"{total} rows written")
        if time.monotonic() > deadline:
            written = proc.rows_written() - base
            raise TimeoutError(f"{written:.0f} of {total} rows written after 120 s")
        time.sleep(0.05)
    done_at, cpu1 = time.monotonic(), proc.cpu().total_s
    peak = proc.memory_kib()["VmHWM"] / 1024
    lat = _latencies(bench.stack.postgres.dsn, table, sent) * 1e3
    p50, p95, p99 = (float(np.percentile(lat, q)) for q in (50, 95, 99))
    server = ServerWindow.between(snap0, snap1, timing.instances)
    observed = Observed(total, done_at - started, 0.0, server, cpu1 - cpu0, peak)
    return Steady(
        observed,
        rows_per_s,
        total / (published_at - started),
        done_at - published_at,
        (p50, p95, p99),
        len(lat),
    )


# --- the reference consumer -------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceRun:
    rows: int
    """Rows it wrote before it finished or timed out."""
    seconds: float
    rows_per_s: float
    """Rows after its first message over the time from that message's write to the last."""


def reference(
    bench: Bench,
    feed: Feed,
    reader: int,
    *,
    rows: int,
    model: str,
    max_batch: int,
    timeout_s: float,
    log_name: str,
) -> ReferenceRun:
    """``python -m bench.reference`` on ``feed``'s reader ``reader``, into a PostgreSQL table of
    its own (dropped afterwards)."""
    stack = bench.stack
    table = unique("saturation_reference")
    argv = [
        sys.executable, "-m", "bench.reference", "--broker", feed.broker,
        "--triton", stack.triton.grpc_url, "--model", model, "--dsn", stack.postgres.dsn,
        "--table", table, "--rows", str(rows), "--timeout-s", str(timeout_s),
        "--max-batch", str(max_batch),
    ]  # fmt: skip
    if feed.broker == "kafka":
        argv += ["--bootstrap", stack.kafka.bootstrap_servers, "--topic", feed.topic]
        argv += ["--group", feed.readers[reader]]
    else:
        argv += ["--subscription", feed.readers[reader]]
    env = {**os.environ, **stack.pubsub.env()}
    log = bench.dir("saturation") / f"{log_name}.log"
    try:
        with log.open("wb") as err:
            done = subprocess.run(
                argv,
                cwd=REPO_ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                timeout=timeout_s + 90,
                check=True,
            )
    finally:
        with psycopg.connect(stack.postgres.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    seconds = float(result["seconds"])
    counted = int(result["rows"]) - int(result["first_rows"])
    return ReferenceRun(
        int(result["rows"]), round(seconds, 2), counted / seconds if seconds > 0 else 0.0
    )
