"""Section 3, the naive baseline: ``bench/naive.py`` (one inference request per message, acked
after its own call) on messages of 1 and of 16 rows, same broker, model (``embedder``) and sink
(PostgreSQL) as rowbatch's end-to-end runs; rowbatch's speed-up is its e2e rows/s on that
broker into PostgreSQL over the naive rows/s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

from bench.e2e import E2eResult
from bench.report import Table, rate, times
from bench.stack import (
    BROKERS,
    Bench,
    Broker,
    backlog,
    count_rows,
    create_feed,
    publish,
    remove_table,
    unique,
)
from harness.service import REPO_ROOT


@dataclass(frozen=True)
class NaiveRun:
    broker: Broker
    rows_per_message: int
    rows: int
    """Rows the naive consumer wrote before it finished or timed out."""
    seconds: float
    rows_per_s: float
    rowbatch_rows_per_s: float | None
    speedup: float | None


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
                f"{r.rows:,}",
                rate(r.rows_per_s),
                "-" if r.rowbatch_rows_per_s is None else rate(r.rowbatch_rows_per_s),
                times(r.speedup),
            )
            for r in self.runs
        )
        return Table(
            "3. Naive baseline: one inference request per message (bench/naive.py), embedder",
            ("broker -> sink", "rows/msg", "rows", "naive rows/s", "rowbatch rows/s", "speed-up"),
            rows,
            (
                "Naive: Pub/Sub callback threads of the client library (10 by default), Kafka "
                "one record at a time; decode, infer, INSERT + COMMIT, ack/commit.",
                "rowbatch rows/s: section 2, same broker into PostgreSQL (500-row messages).",
            ),
        )


def _run_one(
    bench: Bench,
    broker: Broker,
    *,
    rows_per_message: int,
    messages: int,
    timeout_s: float,
    rowbatch: float | None,
) -> NaiveRun:
    feed = create_feed(bench.stack, broker)
    rows = rows_per_message * messages
    publish(bench.stack, feed, backlog("text", rows, rows_per_message, prefix=unique("naive")))
    table = unique(f"naive_{broker}_{rows_per_message}")
    stack = bench.stack
    argv = [
        sys.executable, "-m", "bench.naive", "--broker", broker, "--triton", stack.triton.grpc_url,
        "--model", "embedder", "--dsn", stack.postgres.dsn, "--table", table,
        "--rows", str(rows), "--timeout-s", str(timeout_s),
    ]  # fmt: skip
    if broker == "kafka":
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
    seconds = float(result["seconds"])
    # Rows after the first message, over the time from its write to the last one's.
    per_s = (written - rows_per_message) / seconds if seconds > 0 else 0.0
    return NaiveRun(
        broker,
        rows_per_message,
        written,
        seconds,
        per_s,
        rowbatch,
        rowbatch / per_s if rowbatch and per_s > 0 else None,
    )


def run(bench: Bench, e2e: E2eResult | None) -> NaiveResult:
    timeout_s = 10.0 if bench.quick else 25.0
    sizes = {1: 200 if bench.quick else 3000, 16: 50 if bench.quick else 1000}
    runs = []
    for broker in BROKERS:
        found = e2e.find(broker, "postgres") if e2e else None
        for rows_per_message, messages in sizes.items():
            runs.append(
                _run_one(
                    bench,
                    broker,
                    rows_per_message=rows_per_message,
                    messages=messages,
                    timeout_s=timeout_s,
                    rowbatch=found.rows_per_s if found else None,
                )
            )
    return NaiveResult(tuple(runs), timeout_s)
