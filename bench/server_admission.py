"""``python -m bench server_admission``: three consumers on one model server that cannot take
what they offer (issue 48), with fixed windows and with windows admitted from the server's own
queue (``model.adapt``), in alternate rounds: the server's rows/s and their share of its
ceiling, the mean queue time per request and requests waiting (Triton's statistics), the
consumers' windows and requests in flight, their CPU per 1,000 rows, and every row checked in
the table. Then, admitted, one consumer leaves and one joins. The server is a
``fixed_latency`` model on Triton (80 ms per execution, two instances, 256 rows: 6,400 rows/s,
bounded by sleep, not by this machine's CPUs); the Pub/Sub emulator feeds the consumers, which
run in this process and write to PostgreSQL. Recipe: tests/integration/test_server_admission.py.

    python -m bench server_admission [--repeat 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psycopg
import tritonclient.grpc as grpcclient
from prometheus_client import CollectorRegistry

from bench import machine
from bench.help_text import description
from bench.multi_endpoint import Feed
from bench.run_start import error_text, header, stop_cleanly_on_signals
from bench.server_admission_report import (
    MODES,
    Failed,
    LeaveJoin,
    Mode,
    Params,
    Round,
    ServerAdmission,
)
from bench.stack import drop_pubsub_feeds
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.postgres import PostgresEndpoint, PostgresService
from harness.pubsub import PubSubEndpoint, PubSubService
from harness.service import REPO_ROOT, RunDir
from harness.triton import TritonService
from rowbatch.consumer.model.server_stats import QueueReading, QueueTotals, queue_totals
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.wire.chunks.encode import encode_chunk

MODEL = "admission_fixed"
INSTANCES = 2
VARIANT = FixedLatency(base_ms=80.0, per_row_us=0.0, max_batch_size=256, instances=INSTANCES)
CEILING = INSTANCES * VARIANT.ceiling()
"""6,400 rows/s: both instances always busy with full requests."""
CONSUMERS = 3
CHUNK_ROWS = 512
ROUND_ROWS = 160 * CHUNK_ROWS
"""81,920 rows a round: about 13 s at the ceiling, the span ends well before."""
LEAVE_JOIN_ROWS = 3 * ROUND_ROWS
"""The leave/join phase: three spans, a stop, a start and the windows coming back."""
READ_AHEAD = 6
"""Messages one consumer holds (``source.max_messages``), so the backlog spreads over the
three."""
MEASURE_S = 3.0
SETTLE_S = 2.0
"""After all three write (and after one leaves), before a span starts."""
ADAPT_INTERVAL_S = ModelSettings.model_fields["adapt_interval_s"].default
"""The consumers' default (not set in their configuration: what a user gets)."""
MAX_WAIT_MS = 20.0
SAMPLE_S = 0.05
RECONVERGE_S = 30.0
DRAIN_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0
BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score"},
    "passthrough": {"id": "int64"},
}


# --- consumers in this process ---------------------------------------------------------------


@dataclass
class Consumer:
    task: asyncio.Task[None]
    stop: asyncio.Event
    running: list[Running]

    @property
    def registry(self) -> CollectorRegistry:
        return self.running[0].metrics.registry

    async def close(self, timeout_s: float = 60.0) -> None:
        """Stop it as SIGTERM does and wait; raises what it failed with."""
        self.stop.set()
        done, _ = await asyncio.wait({self.task}, timeout=timeout_s)
        if not done:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=10)
            raise TimeoutError(f"a consumer did not stop within {timeout_s:g} s")
        self.task.result()


def start_consumer(config: ConsumerConfig) -> Consumer:
    stop = asyncio.Event()
    running: list[Running] = []
    task = asyncio.create_task(run_consumer(config, stop, on_running=running.append))
    return Consumer(task, stop, running)


@contextlib.asynccontextmanager
async def fleet(config: ConsumerConfig, n: int) -> AsyncIterator[list[Consumer]]:
    """``n`` consumers; every one still in (or added to) the list is stopped at the end."""
    consumers = [start_consumer(config) for _ in range(n)]
    try:
        yield consumers
    except BaseException:
        for c in consumers:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await c.close()
        raise
    errors: list[BaseException] = []
    for c in consumers:
        try:
            await c.close()
        except Exception as exc:  # noqa: BLE001 - stop the others, then raise the first
            errors.append(exc)
    if errors:
        raise errors[0]


