"""Section 6, memory: the consumer's peak RSS (``VmHWM``) against its budget, two ways.

* Large outputs: the ``expander`` model (8 bytes in, 8 KiB out per row: outputs 1024x the
  inputs) with a 64 MiB budget. Pub/Sub (the emulator ignores flow control and pushes the
  whole backlog at once, the harder case), SQLite sink, Arrow chunks of 2,000 rows, as in
  tests/integration/test_consumer_process.py.
* Small messages: 100,000 messages of 1 row (``scorer``, numeric rows, JSON) under a 32 MiB
  budget, on Kafka and on Pub/Sub, into SQLite: what each held message costs beyond its
  bytes (objects, per-message bookkeeping) must be in the budget, and a source's read-ahead
  too. Peak RSS minus RSS once ready must stay within budget + 150 MB and the in-flight
  gauge (``rowbatch_inflight_bytes``, sampled every 20 ms) within the budget."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from bench.procs import consumers, wait_for, wait_ready
from bench.report import Table
from bench.stack import (
    BROKERS,
    SCORER_BINDING,
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
from consumer.service.config import MiB
from wire.chunks import encode_chunk
from wire.headers import Encoding

BUDGET = 64 * MiB
ALLOWANCE_MB = 150.0
EXPAND_BYTES_PER_ROW = 2048 * 4
CHUNK_ROWS = 2_000
SMALL_BUDGET = 32 * MiB
SMALL_MESSAGES = 100_000


@dataclass(frozen=True)
class SmallMessagesResult:
    """One broker's run of 1-row messages under ``SMALL_BUDGET``."""

    broker: str
    messages: int
    budget_mib: float
    baseline_rss_mib: float
    peak_rss_mib: float
    peak_inflight_mib: float
    rows_per_s: float
    seconds: float

    @property
    def over_mib(self) -> float:
        return self.peak_rss_mib - self.baseline_rss_mib

    @property
    def within(self) -> bool:
        """Peak - start within budget + 150 MB, and the gauge never above the budget."""
        allowance = self.budget_mib + ALLOWANCE_MB * 1e6 / MiB
        return self.over_mib <= allowance and self.peak_inflight_mib <= self.budget_mib


@dataclass(frozen=True)
class MemoryResult:
    rows: int
    output_mib: float
    budget_mib: float
    baseline_rss_mib: float
    peak_rss_mib: float
    peak_inflight_mib: float
    seconds: float
    small: tuple[SmallMessagesResult, ...] = ()

    @property
    def limit_mib(self) -> float:
        return self.budget_mib + ALLOWANCE_MB * 1e6 / MiB

    def table(self) -> Table:
        over = self.peak_rss_mib - self.baseline_rss_mib
        rows = [
            (
                f"expander, {self.output_mib:,.0f} MiB out",
                "pubsub",
                f"{self.rows:,}",
                f"{self.budget_mib:.0f} MiB",
                f"{self.baseline_rss_mib:.0f} MiB",
                f"{self.peak_rss_mib:.0f} MiB",
                f"{over:.0f} MiB",
                f"{self.peak_inflight_mib:.1f} MiB",
                f"{self.limit_mib:.0f} MiB",
                f"{self.rows / self.seconds:,.0f}" if self.seconds else "-",
            )
        ]
        for small in self.small:
            limit = small.budget_mib + ALLOWANCE_MB * 1e6 / MiB
            rows.append(
                (
                    "1-row messages",
                    small.broker,
                    f"{small.messages:,}",
                    f"{small.budget_mib:.0f} MiB",
                    f"{small.baseline_rss_mib:.0f} MiB",
                    f"{small.peak_rss_mib:.0f} MiB",
                    f"{small.over_mib:.0f} MiB",
                    f"{small.peak_inflight_mib:.1f} MiB",
                    f"{limit:.0f} MiB",
                    f"{small.rows_per_s:,.0f}",
                )
            )
        return Table(
            "6. Memory: peak RSS against the budget, -> SQLite",
            (
                "case",
                "broker",
                "rows",
                "budget",
                "RSS at start",
                "peak RSS",
                "peak - start",
                "peak in flight",
                "limit (budget+150 MB)",
                "rows/s",
            ),
            tuple(rows),
            (
                "Peak RSS is VmHWM of the consumer process; 'RSS at start' is VmRSS once ready "
                "(interpreter, libraries, clients), before anything was published. Peak in "
                "flight: the highest rowbatch_inflight_bytes seen (sampled every 20-50 ms).",
                "1-row messages: scorer, numeric rows as JSON, a backlog published before the "
                "consumer starts (RSS at start: once ready, may include some read-ahead); "
                "rows/s from the first row written to the last.",
            ),
        )


def run(bench: Bench) -> MemoryResult:
    expander = run_expander(bench)
    messages = 10_000 if bench.quick else SMALL_MESSAGES
    small = tuple(run_small_messages(bench, broker, messages) for broker in BROKERS)
    return dataclasses.replace(expander, small=small)


def run_small_messages(bench: Bench, broker: Broker, messages: int) -> SmallMessagesResult:
    """A backlog of ``messages`` 1-row messages, published before the consumer starts (so
    the source can read as far ahead as it likes), drained by one consumer with a
    ``SMALL_BUDGET`` budget; its in-flight gauge sampled all along."""
    feed = create_feed(bench.stack, broker)
    table = unique(f"small_{broker}")
    config = consumer_config(
        bench.stack,
        feed,
        "scorer",
        SCORER_BINDING,
        sink_config(bench, "sqlite", table),
        model_extra={"max_wait_ms": 50},
        budget_bytes=SMALL_BUDGET,
    )
    publish(bench.stack, feed, backlog("numeric", messages, 1, Encoding.JSON, prefix=table))
    peak_inflight = 0.0
    first: tuple[float, float] | None = None  # (when, rows written) at the first rows seen
    with consumers(bench.dir("memory"), table, config) as procs:
        proc = procs[0]
        wait_ready(procs)
        baseline = proc.memory_kib()["VmRSS"] / 1024

        def done() -> bool:
            nonlocal peak_inflight, first
            m = proc.metrics() or {}
            peak_inflight = max(peak_inflight, m.get("rowbatch_inflight_bytes", 0.0))
            written = m.get("rowbatch_rows_written_total", 0.0)
            if written and first is None:
                first = (time.monotonic(), written)
            return written >= messages

        wait_for(done, 600, f"{messages} 1-row messages written", procs, every_s=0.02)
        ended = time.monotonic()
        peak = proc.memory_kib()["VmHWM"] / 1024
        proc.terminate()
    assert first is not None
    seconds = max(ended - first[0], 1e-3)
    written = count_rows(bench, "sqlite", table)
    remove_table(bench, "sqlite", table)
    if written != messages:
        raise RuntimeError(f"memory ({broker}): {written} of {messages} rows in the sink")
    result = SmallMessagesResult(
        broker,
        messages,
        SMALL_BUDGET / MiB,
        baseline,
        peak,
        peak_inflight / MiB,
        (messages - first[1]) / seconds,
        round(seconds, 1),
    )
    print(
        f"  {broker}: peak RSS {peak:.0f} MiB (start {baseline:.0f} MiB), peak in flight "
        f"{result.peak_inflight_mib:.1f} MiB, {result.rows_per_s:,.0f} rows/s",
        flush=True,
    )
    return result


def run_expander(bench: Bench) -> MemoryResult:
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
