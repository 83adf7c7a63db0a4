"""``python -m bench multi_endpoint``: one consumer feeding one model server, then two (given as
grpc's ``ipv4:`` list): rows/s with each server alone and with both, and the ratio of both to
the sum of each alone. Two tritonservers serve a ``fixed_latency`` variant (each execution
sleeps a fixed time, as an accelerator would take, so the figure does not move with this
machine's CPU); a backlog on the Pub/Sub emulator is drained into SQLite by a consumer running
in this process.

    python -m bench multi_endpoint [--rows 40000] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shlex
import sqlite3
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from google.pubsub_v1 import types as pstypes

from bench.help_text import description
from bench.report import Table, rate
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.pubsub import PubSubEndpoint, PubSubService
from harness.reference_models import score
from harness.service import REPO_ROOT, RunDir
from harness.triton import TritonService
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk

MODEL = "fixed_latency"
VARIANT = FixedLatency(base_ms=50.0, per_row_us=0.0, max_batch_size=256)
"""50 ms per execution of up to 256 rows: 5,120 rows/s per server, far below what one consumer
drains, so two servers can double it."""
ROWS = 40_000
ROWS_PER_MESSAGE = 500
TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Feed:
    """A topic with its subscription and a dead-letter topic on the emulator."""

    topic: str
    subscription: str
    dlq: str

    @classmethod
    def create(cls, pubsub: PubSubEndpoint) -> Feed:
        name = f"multi-{uuid.uuid4().hex[:10]}"
        project = f"projects/{pubsub.project}"
        feed = cls(f"{project}/topics/{name}", f"{project}/subscriptions/{name}", "")
        feed = dataclasses.replace(feed, dlq=f"{project}/topics/{name}-dlq")
        publisher, subscriber = pubsub.publisher(), pubsub.subscriber()
        try:
            publisher.create_topic(name=feed.topic)
            publisher.create_topic(name=feed.dlq)
            subscriber.create_subscription(
                request=pstypes.Subscription(
                    name=feed.subscription, topic=feed.topic, ack_deadline_seconds=60
                )
            )
        finally:
            publisher.transport.close()
            subscriber.close()
        return feed

    def publish(self, pubsub: PubSubEndpoint, chunks: Sequence[EncodedChunk]) -> None:
        publisher = pubsub.publisher()
        try:
            futures = [publisher.publish(self.topic, c.payload, **c.attributes) for c in chunks]
            for future in futures:
                future.result(timeout=60)
        finally:
            publisher.transport.close()


def backlog(
    total: int, seed: int = 0, rows_per_message: int = ROWS_PER_MESSAGE
) -> tuple[list[EncodedChunk], dict[int, float]]:
    """Messages of ``fixed_latency`` rows (ids 0..total-1), and each id's expected SCORE."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(total, 16)).astype(np.float32)
    counts = rng.integers(0, 1000, size=total).astype(np.int64)
    scores, _ = score(features, counts.reshape(-1, 1))
    chunks = [
        encode_chunk(
            "events",
            {
                "id": np.arange(start, min(start + rows_per_message, total), dtype=np.int64),
                "features": features[start : start + rows_per_message],
                "count": counts[start : start + rows_per_message],
            },
            "arrow",
            f"m{seed}-{start}",
        )
        for start in range(0, total, rows_per_message)
    ]
    return chunks, {i: float(scores[i, 0]) for i in range(total)}


def consumer_config(
    feed: Feed, url: str | list[str], sqlite: Path, model: str = MODEL, **model_extra: Any
) -> ConsumerConfig:
    """A consumer of ``feed`` calling ``model`` at ``url``, writing ``id, score`` to SQLite."""
    return ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "subscription": feed.subscription,
                "dead_letter_topic": feed.dlq,
            },
            "model": {
                "url": url,
                "name": model,
                "max_wait_ms": 20,
                "backoff_max_s": 1.0,
                **model_extra,
            },
            "binding": {
                "inputs": {"features": "FEATURES", "count": "COUNT"},
                "outputs": {"SCORE": "score"},
                "passthrough": {"id": "int64"},
            },
            "sink": {"kind": "sqlite", "path": str(sqlite), "table": "results"},
            "server": {"port": 0},
            "log_format": "text",
            "log_level": "WARNING",
        }
    )


