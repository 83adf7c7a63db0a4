"""Section ``generative``: does the concurrency window keep a continuous-batching server's slots
full without a standing queue (issue 47)? One consumer drains a Kafka backlog of text rows
through chat completions against the fixed-step server (``harness/fixed_step_llm.py``: SLOTS
slots, a token every STEP_MS, TOKENS tokens per answer, a waiting queue, vLLM's metric names,
429 when running plus waiting reach its limit), into PostgreSQL, three ways, one after another
on the same server:

- ``adaptive``: the default window, ``max_in_flight`` = the slots, ``adapt`` on (the server's
  ``vllm:num_requests_waiting`` moves it);
- ``fixed 4x``: a fixed window of four times the slots (what users configure by hand), the
  server's queue deep enough that nothing is refused;
- ``429 storm``: the fixed 4x window against a server that refuses past SLOTS + STORM_WAITING:
  every request beyond is a 429, the window halves on them.

Per run, from the server's own ``/stats`` over the middle of the drain (from 10 % to 90 % of
the rows written, so the ramp and the tail are left out): the slots' occupancy and the waiting
queue's p50/p99/max sampled at every step, and the rows/s over the same stretch; over the whole
run: 429s, rows dead-lettered, every row written once (counted in the table),
the consumer's CPU per row; for the storm, the seconds from the first row written until a 2 s
window first reaches 90 % of the server's ceiling (SLOTS / (TOKENS x STEP_MS) rows/s)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import psycopg
from psycopg import sql

from bench.procs import consumers, wait_for, wait_ready
from bench.report import Table, Target
from bench.stack import Bench, create_feed, publish, sink_config, source_config, unique
from harness.fixed_step_llm import FixedStepLlmEndpoint, FixedStepLlmService
from harness.service import RunDir
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk

SLOTS = 32
STEP_MS = 20.0
TOKENS = 16
DEEP_WAITING = 4 * SLOTS
STORM_WAITING = 4
ROWS = 4_000
QUICK_ROWS = 800
ROWS_PER_MESSAGE = 20
TARGET_OCCUPANCY = 0.95
TARGET_QUEUE_P99 = 1.0
TARGET_RECOVERY_S = 10.0


@dataclass(frozen=True)
class GenerativeRun:
    mode: str
    window: str
    rows: int
    written: int
    rows_per_s: float
    ceiling_rows_per_s: float
    occupancy: float
    queue_p50: float
    queue_p99: float
    queue_max: float
    rejected: int
    dead_lettered: int
    cpu_us_per_row: float
    recovery_s: float | None


@dataclass(frozen=True)
class GenerativeResult:
    runs: tuple[GenerativeRun, ...]

    def find(self, mode: str) -> GenerativeRun | None:
        return next((r for r in self.runs if r.mode == mode), None)

    def table(self) -> Table:
        return Table(
            f"Generative: chat rows against a fixed-step server ({SLOTS} slots, "
            f"{STEP_MS:g} ms a token, {TOKENS} tokens)",
            (
                "mode",
                "window",
                "rows",
                "written",
                "rows/s",
                "of ceiling",
                "occupancy",
                "queue p50",
                "queue p99",
                "queue max",
                "429s",
                "dead-lettered",
                "CPU us/row",
                "back in s",
            ),
            tuple(
                (
                    r.mode,
                    r.window,
                    f"{r.rows:,}",
                    f"{r.written:,}",
                    f"{r.rows_per_s:,.1f}",
                    f"{r.rows_per_s / r.ceiling_rows_per_s:.2f}",
                    f"{r.occupancy:.3f}",
                    f"{r.queue_p50:g}",
                    f"{r.queue_p99:g}",
                    f"{r.queue_max:g}",
                    f"{r.rejected:,}",
                    f"{r.dead_lettered:,}",
                    f"{r.cpu_us_per_row:,.0f}",
                    "-" if r.recovery_s is None else f"{r.recovery_s:.1f}",
                )
                for r in self.runs
            ),
            (
                "One consumer, a Kafka backlog of 20-row messages, chat completions (one row a "
                "request, max_tokens = tokens), PostgreSQL. occupancy and queue: the server's "
                "own figures, sampled every step from 10 % to 90 % of the rows written; rows/s: "
                "over the same 10 % to 90 %; of ceiling: rows/s over slots / (tokens x step); "
                "back in s: the storm's first 2 s window at 90 % of the ceiling, from the "
                "first row written.",
            ),
        )

    def targets(self) -> list[Target]:
        found: list[Target] = []
        adaptive, fixed, storm = (
            self.find("adaptive"),
            self.find("fixed 4x"),
            self.find("429 storm"),
        )
        if adaptive is not None:
            found.append(
                Target(
                    "generative: slots occupied during a drain (adaptive window)",
                    f">= {TARGET_OCCUPANCY:.2f}",
                    f"{adaptive.occupancy:.3f}",
                    adaptive.occupancy >= TARGET_OCCUPANCY,
                )
            )
            found.append(
                Target(
                    "generative: server waiting queue p99 (adaptive window, one endpoint)",
                    f"<= {TARGET_QUEUE_P99:g}",
                    f"{adaptive.queue_p99:g}",
                    adaptive.queue_p99 <= TARGET_QUEUE_P99,
                )
            )
        if adaptive is not None and fixed is not None and fixed.rows_per_s:
            ratio = adaptive.rows_per_s / fixed.rows_per_s
            found.append(
                Target(
                    "generative: rows/s adaptive vs fixed 4x window",
                    ">= 0.95x",
                    f"{ratio:.2f}x",
                    ratio >= 0.95,
                )
            )
        if storm is not None:
            lossless = storm.written == storm.rows and storm.dead_lettered == 0
            found.append(
                Target(
                    "generative: 429 storm loses and dead-letters nothing",
                    "0 lost, 0 dead-lettered",
                    f"{storm.rows - storm.written} lost, {storm.dead_lettered} dead-lettered",
                    lossless,
                )
            )
            back = storm.recovery_s
            found.append(
                Target(
                    "generative: 429 storm, throughput back at 90 % of the ceiling",
                    f"<= {TARGET_RECOVERY_S:g} s",
                    "never" if back is None else f"{back:.1f} s",
                    back is not None and back <= TARGET_RECOVERY_S,
                )
            )
        return found


def _chunks(rows: int, prefix: str) -> list[EncodedChunk]:
    out = []
    for n in range(rows // ROWS_PER_MESSAGE):
        start = n * ROWS_PER_MESSAGE
        ids = np.arange(start, start + ROWS_PER_MESSAGE, dtype=np.int64)
        texts = [f"review {i}: the product was fine, delivery slow" for i in ids]
        out.append(encode_chunk("reviews", {"id": ids, "body": texts}, "arrow", f"{prefix}-{n}"))
    return out


def _stats(server: FixedStepLlmEndpoint) -> dict[str, Any]:
    return dict(httpx.get(f"{server.url}/stats", timeout=10).json())


def _count(bench: Bench, table: str) -> tuple[int, int]:
    with psycopg.connect(bench.stack.postgres.dsn) as conn:
        query = sql.SQL("SELECT count(*), count(DISTINCT id) FROM {}").format(sql.Identifier(table))
        row = conn.execute(query).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _run(
    bench: Bench, server: FixedStepLlmEndpoint, mode: str, model: dict[str, Any], rows: int
) -> GenerativeRun:
    stack = bench.stack
    feed = create_feed(stack, "kafka")
    publish(stack, feed, _chunks(rows, unique("gen")))
    table = unique("generative")
    config = {
        "source": source_config(stack, feed, 0),
        "model": {
            "kind": "openai",
            "url": server.url,
            "name": server.model,
            "prompt": "Summarise: {body}",
            "max_tokens": TOKENS,
            "max_wait_ms": 20,
            **model,
        },
        "binding": {"outputs": {"text": "summary"}, "passthrough": {"id": "int64"}},
        "sink": sink_config(bench, "postgres", table),
        "log_format": "text",
        "log_level": "WARNING",
    }
    ceiling = SLOTS / (TOKENS * STEP_MS / 1000.0)
    httpx.post(f"{server.url}/stats/reset", timeout=10)
    with consumers(bench.dir("generative"), table, config) as procs:
        proc = procs[0]
        wait_ready(procs)
        cpu0 = proc.cpu()
        first: list[float] = []
        marks: list[tuple[float, float]] = []
        window: dict[str, Any] = {}

        def progress() -> bool:
            now, done = time.monotonic(), proc.rows_written()
            if done and not first:
                first.append(now)
            marks.append((now, done))
            if "start" not in window and done >= 0.1 * rows:
                httpx.post(f"{server.url}/stats/reset", timeout=10)
                window["start"], window["start_rows"] = now, done
            if "stats" not in window and done >= 0.9 * rows:
                window["stats"] = _stats(server)
                window["end"], window["end_rows"] = now, done
            return done >= rows

        wait_for(progress, 900, f"{rows} rows written", procs, every_s=0.1)
        cpu = proc.cpu()
        rejected = int(proc.metric("rowbatch_endpoint_errors_total") or 0)  # HTTP 429s here
        dead = int(proc.metric("rowbatch_rows_dead_lettered_total") or 0) + int(
            (proc.metric("rowbatch_messages_dead_lettered_total") or 0) * ROWS_PER_MESSAGE
        )
    written, distinct = _count(bench, table)
    if written != distinct:
        raise AssertionError(f"{mode}: {written - distinct} rows written twice")
    stats = window.get("stats") or _stats(server)
    queue = stats["waiting_queue"]
    seconds = window["end"] - window["start"] if "end" in window else 0.0
    steady = window["end_rows"] - window["start_rows"] if "end" in window else 0.0
    return GenerativeRun(
        mode=mode,
        window=_describe(model),
        rows=rows,
        written=written,
        rows_per_s=steady / seconds if seconds else 0.0,
        ceiling_rows_per_s=ceiling,
        occupancy=float(stats["occupancy"]),
        queue_p50=float(queue["p50"]),
        queue_p99=float(queue["p99"]),
        queue_max=float(queue["max"]),
        rejected=rejected,
        dead_lettered=dead,
        cpu_us_per_row=(cpu.total_s - cpu0.total_s) / rows * 1e6,
        recovery_s=_recovery(marks, first[0], ceiling) if mode == "429 storm" and first else None,
    )


def _describe(model: dict[str, Any]) -> str:
    adapt = model.get("adapt", True)
    return f"{model['max_in_flight']}{' adapt' if adapt else ' fixed'}"


def _recovery(marks: list[tuple[float, float]], start: float, ceiling: float) -> float | None:
    """Seconds from ``start`` to the end of the first 2 s window whose rate reaches 90 % of
    ``ceiling`` (the samples of rows written, every 0.1 s)."""
    for i, (t, done) in enumerate(marks):
        for t0, done0 in reversed(marks[:i]):
            if t - t0 >= 2.0:
                if (done - done0) / (t - t0) >= 0.9 * ceiling:
                    return t - start
                break
    return None


def run(bench: Bench) -> GenerativeResult:
    rows = QUICK_ROWS if bench.quick else ROWS
    runs = []
    where = RunDir(bench.dir("generative_servers"))
    adaptive = {"max_in_flight": SLOTS, "adapt": True, "adapt_interval_s": 0.25}
    fixed = {"max_in_flight": 4 * SLOTS, "max_window": 4 * SLOTS, "adapt": False}
    plans = (
        ("adaptive", DEEP_WAITING, adaptive),
        ("fixed 4x", DEEP_WAITING, fixed),
        ("429 storm", STORM_WAITING, fixed),
    )
    for mode, waiting, model in plans:
        service = FixedStepLlmService(
            where,
            slots=SLOTS,
            step_ms=STEP_MS,
            max_waiting=waiting,
            tokens=TOKENS,
            name=f"fixed_step_{mode.replace(' ', '_')}",
        )
        with service as server:
            runs.append(_run(bench, server, mode, model, rows))
    return GenerativeResult(tuple(runs))
