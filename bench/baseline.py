"""Section 3, the naive baseline: ``bench/naive.py`` (one inference request per message, acked
after its own call) and a rowbatch consumer process on **the same backlog** (one topic, a reader
each), with the same model (``embedder``) and sink (PostgreSQL), on messages of 1 and of 16
rows: the speed-up is rowbatch's rows/s over the naive rows/s on that backlog."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from bench.procs import consumers, drain
from bench.report import Table, rate, times
from bench.stack import (
    BROKERS,
    TEXT_BINDING,
    Bench,
    Broker,
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
from harness.service import REPO_ROOT

SIZES = {1: 20_000, 16: 2_000}
"""Messages per backlog by rows per message."""
QUICK_SIZES = {1: 200, 16: 50}


@dataclass(frozen=True)
class NaiveRun:
    broker: Broker
    rows_per_message: int
    backlog_rows: int
    """Rows published: the same backlog for both consumers."""
    rows: int
    """Rows the naive consumer wrote before it finished or timed out."""
    seconds: float
    rows_per_s: float
    rowbatch_rows_per_s: float | None
    """rowbatch on the same backlog, into PostgreSQL (first row written to the last)."""
    rowbatch_rows: int = 0
    """Rows rowbatch wrote (the whole backlog)."""
    speedup: float | None = None


@dataclass(frozen=True)
class NaiveResult:
    runs: tuple[NaiveRun, ...]
    timeout_s: float

    def find(self, broker: Broker, rows_per_message: int) -> NaiveRun | None:
        return next(
            (r for r in self.runs if (r.broker, r.rows_per_message) == (broker, rows_per_message)),
            None,
        )

    def table(self) -> Table:
        rows = tuple(
            (
                f"{r.broker} -> postgres",
                str(r.rows_per_message),
                f"{r.backlog_rows:,}",
                f"{r.rows:,}",
                rate(r.rows_per_s),
                "-" if r.rowbatch_rows_per_s is None else rate(r.rowbatch_rows_per_s),
                times(r.speedup),
            )
            for r in self.runs
        )
        return Table(
            "3. Naive baseline: one inference request per message (bench/naive.py) vs rowbatch, "
            "same backlog, embedder",
            (
                "broker -> sink",
                "rows/msg",
                "backlog",
                "naive rows",
                "naive rows/s",
                "rowbatch rows/s",
                "speed-up",
            ),
            rows,
            (
                "Both consumers read the same published backlog (a reader each), infer with "
                "embedder and write into PostgreSQL; rows/s from the first row written to the "
                "last.",
                "Naive: Pub/Sub callback threads of the client library (10 by default), Kafka "
                "one record at a time; decode, infer, INSERT + COMMIT, ack/commit; at most "
                f"{self.timeout_s:g} s. rowbatch: one consumer process, defaults.",
            ),
        )


def _naive(bench: Bench, feed: Feed, *, rows: int, timeout_s: float) -> tuple[int, float]:
    """``python -m bench.naive`` on reader 0: rows it wrote and their seconds."""
    table = unique(f"naive_{feed.broker}")
    stack = bench.stack
    argv = [
        sys.executable, "-m", "bench.naive", "--broker", feed.broker,
        "--triton", stack.triton.grpc_url, "--model", "embedder",
        "--dsn", stack.postgres.dsn, "--table", table, "--rows", str(rows),
        "--timeout-s", str(timeout_s),
    ]  # fmt: skip
    if feed.broker == "kafka":
        argv += ["--bootstrap", stack.kafka.bootstrap_servers, "--topic", feed.topic]
        argv += ["--group", feed.readers[0]]
    else:
        argv += ["--subscription", feed.readers[0]]
    env = {**os.environ, **stack.pubsub.env()}
    log = bench.dir("naive") / f"{table}.log"
    with log.open("wb") as err:
        done = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            timeout=timeout_s + 60,
            check=True,
        )
    result = json.loads(done.stdout.decode().strip().splitlines()[-1])
    written = count_rows(bench, "postgres", table)
    remove_table(bench, "postgres", table)
    return written, float(result["seconds"])


def _rowbatch(bench: Bench, feed: Feed, *, rows: int) -> tuple[int, float]:
    """One rowbatch consumer process on reader 1 until the whole backlog is written: rows in
    its table and its rows/s."""
    table = unique(f"naive_rowbatch_{feed.broker}")
    config = consumer_config(
        bench.stack,
        feed,
        "embedder",
        dict(TEXT_BINDING),
        sink_config(bench, "postgres", table),
        reader=1,
    )
    started = time.monotonic()
    with consumers(bench.dir("naive"), table, config) as procs:
        drained = drain(procs, rows, started, timeout_s=300.0)
        procs[0].terminate()
    written = count_rows(bench, "postgres", table)
    remove_table(bench, "postgres", table)
    return written, drained.rows_per_s


def _run_one(
    bench: Bench, broker: Broker, *, rows_per_message: int, messages: int, timeout_s: float
) -> NaiveRun:
    feed = create_feed(bench.stack, broker, readers=2)
    rows = rows_per_message * messages
    publish(bench.stack, feed, backlog("text", rows, rows_per_message, prefix=unique("naive")))
    written, seconds = _naive(bench, feed, rows=rows, timeout_s=timeout_s)
    # Rows after the first message, over the time from its write to the last one's.
    per_s = (written - rows_per_message) / seconds if seconds > 0 else 0.0
    rowbatch_rows, rowbatch = _rowbatch(bench, feed, rows=rows)
    return NaiveRun(
        broker,
        rows_per_message,
        rows,
        written,
        seconds,
        per_s,
        rowbatch,
        rowbatch_rows,
        rowbatch / per_s if rowbatch and per_s > 0 else None,
    )


def run(bench: Bench) -> NaiveResult:
    timeout_s = 10.0 if bench.quick else 25.0
    sizes = QUICK_SIZES if bench.quick else SIZES
    runs = [
        _run_one(bench, broker, rows_per_message=size, messages=messages, timeout_s=timeout_s)
        for broker in BROKERS
        for size, messages in sizes.items()
    ]
    return NaiveResult(tuple(runs), timeout_s)
