"""The README's main job against the local stack: publish a sample table to Pub/Sub (2 % of
its messages deliberately malformed), consume it through Triton's ``embedder`` into a result
table, and print what happened."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from google.pubsub_v1 import types as pstypes
from prometheus_client import CollectorRegistry

from consumer.config import ConsumerConfig
from consumer.service import Running, run_consumer
from consumer.sources.base import DeadLetterReason, Delivery, Source
from consumer.sources.pubsub import PubSubSource, PubSubSourceConfig
from harness.stack import StackEndpoints
from producer.loadgen import LoadSpec, MalformedKind, plan_messages
from producer.wire import PUBSUB_MAX_MESSAGE_BYTES


@dataclass(frozen=True)
class DemoSettings:
    rows: int = 50_000
    chunk_rows: int = 500
    malformed: float = 0.02
    sink: str = "sqlite"
    """``sqlite`` (a file under the run dir) or ``postgres`` (the stack's PostgreSQL)."""


@dataclass
class LatencyRecorder:
    """A ``Source`` wrapper noting publish-to-ack seconds of every acked message."""

    inner: Source
    seconds: list[float] = field(default_factory=list)

    async def check(self) -> None:
        await self.inner.check()

    async def deliveries(self) -> AsyncIterator[Delivery]:
        async for delivery in self.inner.deliveries():
            yield delivery

    async def ack(self, delivery: Delivery) -> None:
        await self.inner.ack(delivery)
        self.seconds.append(time.time() - delivery.publish_time)

    async def nack(self, delivery: Delivery) -> None:
        await self.inner.nack(delivery)

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        await self.inner.dead_letter(delivery, reason)

    def pause(self) -> None:
        self.inner.pause()

    def resume(self) -> None:
        self.inner.resume()

    async def close(self) -> None:
        await self.inner.close()


def _publish(stack: StackEndpoints, settings: DemoSettings) -> tuple[str, str, int, int, float]:
    """Create topics and publish the sample table; returns subscription, DLQ topic, messages,
    valid rows, and publish seconds."""
    project, unique = stack.pubsub.project, uuid.uuid4().hex[:8]
    topic = f"projects/{project}/topics/demo-{unique}"
    dlq = f"projects/{project}/topics/demo-{unique}-dlq"
    subscription = f"projects/{project}/subscriptions/demo-{unique}"
    publisher, subscriber = stack.pubsub.publisher(), stack.pubsub.subscriber()
    try:
        publisher.create_topic(name=topic)
        publisher.create_topic(name=dlq)
        subscriber.create_subscription(
            request=pstypes.Subscription(name=subscription, topic=topic, ack_deadline_seconds=30)
        )
        spec = LoadSpec(
            rows=settings.rows,
            chunk_rows=settings.chunk_rows,
            kind="text",
            malformed=settings.malformed,
            malformed_kinds=(
                MalformedKind.BAD_ENCODING,
                MalformedKind.WRONG_TYPE,
                MalformedKind.MISSING_HEADER,
            ),
            id_prefix=f"demo-{unique}",
        )
        started = time.monotonic()
        planned = list(plan_messages(spec, max_chunk_bytes=PUBSUB_MAX_MESSAGE_BYTES))
        futures = [
            publisher.publish(topic, p.message.payload, **dict(p.message.attributes))
            for p in planned
        ]
        for future in futures:
            future.result(timeout=60)
        valid_rows = sum(p.rows for p in planned if p.kind is None)
        return subscription, dlq, len(planned), valid_rows, time.monotonic() - started
    finally:
        publisher.transport.close()
        subscriber.close()


def _histogram_mean(registry: CollectorRegistry, name: str) -> float:
    total = registry.get_sample_value(f"{name}_sum") or 0.0
    count = registry.get_sample_value(f"{name}_count") or 0.0
    return total / count if count else 0.0


def run_demo(stack: StackEndpoints, settings: DemoSettings | None = None) -> None:
    settings = settings or DemoSettings()
    os.environ.update(stack.pubsub.env())
    print(
        f"\nPublishing {settings.rows:,} text rows in chunks of {settings.chunk_rows} "
        f"({settings.malformed:.0%} of messages malformed) ..."
    )
    subscription, dlq, messages, valid_rows, pub_s = _publish(stack, settings)
    print(f"  {messages} messages in {pub_s:.1f} s")
    sqlite_path = Path(".stack/local/demo-results.sqlite").resolve()
    sink: dict[str, Any] = (
        {"kind": "postgres", "dsn": stack.postgres.dsn, "table": "demo_embeddings"}
        if settings.sink == "postgres"
        else {"kind": "sqlite", "path": str(sqlite_path), "table": "demo_embeddings"}
    )
    config = ConsumerConfig.model_validate(
        {
            "source": {"kind": "pubsub", "subscription": subscription, "dead_letter_topic": dlq},
            "model": {"url": stack.triton.grpc_url, "name": "embedder"},
            "binding": {
                "inputs": {"text": "TEXT"},
                "outputs": {"EMBEDDING": "embedding"},
                "passthrough": {"id": "int64"},
            },
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
            "log_level": "WARNING",
        }
    )
    source = LatencyRecorder(
        PubSubSource(PubSubSourceConfig(subscription=subscription, dead_letter_topic=dlq))
    )
    summary = asyncio.run(_consume(config, source, messages))
    where = stack.postgres.dsn if settings.sink == "postgres" else sqlite_path
    lat = np.array(source.seconds) if source.seconds else np.zeros(1)
    print(
        f"\nConsumed through Triton 'embedder' (batch size {summary['target']:.0f}) "
        f"into {settings.sink} table demo_embeddings ({where}):"
    )
    print(f"  rows written      {summary['rows']:>10,.0f}   (valid rows published: {valid_rows:,})")
    print(f"  dead-lettered     {summary['dead']:>10,.0f}   messages, with reasons, to {dlq}")
    print(
        f"  throughput        {summary['rows'] / summary['seconds']:>10,.0f}   rows/s "
        f"({summary['seconds']:.1f} s)"
    )
    print(f"  batch fill        {summary['fill']:>10.0%}   mean rows per batch / target")
    print(
        f"  latency p50/p99   {np.percentile(lat, 50):>6.2f} s / {np.percentile(lat, 99):.2f} s"
        "   publish to written (backlog drained from a standing start)"
    )


async def _consume(config: ConsumerConfig, source: Source, messages: int) -> dict[str, float]:
    stop = asyncio.Event()
    running: list[Running] = []
    started = time.monotonic()
    task = asyncio.create_task(run_consumer(config, stop, source=source, on_running=running.append))
    try:
        while True:
            if task.done():
                task.result()
                raise RuntimeError("the consumer stopped early")
            if running:
                reg = running[0].metrics.registry
                acked = reg.get_sample_value("rowbatch_messages_acked_total") or 0.0
                dead = sum(
                    s.value for m in reg.collect() for s in m.samples
                    if s.name == "rowbatch_messages_dead_lettered_total"
                )  # fmt: skip
                if acked + dead >= messages:
                    break
            await asyncio.sleep(0.2)
        seconds = time.monotonic() - started
    finally:
        stop.set()
        await task
    reg = running[0].metrics.registry
    return {
        "rows": reg.get_sample_value("rowbatch_rows_written_total") or 0.0,
        "dead": dead,
        "seconds": seconds,
        "fill": _histogram_mean(reg, "rowbatch_batch_fill_ratio"),
        "target": float(running[0].target_batch_size),
    }
