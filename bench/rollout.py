"""``python -m bench rollout``: what a shadow and a canary (``[model.candidate]``,
docs/rollout.md) cost production. One consumer drains a fresh backlog in each mode, the modes
rotated round by round: ``off`` (production alone), ``shadow`` (every row also to a candidate
with an instance of its own: spare capacity equal to production's), ``shadow-down`` (the
candidate's url where nothing listens) and ``canary-10`` (10 % of the rows answered by the
candidate). Per mode: the rows/s over the middle of the drain (20 % to 90 % of the rows written)
and its ratio to ``off``, the consumer's CPU per 1,000 rows, the rollout's counters, and every
row checked in the result table (and, for the canary, written by the arm its key names). The
models are ``fixed_latency`` variants on one Triton (50 ms per execution, one instance each,
256 rows: 5,120 rows/s each, bounded by sleep, not by this machine's CPUs); the Pub/Sub
emulator feeds the consumer, which runs in this process and writes to PostgreSQL. Recipe:
tests/integration/test_rollout.py; services and helpers: :mod:`bench.server_admission`.

    python -m bench rollout [--repeat 3] [--rows N] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import tritonclient.grpc as grpcclient
from prometheus_client import CollectorRegistry

from bench import machine
from bench.help_text import description
from bench.multi_endpoint import Feed
from bench.rollout_report import (
    Failed,
    Mode,
    Params,
    Rollout,
    Round,
    Sample,
    Span,
    order,
    span_of,
)
from bench.run_start import (
    Log,
    error_text,
    header,
    machine_ticks,
    open_log,
    stop_cleanly_on_signals,
    write_record,
)
from bench.server_admission import (
    CHUNK_ROWS,
    Consumer,
    Setup,
    consumer_config,
    dead_letters,
    drop_feeds,
    fleet,
    must,
    publish_rows,
    table_count,
    wait_for,
    written,
)
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.postgres import PostgresService
from harness.proc import free_port
from harness.pubsub import PubSubService
from harness.service import REPO_ROOT, RunDir
from harness.triton import TritonService
from rowbatch.consumer.model.server_stats import QueueReading, QueueTotals, queue_totals
from rowbatch.consumer.rollout.arms import in_share, key_places
from rowbatch.consumer.service.config import ConsumerConfig

MODEL = "rollout_prod"
CANDIDATE = "rollout_cand"
VARIANT = FixedLatency(base_ms=50.0, per_row_us=0.0, max_batch_size=256, instances=1)
CEILING = VARIANT.instances * VARIANT.ceiling()
"""5,120 rows/s: one model's instance always busy with full requests (each model has one)."""
DEFAULT_ROWS = 120 * CHUNK_ROWS
"""61,440 rows a round: about 12 s at the ceiling."""
BACKLOG_ROWS = 8192
CANARY_SHARE = 0.1
SPAN_LOW, SPAN_HIGH = 0.2, 0.9
SAMPLE_S = 0.1
WARM_UP_ROWS = 20 * CHUNK_ROWS
"""A drain of ``off`` before the first round, not recorded."""
START_TIMEOUT_S = 60.0
SHADOW_SETTLE_S = 60.0
"""Most to wait, after production's last row, for a shadow's backlog to empty."""
RESULTS = REPO_ROOT / "bench" / "results"
"""Where a run is recorded by default (``bench.cli.RESULTS_DIR``: docs cite only these)."""


def candidate(mode: Mode, down_url: str) -> dict[str, Any] | None:
    """``[model.candidate]`` of each mode."""
    if mode == "shadow":
        return {"mode": "shadow", "name": CANDIDATE, "backlog_rows": BACKLOG_ROWS}
    if mode == "shadow-down":
        return {"mode": "shadow", "url": down_url}
    if mode == "canary-10":
        return {"mode": "canary", "share": CANARY_SHARE, "name": CANDIDATE}
    return None


