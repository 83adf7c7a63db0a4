"""The README's main job against the local stack: publish a sample table to Pub/Sub or Kafka
(2 % of its messages deliberately malformed), consume it through Triton's ``embedder`` into a
result table, and print what happened."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from prometheus_client import CollectorRegistry
from pydantic import TypeAdapter

from harness.stack import StackEndpoints
from rowbatch.consumer.service.admin import ensure_source
from rowbatch.consumer.service.build_io import make_source
from rowbatch.consumer.service.config import ConsumerConfig, SourceSettings
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.consumer.sources.base import Source
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.producer.loadgen.plan import PlannedMessage, plan_messages
from rowbatch.producer.loadgen.spec import LoadSpec, MalformedKind
from rowbatch.producer.publishers.kafka import KafkaPublisher
from rowbatch.wire.chunks.split import PUBSUB_MAX_MESSAGE_BYTES

Broker = Literal["pubsub", "kafka"]
KAFKA_PARTITIONS = 6


@dataclass(frozen=True)
class DemoSettings:
    rows: int = 50_000
    chunk_rows: int = 500
    malformed: float = 0.02
    sink: str = "sqlite"
    """``sqlite`` (a file under ``sqlite_dir``) or ``postgres`` (the stack's PostgreSQL)."""
    broker: Broker = "pubsub"
    sqlite_dir: Path = Path(".stack/local")


@dataclass(frozen=True)
class DemoResult:
    rows_written: int
    valid_rows: int
    messages: int
    malformed_messages: int
    dead_lettered: int
    seconds: float
    batch_fill: float
    dead_letter_topic: str


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


@dataclass(frozen=True)
class _Published:
    source: dict[str, Any]
    """The consumer's ``[source]`` section for what was published."""
    dead_letter_topic: str
    messages: int
    valid_rows: int
    malformed_messages: int
    seconds: float


def _plan(settings: DemoSettings, unique: str, max_chunk_bytes: int) -> list[PlannedMessage]:
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
    return list(plan_messages(spec, max_chunk_bytes=max_chunk_bytes))


def _ensure(source: dict[str, Any]) -> None:
    """Create the topics and subscriptions the demo's ``[source]`` needs, the way operators
    do: ``rowbatch-consumer admin ensure`` (its function), nothing by hand."""
    settings = TypeAdapter(SourceSettings).validate_python(source)
    plan = asyncio.run(ensure_source(settings))
    print(f"  admin ensure: created {len(plan.to_create)} broker resource(s)")


def _publish_pubsub(stack: StackEndpoints, settings: DemoSettings, unique: str) -> _Published:
    """Create topic, dead-letter topic and subscription, and publish the sample table."""
    project = stack.pubsub.project
    topic = f"projects/{project}/topics/demo-{unique}"
    dlq = f"projects/{project}/topics/demo-{unique}-dlq"
    source = {
        "kind": "pubsub",
        "topic": topic,
        "subscription": f"projects/{project}/subscriptions/demo-{unique}",
        "dead_letter_topic": dlq,
        "ack_deadline_s": 30,
    }
    _ensure(source)
    publisher = stack.pubsub.publisher()
    try:
        started = time.monotonic()
        planned = _plan(settings, unique, PUBSUB_MAX_MESSAGE_BYTES)
        futures = [
            publisher.publish(topic, p.message.payload, **dict(p.message.attributes))
            for p in planned
        ]
        for future in futures:
            future.result(timeout=60)
        seconds = time.monotonic() - started
    finally:
        publisher.transport.close()
    return _published(source, dlq, planned, seconds)


def _publish_kafka(stack: StackEndpoints, settings: DemoSettings, unique: str) -> _Published:
    """Create the topic (6 partitions) and its dead-letter topic, and publish the table."""
    topic, dlq = f"demo-{unique}", f"demo-{unique}.dlq"
    bootstrap = stack.kafka.bootstrap_servers
    source = {
        "kind": "kafka",
        "bootstrap_servers": bootstrap,
        "topic": topic,
        "group_id": f"demo-{unique}",
        "dead_letter_topic": dlq,
        "partitions": KAFKA_PARTITIONS,
        "replication_factor": 1,  # the local stack has one broker
    }
    _ensure(source)
    return asyncio.run(_publish_kafka_rows(settings, unique, source=source, dlq=dlq))


async def _publish_kafka_rows(
    settings: DemoSettings, unique: str, *, source: dict[str, Any], dlq: str
) -> _Published:
    bootstrap, topic = source["bootstrap_servers"], source["topic"]
    started = time.monotonic()
    async with KafkaPublisher(bootstrap, topic) as publisher:
        planned = _plan(settings, unique, publisher.max_chunk_bytes)
        await asyncio.gather(*(publisher.publish(p.message) for p in planned))
    return _published(source, dlq, planned, time.monotonic() - started)


def _published(
    source: dict[str, Any], dlq: str, planned: list[PlannedMessage], seconds: float
) -> _Published:
    valid_rows = sum(p.rows for p in planned if p.kind is None)
    malformed = sum(1 for p in planned if p.kind is not None)
    return _Published(source, dlq, len(planned), valid_rows, malformed, seconds)


def _histogram_mean(registry: CollectorRegistry, name: str) -> float:
    total = registry.get_sample_value(f"{name}_sum") or 0.0
    count = registry.get_sample_value(f"{name}_count") or 0.0
    return total / count if count else 0.0


def run_demo(stack: StackEndpoints, settings: DemoSettings | None = None) -> DemoResult:
    settings = settings or DemoSettings()
    os.environ.update(stack.pubsub.env())
    where_to = "Kafka (6 partitions)" if settings.broker == "kafka" else "Pub/Sub"
    print(
        f"\nPublishing {settings.rows:,} text rows in chunks of {settings.chunk_rows} to "
        f"{where_to} ({settings.malformed:.0%} of messages malformed) ..."
    )
    unique = uuid.uuid4().hex[:8]
    published = (
        _publish_kafka(stack, settings, unique)
        if settings.broker == "kafka"
        else _publish_pubsub(stack, settings, unique)
    )
    print(f"  {published.messages} messages in {published.seconds:.1f} s")
    sqlite_path = (settings.sqlite_dir / "demo-results.sqlite").resolve()
    sink: dict[str, Any] = (
        {"kind": "postgres", "dsn": stack.postgres.dsn, "table": "demo_embeddings"}
        if settings.sink == "postgres"
        else {"kind": "sqlite", "path": str(sqlite_path), "table": "demo_embeddings"}
    )
    config = ConsumerConfig.model_validate(
        {
            "source": published.source,
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
    source = LatencyRecorder(make_source(config.source))
    summary = asyncio.run(_consume(config, source, published.messages))
    where = stack.postgres.dsn if settings.sink == "postgres" else sqlite_path
    lat = np.array(source.seconds) if source.seconds else np.zeros(1)
    result = DemoResult(
        rows_written=int(summary["rows"]),
        valid_rows=published.valid_rows,
        messages=published.messages,
        malformed_messages=published.malformed_messages,
        dead_lettered=int(summary["dead"]),
        seconds=summary["seconds"],
        batch_fill=summary["fill"],
        dead_letter_topic=published.dead_letter_topic,
    )
    print(
        f"\nConsumed from {where_to} through Triton 'embedder' (batch size "
        f"{summary['target']:.0f}) into {settings.sink} table demo_embeddings ({where}):"
    )
    print(
        f"  rows written      {result.rows_written:>10,}   "
        f"(valid rows published: {result.valid_rows:,})"
    )
    print(
        f"  dead-lettered     {result.dead_lettered:>10,}   messages, with reasons, to "
        f"{result.dead_letter_topic}"
    )
    print(
        f"  throughput        {result.rows_written / result.seconds:>10,.0f}   rows/s "
        f"({result.seconds:.1f} s)"
    )
    print(f"  batch fill        {result.batch_fill:>10.0%}   mean rows per batch / target")
    print(
        f"  latency p50/p99   {np.percentile(lat, 50):>6.2f} s / {np.percentile(lat, 99):.2f} s"
        "   publish to written (backlog drained from a standing start)"
    )
    return result


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
