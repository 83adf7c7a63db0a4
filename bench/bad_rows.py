"""Section ``bad_rows``: what one bad row in a 500-row message costs (issue 46). The same
backlog of 500-row text messages drained by one consumer through the ``chaos`` model (the
``embedder`` with a reject marker: a request holding a marked row answers INVALID_ARGUMENT)
into PostgreSQL four times per broker, side by side: clean; with 0.1 % of the rows marked
(one row in every other message) with the default serial isolation and with
``[model] isolation = "concurrent"``; and with 0.1 % of the rows null in the model's input
(``input`` cause: set apart at intake by the input checks, never sent). With the marked rows,
the batches that hold them are bisected down to the rows, those rows dead-lettered as row parts
and every other row written.

Per run: rows/s from the first row written to the last row settled, the requests Triton
answered (its statistics, successes and failures), the consumer's CPU per row, and the rows and
messages dead-lettered. The ratio of the two runs' rows/s is the cost of isolating the rows."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from bench.procs import consumers, wait_for, wait_ready
from bench.report import Table, Target
from bench.stack import (
    TEXT_BINDING,
    Bench,
    Broker,
    consumer_config,
    create_feed,
    publish,
    sink_config,
    unique,
)
from bench.triton import server_stats
from harness.chaos import ChaosControl
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk

MESSAGES = 200
QUICK_MESSAGES = 20
ROWS = 500
BAD_SHARE = 0.001
MARKER = "POISON-ROW"
TARGET_RATIO = 0.9


@dataclass(frozen=True)
class BadRowsRun:
    broker: Broker
    isolation: str
    """``[model] isolation``: ``serial`` (the default) or ``concurrent``."""
    cause: str
    """What makes the bad rows bad: ``model`` (the server rejects them) or ``input`` (a null
    in the model's input: the input checks set them apart)."""
    bad_rows: int
    rows: int
    rows_per_s: float
    requests: int
    cpu_us_per_row: float
    rows_dead_lettered: int
    messages_dead_lettered: int


@dataclass(frozen=True)
class BadRowsResult:
    runs: tuple[BadRowsRun, ...]

    def ratio(
        self, broker: Broker, isolation: str = "serial", cause: str = "model"
    ) -> float | None:
        clean = next((r for r in self.runs if r.broker == broker and not r.bad_rows), None)
        bad = next(
            (
                r
                for r in self.runs
                if r.broker == broker
                and r.bad_rows
                and r.isolation == isolation
                and r.cause == cause
            ),
            None,
        )
        if clean is None or bad is None or not clean.rows_per_s:
            return None
        return bad.rows_per_s / clean.rows_per_s

    def table(self) -> Table:
        return Table(
            "Bad rows: 500-row messages, clean and with 0.1 % of the rows rejected by the model "
            "or null in its input",
            (
                "broker",
                "cause",
                "isolation",
                "bad rows",
                "rows",
                "rows/s",
                "vs clean",
                "requests",
                "CPU us/row",
                "rows dead-lettered",
                "messages dead-lettered",
            ),
            tuple(
                (
                    r.broker,
                    r.cause if r.bad_rows else "-",
                    r.isolation,
                    f"{r.bad_rows:,}",
                    f"{r.rows:,}",
                    f"{r.rows_per_s:,.0f}",
                    f"{self.ratio(r.broker, r.isolation, r.cause):.2f}x"
                    if r.bad_rows and self.ratio(r.broker, r.isolation, r.cause)
                    else "1",
                    f"{r.requests:,}",
                    f"{r.cpu_us_per_row:.1f}",
                    f"{r.rows_dead_lettered:,}",
                    f"{r.messages_dead_lettered:,}",
                )
                for r in self.runs
            ),
            (
                "Text rows (`chaos` = `embedder` with a reject marker) in 500-row messages, one "
                "consumer, PostgreSQL, published before it starts; the marked rows one per message "
                "in every other message. rows/s: first row written to the last message "
                "settled; requests: Triton's successes + failures for the model over the run; "
                "CPU: the consumer's user+sys over the run, per row; isolation: [model] "
                "isolation (concurrent: each failed batch bisected at once; the chaos model "
                "fails each request on its own rows); cause input: the bad rows are null in the "
                "model's input, set apart at intake (no isolation, no request).",
            ),
        )

    def targets(self) -> list[Target]:
        found = []
        for broker in dict.fromkeys(r.broker for r in self.runs):
            for cause, isolation in (
                ("model", "serial"),
                ("model", "concurrent"),
                ("input", "serial"),
            ):
                ratio = self.ratio(broker, isolation, cause)
                if ratio is not None:
                    what = f"{isolation} isolation" if cause == "model" else "input checks"
                    found.append(
                        Target(
                            f"bad rows {broker} ({what}): 0.1 % bad rows vs clean, rows/s",
                            f">= {TARGET_RATIO:.2f}x",
                            f"{ratio:.2f}x",
                            ratio >= TARGET_RATIO,
                        )
                    )
        return found


def _chunk(n: int, cause: str | None, prefix: str) -> EncodedChunk:
    """Message ``n``; ``cause``: one bad row in it, ``model`` (marked) or ``input`` (null)."""
    texts: list[str | None] = [f"message {n} row {r} of a bench backlog" for r in range(ROWS)]
    bad = (n * 37) % ROWS
    if cause == "model":
        texts[bad] = f"{texts[bad]} {MARKER}"
    elif cause == "input":
        texts[bad] = None
    ids = np.arange(n * ROWS, (n + 1) * ROWS, dtype=np.int64)
    return encode_chunk("bench", {"id": ids, "text": texts}, "arrow", f"{prefix}-{n}")


def _requests(url: str) -> int:
    """Requests Triton answered for ``chaos`` so far, successes and failures."""
    stats = server_stats(url, "chaos")
    return stats.requests + stats.failed


def _run(
    bench: Bench, broker: Broker, messages: int, cause: str | None, isolation: str
) -> BadRowsRun:
    stack = bench.stack
    feed = create_feed(stack, broker)
    prefix = unique("bad")
    every = round(1 / (BAD_SHARE * ROWS))  # one bad row in every `every`-th message
    chunks = [_chunk(n, cause if n % every == 0 else None, prefix) for n in range(messages)]
    bad_rows = sum(1 for n in range(messages) if cause and n % every == 0)
    publish(stack, feed, chunks)
    table = unique("bad_rows")
    config = consumer_config(
        stack,
        feed,
        "chaos",
        TEXT_BINDING,
        sink_config(bench, "postgres", table),
        model_extra={"max_wait_ms": 50, "isolation": isolation},
    )
    total = messages * ROWS
    before = _requests(stack.triton.grpc_url)
    with consumers(bench.dir("bad_rows"), table, config) as procs:
        proc = procs[0]
        wait_ready(procs)
        started_cpu = proc.cpu()

        def settled() -> float:
            acked = proc.metric("rowbatch_messages_acked_total") or 0.0
            whole = proc.metric("rowbatch_messages_dead_lettered_total") or 0.0
            return acked + whole

        first: list[float] = []

        def done() -> bool:
            if not first and proc.rows_written() > 0:
                first.append(time.monotonic())
            return settled() >= messages

        wait_for(done, 600, f"{messages} messages settled", procs)
        seconds = time.monotonic() - (first[0] if first else time.monotonic())
        cpu = proc.cpu()
        rows_dead = int(proc.metric("rowbatch_rows_dead_lettered_total") or 0)
        messages_dead = int(proc.metric("rowbatch_messages_dead_lettered_total") or 0)
    written = total - bad_rows
    used = cpu.total_s - started_cpu.total_s
    return BadRowsRun(
        broker,
        isolation,
        cause or "model",
        bad_rows,
        total,
        written / seconds if seconds > 0 else 0.0,
        _requests(stack.triton.grpc_url) - before,
        used / total * 1e6,
        rows_dead,
        messages_dead,
    )


def run(bench: Bench) -> BadRowsResult:
    messages = QUICK_MESSAGES if bench.quick else MESSAGES
    control = bench.stack.triton.chaos_control
    ChaosControl(reject_marker=MARKER).write(control)
    try:
        runs = tuple(
            _run(bench, broker, messages, cause, isolation)
            for broker in ("kafka", "pubsub")
            for cause, isolation in (
                (None, "serial"),
                ("model", "serial"),
                ("model", "concurrent"),
                ("input", "serial"),
            )
        )
    finally:
        ChaosControl().write(control)
    return BadRowsResult(runs)