async def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, consumers: Sequence[Consumer]
) -> bool:
    """Poll until ``predicate``; False after ``timeout_s``; raises if a consumer ended."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        for c in consumers:
            if c.task.done():
                c.task.result()
                raise RuntimeError(f"a consumer stopped before {what}")
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def must(
    predicate: Callable[[], bool], timeout_s: float, what: str, consumers: Sequence[Consumer]
) -> None:
    if not await wait_for(predicate, timeout_s, what, consumers):
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def gauge(registry: CollectorRegistry, name: str, endpoint: str) -> float:
    return registry.get_sample_value(name, {"endpoint": endpoint}) or 0.0


def written(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("rowbatch_rows_written_total") or 0.0


def counter_sum(registry: CollectorRegistry, name: str) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)


# --- the server's statistics and one span ----------------------------------------------------


@dataclass
class Setup:
    pubsub: PubSubEndpoint
    postgres: PostgresEndpoint
    endpoint: str
    """The Triton's gRPC address: the consumers' ``model.url`` and metrics' endpoint label."""
    stats: grpcclient.InferenceServerClient

    def totals_now(self) -> QueueTotals:
        stats = self.stats.get_inference_statistics(MODEL, as_json=True)
        totals = queue_totals(stats, MODEL, time.monotonic())
        if totals is None:
            raise RuntimeError(f"Triton keeps no statistics for {MODEL}")
        return totals


@dataclass(frozen=True)
class Span:
    reading: QueueReading
    window_sum: float
    in_flight_sum: float
    cpu_s: float
    rows_written: float
    windows: tuple[float, ...]
    saturated: tuple[float, ...]

    @property
    def rows_per_s(self) -> float:
        return self.reading.requests * VARIANT.max_batch_size / self.reading.seconds


async def warm_up(consumers: Sequence[Consumer]) -> None:
    """All running and writing, then :data:`SETTLE_S` more (admitted: a few readings in)."""
    await must(lambda: all(c.running for c in consumers), START_TIMEOUT_S, "start", consumers)
    await must(
        lambda: all(written(c.registry) >= 4 * VARIANT.max_batch_size for c in consumers),
        START_TIMEOUT_S,
        "every consumer writing",
        consumers,
    )
    await asyncio.sleep(SETTLE_S)


async def measure(setup: Setup, consumers: Sequence[Consumer]) -> Span:
    """What the server and the consumers did over the next :data:`MEASURE_S`."""
    regs = [c.registry for c in consumers]
    endpoint = setup.endpoint
    samples: list[tuple[float, float]] = []

    def window_sum() -> float:
        return sum(gauge(r, "rowbatch_endpoint_window", endpoint) for r in regs)

    async def sample() -> None:
        while True:
            flying = sum(gauge(r, "rowbatch_endpoint_inflight_batches", endpoint) for r in regs)
            samples.append((window_sum(), flying))
            await asyncio.sleep(SAMPLE_S)

    sampler = asyncio.create_task(sample())
    try:
        before = setup.totals_now()
        cpu0, rows0 = time.process_time(), sum(written(r) for r in regs)
        await asyncio.sleep(MEASURE_S)
        after = setup.totals_now()
        cpu1, rows1 = time.process_time(), sum(written(r) for r in regs)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    reading = QueueReading.between(before, after)
    if reading is None:
        raise RuntimeError("Triton's statistics went back (did it restart?)")
    return Span(
        reading,
        sum(w for w, _ in samples) / len(samples),
        sum(f for _, f in samples) / len(samples),
        cpu1 - cpu0,
        rows1 - rows0,
        tuple(gauge(r, "rowbatch_endpoint_window", endpoint) for r in regs),
        tuple(gauge(r, "rowbatch_server_saturated", endpoint) for r in regs),
    )


# --- a backlog and its table -----------------------------------------------------------------