def rollout_config(
    setup: Setup, feed: Feed, table: str, mode: Mode, down_url: str
) -> ConsumerConfig:
    """:func:`bench.server_admission.consumer_config` (the same binding, model and sink
    settings) with production's model :data:`MODEL`, this mode's candidate, and the source's
    default read-ahead (server admission's is set for three consumers sharing a backlog)."""
    config = consumer_config(setup, feed, table, adapt=True).model_dump(exclude_unset=True)
    config["source"].pop("max_messages", None)
    config["model"]["name"] = MODEL
    given = candidate(mode, down_url)
    if given is not None:
        config["model"]["candidate"] = given
    return ConsumerConfig.model_validate(config)


# --- readings --------------------------------------------------------------------------------


def sample(registry: CollectorRegistry) -> Sample:
    busy, total = machine_ticks()
    return Sample(time.monotonic(), time.process_time(), written(registry), busy, total)


def rollout_rows(registry: CollectorRegistry, mode: Mode, arm: str, outcome: str) -> int:
    """``rowbatch_rollout_rows_total`` (0 without a candidate)."""
    label = "canary" if mode.startswith("canary") else "shadow"
    value = registry.get_sample_value(
        "rowbatch_rollout_rows_total", {"mode": label, "arm": arm, "outcome": outcome}
    )
    return int(value or 0)


@dataclass(frozen=True)
class ServerTotals:
    prod: QueueTotals | None
    cand: QueueTotals | None


def server_totals(stats: grpcclient.InferenceServerClient) -> ServerTotals:
    """Triton's totals of both models, one call."""
    got = stats.get_inference_statistics("", as_json=True)
    now = time.monotonic()
    return ServerTotals(queue_totals(got, MODEL, now), queue_totals(got, CANDIDATE, now))


def reading(before: QueueTotals | None, after: QueueTotals | None) -> QueueReading | None:
    return None if before is None or after is None else QueueReading.between(before, after)


@dataclass
class Drain:
    """A backlog drained, read every :data:`SAMPLE_S`: the samples, Triton's totals at the
    span's two ends, and when the last row was written."""

    samples: list[Sample] = field(default_factory=list)
    marks: list[ServerTotals] = field(default_factory=list)
    done_at: float = 0.0


async def watch_drain(setup: Setup, consumer: Consumer, total: int, timeout_s: float) -> Drain:
    """Sample until ``total`` rows are written; Triton's totals read as the samples first
    reach :data:`SPAN_LOW` and :data:`SPAN_HIGH` of them."""
    drain = Drain()
    deadline = time.monotonic() + timeout_s
    for_marks = [SPAN_LOW * total, SPAN_HIGH * total]
    while True:
        s = sample(consumer.registry)
        drain.samples.append(s)
        while for_marks and s.written >= for_marks[0]:
            for_marks.pop(0)
            drain.marks.append(await asyncio.to_thread(server_totals, setup.stats))
        if s.written >= total:
            drain.done_at = s.at
            return drain
        if consumer.task.done():
            consumer.task.result()
            raise RuntimeError("the consumer stopped before every row was written")
        if s.at > deadline:
            raise TimeoutError(
                f"{s.written:,.0f} of {total:,} rows written after {timeout_s:.0f} s"
            )
        await asyncio.sleep(SAMPLE_S)


# --- the tables ------------------------------------------------------------------------------


def arm_check(dsn: str, table: str, mode: Mode) -> tuple[int, int]:
    """Result rows written with the candidate's name, and rows whose ``model_name`` is not
    the one their key hash names (the candidate below a canary's share; else production)."""
    with psycopg.connect(dsn) as conn:
        got = conn.execute(f"SELECT chunk_id, row_index, model_name FROM {table}").fetchall()  # noqa: S608 - our own table name
    if not got:
        return 0, 0
    by_candidate = np.array([r[2] == CANDIDATE for r in got])
    if mode == "canary-10":
        places = key_places(
            [r[0] for r in got], [1] * len(got), np.array([r[1] for r in got], np.int64)
        )
        want = in_share(places, CANARY_SHARE)
    else:
        want = np.zeros(len(got), dtype=np.bool_)
    return int(by_candidate.sum()), int((by_candidate != want).sum())


# --- a round ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rig:
    setup: Setup
    down_url: str
    """A candidate url where nothing listens (``shadow-down``)."""