def compare(sqlite: Path, expected: Mapping[int, float]) -> tuple[int, int, int]:
    """Rows missing, rows with a wrong score, and duplicate rows in the result table."""
    with contextlib.closing(sqlite3.connect(sqlite)) as conn:
        rows = conn.execute("SELECT id, score FROM results").fetchall()
    got = {int(i): float(s) for i, s in rows}
    wrong = sum(1 for i, s in got.items() if not np.isclose(s, expected.get(i, np.nan), rtol=1e-6))
    return len(set(expected) - set(got)), wrong, len(rows) - len(got)


def sample(running: Running, name: str, **labels: str) -> float:
    return running.metrics.registry.get_sample_value(name, labels) or 0.0


def total(running: Running, name: str) -> float:
    return sum(
        s.value
        for m in running.metrics.registry.collect()
        for s in m.samples
        if s.name == name and s.value > 0
    )


def requests_per_endpoint(running: Running) -> dict[str, int]:
    return {
        s.labels["endpoint"]: int(s.value)
        for m in running.metrics.registry.collect()
        for s in m.samples
        if s.name == "rowbatch_endpoint_requests_total"
    }


@dataclass(frozen=True)
class Drained:
    """One consumer run over a backlog published before it started."""

    label: str
    url: str
    rows: int
    seconds: float
    """First row written to the last."""
    rows_per_s: float
    requests: dict[str, int]
    """Inference requests per endpoint."""
    dead_letters: int
    nacked: int
    backoffs: int
    missing: int
    wrong: int
    duplicates: int

    @property
    def clean(self) -> bool:
        return not (
            self.dead_letters or self.nacked or self.missing or self.wrong or self.duplicates
        )