def publish_rows(pubsub: PubSubEndpoint, feed: Feed, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    chunks = [
        encode_chunk(
            "events",
            {
                "id": np.arange(start, start + CHUNK_ROWS, dtype=np.int64),
                "features": rng.normal(size=(CHUNK_ROWS, 16)).astype(np.float32),
                "count": rng.integers(0, 1000, size=CHUNK_ROWS).astype(np.int64),
            },
            "arrow",
            f"admission-{seed}-{start}",
        )
        for start in range(0, rows, CHUNK_ROWS)
    ]
    feed.publish(pubsub, chunks)


def consumer_config(setup: Setup, feed: Feed, table: str, adapt: bool) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "subscription": feed.subscription,
                "topic": feed.topic,
                "dead_letter_topic": feed.dlq,
                "max_messages": READ_AHEAD,
            },
            "model": {
                "url": setup.endpoint,
                "name": MODEL,
                "max_wait_ms": MAX_WAIT_MS,
                "adapt": adapt,
                "timeout_s": 30,
            },
            "binding": BINDING,
            "sink": {"kind": "postgres", "dsn": setup.postgres.dsn, "table": table},
            "server": {"port": 0},
            "log_format": "text",
            "log_level": "WARNING",
        }
    )


@dataclass(frozen=True)
class TableCount:
    rows: int
    distinct_in_range: int

    def lost(self, expected: int) -> int:
        return expected - self.distinct_in_range


def table_count(dsn: str, table: str, expected: int) -> TableCount:
    """Rows in ``table`` and distinct ids among 0..expected-1 (0, 0 before it exists)."""
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return TableCount(0, 0)
        row = conn.execute(
            f"SELECT count(*), count(DISTINCT id) FILTER (WHERE id >= 0 AND id < %s) "  # noqa: S608 - our own table name
            f"FROM {table}",
            (expected,),
        ).fetchone()
    return TableCount(int(row[0]), int(row[1])) if row else TableCount(0, 0)


async def backlog(setup: Setup, mode: str, rows: int, seed: int) -> tuple[Feed, str]:
    """A fresh topic and subscription with ``rows`` rows on it, and a fresh table name."""
    feed = await asyncio.to_thread(Feed.create, setup.pubsub)
    await asyncio.to_thread(publish_rows, setup.pubsub, feed, rows, seed)
    return feed, f"admission_{mode}_{uuid.uuid4().hex[:8]}"


async def drain(setup: Setup, table: str, expected: int, consumers: Sequence[Consumer]) -> None:
    """Wait (at most :data:`DRAIN_TIMEOUT_S`) until every row is in the table; what is still
    missing then is counted as lost."""
    await wait_for(
        lambda: table_count(setup.postgres.dsn, table, expected).distinct_in_range >= expected,
        DRAIN_TIMEOUT_S,
        "every row",
        consumers,
    )


def dead_letters(regs: Sequence[CollectorRegistry]) -> int:
    return int(sum(counter_sum(r, "rowbatch_messages_dead_lettered_total") for r in regs))


# --- a round and the leave/join phase --------------------------------------------------------


async def one_round(setup: Setup, mode: Mode, index: int, seed: int) -> Round:
    feed, table = await backlog(setup, mode, ROUND_ROWS, seed)
    config = consumer_config(setup, feed, table, adapt=mode == "admitted")
    async with fleet(config, CONSUMERS) as consumers:
        await warm_up(consumers)
        span = await measure(setup, consumers)
        regs = [c.registry for c in consumers]
        left = ROUND_ROWS - int(sum(written(r) for r in regs))
        await drain(setup, table, ROUND_ROWS, consumers)
    # Stopped: every message settled, the counters final.
    dead = dead_letters(regs)
    skipped = int(sum(counter_sum(r, "rowbatch_rows_duplicate_total") for r in regs))
    count = table_count(setup.postgres.dsn, table, ROUND_ROWS)
    r = span.reading
    return Round(
        mode=mode,
        index=index,
        rows_per_s=span.rows_per_s,
        of_ceiling=span.rows_per_s / CEILING,
        queue_ms=r.queue_s * 1e3,
        waiting=r.waiting,
        window_sum=span.window_sum,
        in_flight_sum=span.in_flight_sum,
        cpu_s_per_1k_rows=span.cpu_s / (span.rows_written / 1e3) if span.rows_written else 0.0,
        span_rows_written=int(span.rows_written),
        rows_left_after_span=left,
        rows_expected=ROUND_ROWS,
        rows_distinct=count.distinct_in_range,
        rows_lost=count.lost(ROUND_ROWS),
        duplicate_rows=count.rows - count.distinct_in_range,
        skipped_duplicates=skipped,
        dead_letters=dead,
        windows=span.windows,
        saturated=span.saturated,
    )