async def one_round(rig: Rig, mode: Mode, index: int, position: int, rows: int) -> Round:
    setup = rig.setup
    feed = await asyncio.to_thread(Feed.create, setup.pubsub)
    await asyncio.to_thread(publish_rows, setup.pubsub, feed, rows, 100 * index + position)
    table = f"rollout_{mode.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
    config = rollout_config(setup, feed, table, mode, rig.down_url)
    shadow = mode.startswith("shadow")
    timeout_s = max(120.0, 5 * rows / CEILING)
    async with fleet(config, 1) as consumers:
        (consumer,) = consumers
        began = time.monotonic()
        await must(lambda: bool(consumer.running), START_TIMEOUT_S, "start", consumers)
        drain = await watch_drain(setup, consumer, rows, timeout_s)
        registry = consumer.registry
        lag: float | None = None
        if shadow:
            settled = await wait_for(
                lambda: (registry.get_sample_value("rowbatch_rollout_backlog_rows") or 0) == 0,
                SHADOW_SETTLE_S,
                "the shadow's backlog empty",
                consumers,
            )
            lag = time.monotonic() - drain.done_at if settled else None
    # Stopped: every message settled, the counters final.
    span: Span = span_of(drain.samples, rows, SPAN_LOW, SPAN_HIGH)
    first, last = drain.marks if len(drain.marks) == 2 else (ServerTotals(None, None),) * 2
    prod, cand = reading(first.prod, last.prod), reading(first.cand, last.cand)
    count = table_count(setup.postgres.dsn, table, rows)
    compared = table_count(setup.postgres.dsn, f"{table}_candidate", rows).rows if shadow else None
    by_candidate, mismatches = arm_check(setup.postgres.dsn, table, mode)
    return Round(
        mode=mode,
        index=index,
        position=position,
        rows_per_s=span.rows_per_s,
        fit_rows_per_s=span.fit_rows_per_s,
        of_ceiling=span.rows_per_s / CEILING,
        span_s=span.seconds,
        span_rows=int(span.rows),
        cpu_s_per_1k_rows=span.cpu_s_per_1k_rows,
        machine_busy=span.machine_busy,
        prod_busy=0.0 if prod is None else prod.running,
        prod_queue_ms=0.0 if prod is None else prod.queue_s * 1e3,
        cand_busy=0.0 if cand is None else cand.running,
        cand_queue_ms=0.0 if cand is None else cand.queue_s * 1e3,
        prod_requests=0 if prod is None else prod.requests,
        cand_requests=0 if cand is None else cand.requests,
        drain_s=drain.done_at - began,
        shadow_lag_s=lag,
        production_rows=rollout_rows(registry, mode, "production", "answered"),
        candidate_answered=rollout_rows(registry, mode, "candidate", "answered"),
        candidate_skipped=rollout_rows(registry, mode, "candidate", "skipped"),
        candidate_failed=rollout_rows(registry, mode, "candidate", "failed"),
        candidate_unwritten=rollout_rows(registry, mode, "candidate", "unwritten"),
        candidate_dropped=rollout_rows(registry, mode, "candidate", "dropped"),
        compared_rows=compared,
        candidate_rows=by_candidate,
        arm_mismatches=mismatches,
        rows_expected=rows,
        rows_distinct=count.distinct_in_range,
        rows_lost=count.lost(rows),
        duplicate_rows=count.rows - count.distinct_in_range,
        dead_letters=dead_letters([registry]),
    )


