"""Section 6, memory: the ``expander`` model (8 bytes in, 8 KiB out per row: outputs 1024x
the inputs) with a 64 MiB budget; the consumer's peak RSS (``VmHWM``) against the budget.
Pub/Sub (the emulator ignores flow control and pushes the whole backlog at once, the harder
case), SQLite sink, Arrow chunks of 2,000 rows, as in tests/integration/test_consumer_process.py."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.procs import consumers, wait_for, wait_ready
from bench.report import Table
from bench.stack import (
    Bench,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    sink_config,
    unique,
)
from consumer.config import MiB
from producer.wire import encode_chunk

BUDGET = 64 * MiB
ALLOWANCE_MB = 150.0
EXPAND_BYTES_PER_ROW = 2048 * 4
CHUNK_ROWS = 2_000


@dataclass(frozen=True)
class MemoryResult:
    rows: int
    output_mib: float
    budget_mib: float
    baseline_rss_mib: float
    peak_rss_mib: float
    peak_inflight_mib: float
    seconds: float

    @property
    def limit_mib(self) -> float:
        return self.budget_mib + ALLOWANCE_MB * 1e6 / MiB

    def table(self) -> Table:
        over = self.peak_rss_mib - self.baseline_rss_mib
        return Table(
            "6. Memory: expander (outputs 1024x inputs), Pub/Sub -> SQLite",
            (
                "rows",
                "outputs",
                "budget",
                "RSS at start",
                "peak RSS",
                "peak - start",
                "peak in flight",
                "limit (budget+150 MB)",
            ),
            (
                (
                    f"{self.rows:,}",
                    f"{self.output_mib:,.0f} MiB",
                    f"{self.budget_mib:.0f} MiB",
                    f"{self.baseline_rss_mib:.0f} MiB",
                    f"{self.peak_rss_mib:.0f} MiB",
                    f"{over:.0f} MiB",
                    f"{self.peak_inflight_mib:.0f} MiB",
                    f"{self.limit_mib:.0f} MiB",
                ),
            ),
            (
                "Peak RSS is VmHWM of the consumer process; 'RSS at start' is VmRSS once ready "
                "(interpreter, libraries, clients), before anything was published.",
            ),
        )


def run(bench: Bench) -> MemoryResult:
    import numpy as np  # noqa: PLC0415

    rows = 10_000 if bench.quick else 60_000
    feed = create_feed(bench.stack, "pubsub")
    table = unique("memory")
    config = consumer_config(
        bench.stack,
        feed,
        "expander",
        {"inputs": {"x": "X"}, "outputs": {"Y": "y"}, "passthrough": {"id": "int64"}},
        sink_config(bench, "sqlite", table),
        model_extra={"max_wait_ms": 50},
        budget_bytes=BUDGET,
    )
    ids = np.arange(rows, dtype=np.int64)
    chunks = [
        encode_chunk("numbers", {"id": ids[s : s + CHUNK_ROWS], "x": ids[s : s + CHUNK_ROWS] * 7},
                     "arrow", f"{table}-{s}")
        for s in range(0, rows, CHUNK_ROWS)
    ]  # fmt: skip
    peak_inflight = 0.0
    with consumers(bench.dir("memory"), table, config) as procs:
        proc = procs[0]
        wait_ready(procs)
        baseline = proc.memory_kib()["VmRSS"] / 1024
        started = time.monotonic()
        publish(bench.stack, feed, chunks)

        def done() -> bool:
            nonlocal peak_inflight
            m = proc.metrics() or {}
            peak_inflight = max(peak_inflight, m.get("rowbatch_inflight_bytes", 0.0))
            return m.get("rowbatch_rows_written_total", 0.0) >= rows

        wait_for(done, 300, f"{rows} rows written", procs, every_s=0.05)
        seconds = time.monotonic() - started
        peak = proc.memory_kib()["VmHWM"] / 1024
        proc.terminate()
    written = count_rows(bench, "sqlite", table)
    remove_table(bench, "sqlite", table)
    if written != rows:
        raise RuntimeError(f"memory: {written} of {rows} rows in the sink")
    return MemoryResult(
        rows,
        rows * EXPAND_BYTES_PER_ROW / MiB,
        BUDGET / MiB,
        baseline,
        peak,
        peak_inflight / MiB,
        round(seconds, 1),
    )