async def leave_join(setup: Setup, seed: int) -> LeaveJoin:
    """Admitted: three settle; one leaves (as SIGTERM); one joins at its ceiling."""
    rows = LEAVE_JOIN_ROWS
    feed, table = await backlog(setup, "movers", rows, seed)
    config = consumer_config(setup, feed, table, adapt=True)
    everyone: list[CollectorRegistry] = []
    async with fleet(config, CONSUMERS) as consumers:
        await warm_up(consumers)
        everyone += [c.registry for c in consumers]
        settled = await measure(setup, consumers)
        await consumers.pop().close()
        await asyncio.sleep(SETTLE_S)
        after_leave = await measure(setup, consumers)
        joined = start_consumer(config)
        consumers.append(joined)
        await must(lambda: bool(joined.running), START_TIMEOUT_S, "the newcomer", consumers)
        everyone.append(joined.registry)
        await must(
            lambda: written(joined.registry) >= VARIANT.max_batch_size,
            START_TIMEOUT_S,
            "the newcomer writing",
            consumers,
        )
        regs = [c.registry for c in consumers]
        began = time.monotonic()
        back = await wait_for(
            lambda: (
                sum(gauge(r, "rowbatch_endpoint_window", setup.endpoint) for r in regs)
                <= sum(settled.windows) + 1
            ),
            RECONVERGE_S,
            "the windows back to the settled sum",
            consumers,
        )
        took = time.monotonic() - began if back else None
        after_join = await measure(setup, consumers)
        left = rows - int(sum(written(r) for r in everyone))
        await drain(setup, table, rows, consumers)
    count = table_count(setup.postgres.dsn, table, rows)
    return LeaveJoin(
        settled_rows_per_s=settled.rows_per_s,
        settled_queue_ms=settled.reading.queue_s * 1e3,
        settled_windows=settled.windows,
        settled_window_mean=settled.window_sum,
        left_rows_per_s=after_leave.rows_per_s,
        left_queue_ms=after_leave.reading.queue_s * 1e3,
        left_windows=after_leave.windows,
        left_window_mean=after_leave.window_sum,
        reconverge_s=took,
        joined_rows_per_s=after_join.rows_per_s,
        joined_queue_ms=after_join.reading.queue_s * 1e3,
        joined_windows=after_join.windows,
        joined_window_mean=after_join.window_sum,
        rows_left_after_span=left,
        rows_expected=rows,
        rows_lost=count.lost(rows),
        duplicate_rows=count.rows - count.distinct_in_range,
        dead_letters=dead_letters(everyone),
    )