async def run_all(rig: Rig, repeat: int, rows: int, say: Log) -> Rollout:
    rounds: list[Round] = []
    failed: list[Failed] = []
    say(f"[warm-up: off, {WARM_UP_ROWS:,} rows, not recorded] ...")
    try:  # the process's first consumer pays for first imports and connections
        await one_round(rig, "off", 0, 0, WARM_UP_ROWS)
    except Exception as exc:  # noqa: BLE001 - the rounds still run
        traceback.print_exc()
        say(f"  FAILED: {error_text(exc)}")
    finally:
        drop_feeds(rig.setup.pubsub)
    for index in range(1, repeat + 1):
        for position, mode in enumerate(order(index), 1):
            say(f"[round {index} of {repeat}, {position}. {mode}] ...")
            try:
                r = await one_round(rig, mode, index, position, rows)
            except Exception as exc:  # noqa: BLE001 - one failed round must not lose the rest
                traceback.print_exc()
                failed.append(Failed(mode, index, error_text(exc)))
                say(f"  FAILED: {error_text(exc)}")
            else:
                rounds.append(r)
                compared = "" if r.compared_rows is None else f", compared {r.compared_rows:,}"
                say(
                    f"  {r.rows_per_s:,.0f} rows/s ({r.of_ceiling:.1%}; fit "
                    f"{r.fit_rows_per_s:,.0f}), CPU {r.cpu_s_per_1k_rows:.3f} s/1k rows, machine "
                    f"{r.machine_busy:.0%} busy, prod {r.prod_busy:.0%} / cand {r.cand_busy:.0%} "
                    f"busy, drain {r.drain_s:.1f} s; candidate {r.candidate_answered:,} answered "
                    f"{r.candidate_skipped:,} skipped {r.candidate_failed:,} failed{compared}; "
                    f"by cand {r.candidate_share:.2%}; lost {r.rows_lost}, twice "
                    f"{r.duplicate_rows}, dead letters {r.dead_letters}, wrong arm "
                    f"{r.arm_mismatches}"
                )
            finally:
                drop_feeds(rig.setup.pubsub)
    params = Params(
        model=MODEL,
        candidate=CANDIDATE,
        base_ms=VARIANT.base_ms,
        max_batch_size=VARIANT.max_batch_size,
        instances=VARIANT.instances,
        ceiling_rows_per_s=CEILING,
        rows_per_round=rows,
        rows_per_message=CHUNK_ROWS,
        backlog_rows=BACKLOG_ROWS,
        canary_share=CANARY_SHARE,
        span_low=SPAN_LOW,
        span_high=SPAN_HIGH,
        sample_s=SAMPLE_S,
        repeat=repeat,
    )
    return Rollout(params, tuple(rounds), tuple(failed))


# --- services and the record -----------------------------------------------------------------


def repository(root: Path) -> Path:
    """Production and candidate: :data:`VARIANT` each, an instance each."""
    return fixed_latency_repository(root, {MODEL: VARIANT, CANDIDATE: VARIANT})


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench rollout", description=description(__doc__)
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds of every mode, rotated (default 3)"
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=DEFAULT_ROWS,
        help=f"backlog rows per mode and round, a multiple of {CHUNK_ROWS} (default "
        f"{DEFAULT_ROWS:,})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON file to write, the printed tables beside it as .txt (default "
        "bench/results/rollout-DATE.json)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.rows < CHUNK_ROWS or args.rows % CHUNK_ROWS:
        parser.error(f"--rows must be a positive multiple of {CHUNK_ROWS}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    given = list(argv if argv is not None else sys.argv[2:])
    args = parse_args(given)
    stop_cleanly_on_signals()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = RunDir(REPO_ROOT / ".stack" / "rollout" / stamp)
    out: Path = args.out or RESULTS / f"rollout-{time.strftime('%Y-%m-%d')}.json"
    here = machine.describe()
    head = header("rollout", given, time.strftime("%Y-%m-%d %H:%M:%S %z"), here)
    say = open_log("rowbatch rollout", head, here, run.root)
    pubsub_service = PubSubService(run)
    postgres_service = PostgresService(run)
    triton_service = TritonService(run, repository(run.data("models")), name="triton-rollout")
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
        say(f"  services  ready in {time.monotonic() - started:.0f} s")
        stats = grpcclient.InferenceServerClient(triton.grpc_url)
        stack.callback(stats.close)
        rig = Rig(Setup(pubsub, postgres, triton.grpc_url, stats), f"127.0.0.1:{free_port()}")
        result = asyncio.run(run_all(rig, args.repeat, args.rows, say))
    say(result.render())
    write_record(result.to_json, head, here, started, out, say)
    return 0 if result.clean else 1