async def drain(
    pubsub: PubSubEndpoint,
    url: str | list[str],
    workdir: Path,
    rows: int,
    *,
    label: str,
    model: str = MODEL,
    seed: int = 0,
    timeout_s: float = TIMEOUT_S,
) -> Drained:
    """Publish ``rows`` rows, run a consumer at ``url`` until all are written, and measure.
    The emulator's address must be in the environment (``pubsub.env()``)."""
    feed = Feed.create(pubsub)
    chunks, expected = backlog(rows, seed)
    await asyncio.to_thread(feed.publish, pubsub, chunks)
    sqlite = workdir / f"{re.sub(r'[^a-z0-9]+', '-', label.lower())}-{uuid.uuid4().hex[:6]}.sqlite"
    started: list[Running] = []
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_consumer(consumer_config(feed, url, sqlite, model), stop, on_running=started.append)
    )
    try:
        first: tuple[float, float] | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            if task.done():
                task.result()
                raise RuntimeError(f"{label}: the consumer stopped before writing every row")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: not every row written after {timeout_s:.0f} s")
            written = sample(started[0], "rowbatch_rows_written_total") if started else 0.0
            now = time.monotonic()
            if written and first is None:
                first = (now, written)
            if written >= rows:
                break
            await asyncio.sleep(0.02)
        assert first is not None
        running = started[0]
        seconds = max(now - first[0], 1e-9)
        result = (
            seconds,
            (rows - first[1]) / seconds,
            requests_per_endpoint(running),
            int(total(running, "rowbatch_messages_dead_lettered_total")),
            int(sample(running, "rowbatch_messages_nacked_total")),
            int(sample(running, "rowbatch_backoff_periods_total")),
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    missing, wrong, duplicates = compare(sqlite, expected)
    shown = url if isinstance(url, str) else ",".join(url)
    return Drained(label, shown, rows, *result, missing, wrong, duplicates)


@dataclass(frozen=True)
class MultiEndpoint:
    variant: FixedLatency
    alone: tuple[Drained, Drained]
    both: Drained

    @property
    def ratio(self) -> float:
        """Rows/s with both servers over the sum of each alone."""
        return self.both.rows_per_s / sum(run.rows_per_s for run in self.alone)

    def table(self) -> Table:
        ceiling = self.variant.ceiling()
        rows = []
        for run, servers in ((self.alone[0], 1), (self.alone[1], 1), (self.both, 2)):
            rows.append(
                (
                    run.label,
                    f"{run.rows:,}",
                    rate(run.rows_per_s),
                    f"{run.rows_per_s / (servers * ceiling):.0%}",
                    " / ".join(f"{n:,}" for n in run.requests.values()),
                    str(run.dead_letters),
                    "yes" if run.clean else "NO",
                )
            )
        v = self.variant
        return Table(
            "Several model servers: one consumer, one server vs two",
            (
                "run",
                "rows",
                "rows/s",
                "of ceiling",
                "requests per server",
                "dead letters",
                "all rows once",
            ),
            tuple(rows),
            (
                f"both / (A alone + B alone) = {self.ratio:.2f}",
                f"model {MODEL}: {v.base_ms:g} ms + {v.per_row_us:g} us/row per execution, "
                f"batch {v.max_batch_size}, 1 instance: {ceiling:,.0f} rows/s per server",
                "Pub/Sub emulator -> consumer (this process) -> SQLite; rows/s from the first "
                "row written to the last.",
            ),
        )


async def measure(
    pubsub: PubSubEndpoint,
    urls: tuple[str, str],
    workdir: Path,
    rows: int,
    variant: FixedLatency = VARIANT,
) -> MultiEndpoint:
    """Each server alone with ``rows`` rows, then both (an ``ipv4:`` list) with twice as many."""
    a = await drain(pubsub, urls[0], workdir, rows, label="server A alone", seed=1)
    b = await drain(pubsub, urls[1], workdir, rows, label="server B alone", seed=2)
    both = await drain(
        pubsub, f"ipv4:{urls[0]},{urls[1]}", workdir, 2 * rows, label="A + B (ipv4: list)", seed=3
    )
    return MultiEndpoint(variant, (a, b), both)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench multi_endpoint", description=description(__doc__)
    )
    parser.add_argument(
        "--rows", type=int, default=ROWS, help=f"rows per server (default {ROWS:,})"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run = RunDir(REPO_ROOT / ".stack" / "multi-endpoint" / stamp)
    out = args.out or run.root / "multi-endpoint.json"
    repo = fixed_latency_repository(run.data("models"), {MODEL: VARIANT})
    print(f"Starting the Pub/Sub emulator and two tritonservers (logs under {run.root}) ...")
    servers = [TritonService(run, repo, name=f"triton-{n}") for n in "ab"]
    with contextlib.ExitStack() as stack:
        pubsub = stack.enter_context(PubSubService(run))
        for server in servers:
            stack.callback(server.stop)
        with ThreadPoolExecutor(2) as pool:
            endpoints = list(pool.map(lambda server: server.start(), servers))
        os.environ.update(pubsub.env())
        result = asyncio.run(
            measure(
                pubsub, (endpoints[0].grpc_url, endpoints[1].grpc_url), run.data("bench"), args.rows
            )
        )
    print(result.table().render())
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": shlex.join(
            [Path(sys.executable).name, "-m", "bench", "multi_endpoint", *list(argv or [])]
        ),
        "started_at": stamp,
        "cpu_count": os.cpu_count(),
        "ratio": round(result.ratio, 3),
        "result": dataclasses.asdict(result),
    }
    out.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    print(f"\nresults in {out}")
    return 0 if all(r.clean for r in (*result.alone, result.both)) else 1