async def run_all(setup: Setup, repeat: int) -> ServerAdmission:
    rounds: list[Round] = []
    failed: list[Failed] = []
    for index in range(1, repeat + 1):
        for mode_ in MODES:
            print(f"[{mode_} round {index} of {repeat}] ...", flush=True)
            try:
                got = await one_round(setup, mode_, index, seed=100 * index + len(rounds))
            except Exception as exc:  # noqa: BLE001 - one failed round must not lose the rest
                traceback.print_exc()
                failed.append(Failed(mode_, index, error_text(exc)))
                print(f"  FAILED: {error_text(exc)}", flush=True)
            else:
                rounds.append(got)
                print(
                    f"  {got.rows_per_s:,.0f} rows/s ({got.of_ceiling:.1%}), queue "
                    f"{got.queue_ms:.0f} ms, {got.waiting:.1f} waiting, windows "
                    f"{got.window_sum:.1f}, in flight {got.in_flight_sum:.1f}, CPU "
                    f"{got.cpu_s_per_1k_rows:.3f} s/1k rows, lost {got.rows_lost}, twice "
                    f"{got.duplicate_rows}, dead letters {got.dead_letters}",
                    flush=True,
                )
            finally:
                drop_feeds(setup.pubsub)
    print("[leave/join, admitted] ...", flush=True)
    moves: LeaveJoin | None = None
    moves_error: str | None = None
    try:
        moves = await leave_join(setup, seed=4800)
    except Exception as exc:  # noqa: BLE001 - reported in the record
        traceback.print_exc()
        moves_error = error_text(exc)
        print(f"  FAILED: {moves_error}", flush=True)
    finally:
        drop_feeds(setup.pubsub)
    params = Params(
        consumers=CONSUMERS,
        instances=INSTANCES,
        base_ms=VARIANT.base_ms,
        max_batch_size=VARIANT.max_batch_size,
        ceiling_rows_per_s=CEILING,
        rows_per_round=ROUND_ROWS,
        rows_per_message=CHUNK_ROWS,
        read_ahead=READ_AHEAD,
        measure_s=MEASURE_S,
        settle_s=SETTLE_S,
        adapt_interval_s=ADAPT_INTERVAL_S,
        max_wait_ms=MAX_WAIT_MS,
        repeat=repeat,
    )
    return ServerAdmission(params, tuple(rounds), tuple(failed), moves, moves_error)


def drop_feeds(pubsub: PubSubEndpoint) -> None:
    """The emulator keeps a topic's messages until it is deleted: drop the round's."""
    try:
        drop_pubsub_feeds(pubsub)
    except Exception as exc:  # noqa: BLE001 - a failed clean-up is reported, not fatal
        print(f"  (could not drop the round's Pub/Sub topics: {exc})", flush=True)


# --- services and the record -----------------------------------------------------------------


def slow_repository(root: Path) -> Path:
    """A model repository with :data:`VARIANT` (on :data:`INSTANCES` instances)."""
    return fixed_latency_repository(root, {MODEL: VARIANT})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench server_admission", description=description(__doc__)
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds of each mode, alternating (default 3)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    stop_cleanly_on_signals()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = RunDir(REPO_ROOT / ".stack" / "server-admission" / stamp)
    out: Path = args.out or run.root / "server-admission.json"
    here = machine.describe()
    head = header(
        "server_admission",
        list(argv if argv is not None else sys.argv[2:]),
        time.strftime("%Y-%m-%d %H:%M:%S %z"),
        here,
    )
    print(
        f"rowbatch server admission, {head['started_at']}\n"
        f"  command   {head['command']}\n"
        f"  commit    {head['git_commit']} ({head['git_uncommitted_files']} files uncommitted)\n"
        f"  host      {head['machine']['node']}: {here.header()}\n"
        f"  run dir   {run.root}",
        flush=True,
    )
    pubsub_service = PubSubService(run)
    postgres_service = PostgresService(run)
    triton_service = TritonService(
        run, slow_repository(run.data("models")), name="triton-admission"
    )
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        for service in (pubsub_service, postgres_service, triton_service):
            stack.callback(service.stop)
        with ThreadPoolExecutor(3) as pool:
            pubsub_f = pool.submit(pubsub_service.start)
            postgres_f = pool.submit(postgres_service.start)
            triton_f = pool.submit(triton_service.start)
            pubsub, postgres, triton = pubsub_f.result(), postgres_f.result(), triton_f.result()
        os.environ.update(pubsub.env())
        print(f"  services  ready in {time.monotonic() - started:.0f} s", flush=True)
        stats = grpcclient.InferenceServerClient(triton.grpc_url)
        stack.callback(stats.close)
        setup = Setup(pubsub, postgres, triton.grpc_url, stats)
        result = asyncio.run(run_all(setup, args.repeat))
    print(result.render())
    record = result.to_json(
        {**head, "machine": {"node": platform.node(), **dataclasses.asdict(machine.finish(here))}}
    )
    record["elapsed_s"] = round(time.monotonic() - started, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\nTotal {record['elapsed_s']:.0f} s; results in {out}")
    return 0 if result.clean else 1
