"""The local stack for a benchmark run, and what the sections do with it: topics with their
subscriptions or groups ("feeds"), publishing, consumer configs and sinks."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg
import pyarrow.dataset as ds
from google.pubsub_v1 import types as pstypes
from psycopg import sql

from harness.kafka import create_topic
from harness.pubsub import PubSubEndpoint
from harness.service import RunDir
from harness.stack import StackEndpoints, local_stack
from rowbatch.producer.loadgen.plan import plan_messages
from rowbatch.producer.loadgen.spec import LoadKind, LoadSpec
from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.kafka import KafkaPublisher
from rowbatch.producer.publishers.messages import Message, PublishedChunk
from rowbatch.producer.publishers.pubsub import PubSubPublisher
from rowbatch.producer.publishers.window import PublishWindow
from rowbatch.wire.headers.fields import Encoding

Broker = Literal["pubsub", "kafka"]
SinkKind = Literal["sqlite", "postgres", "parquet"]
BROKERS: tuple[Broker, ...] = ("pubsub", "kafka")
SINKS: tuple[SinkKind, ...] = ("sqlite", "postgres", "parquet")
KAFKA_PARTITIONS = 6
BENCH_PUBSUB_HEAP = "2g"  # the emulator's -Xmx; see drop_pubsub_feeds

TEXT_BINDING: Mapping[str, Any] = {
    "inputs": {"text": "TEXT"},
    "outputs": {"EMBEDDING": "embedding"},
    "passthrough": {"id": "int64"},
}
SCORER_BINDING: Mapping[str, Any] = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}
NOOP_NUMERIC_BINDING: Mapping[str, Any] = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score"},
    "passthrough": {"id": "int64"},
}


@dataclass(frozen=True)
class Bench:
    """What every section gets: the running services and where to put files."""

    stack: StackEndpoints
    workdir: Path
    quick: bool

    def dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path


@contextlib.contextmanager
def bench_stack(root: Path, quick: bool) -> Iterator[Bench]:
    """Kafka, Pub/Sub, Triton and PostgreSQL under ``root/<timestamp>/`` (logs stay there);
    every service is stopped by pid when the block ends."""
    run = RunDir(root / time.strftime("%Y%m%d-%H%M%S"))
    run.root.mkdir(parents=True, exist_ok=True)
    with local_stack(run, pubsub_heap=BENCH_PUBSUB_HEAP) as stack:
        yield Bench(stack, run.data("bench"), quick)


def drop_pubsub_feeds(pubsub: PubSubEndpoint) -> int:
    """Delete every subscription and topic of ``pubsub.project``; returns how many went.

    The emulator keeps each topic's messages in its heap until the topic is deleted: a
    three-run ``--repeat`` published enough to exhaust it (GOAWAY frame-too-large, then
    OutOfMemoryError), so the runner drops them after each section."""
    project = f"projects/{pubsub.project}"
    publisher, subscriber = pubsub.publisher(), pubsub.subscriber()
    dropped = 0
    try:
        for sub in list(subscriber.list_subscriptions(request={"project": project})):
            subscriber.delete_subscription(request={"subscription": sub.name})
            dropped += 1
        for topic in list(publisher.list_topics(request={"project": project})):
            publisher.delete_topic(request={"topic": topic.name})
            dropped += 1
    finally:
        publisher.transport.close()
        subscriber.close()
    return dropped


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


# --- feeds: a topic and its readers ----------------------------------------------------------


@dataclass(frozen=True)
class Feed:
    """A topic, its dead-letter topic, and its readers: Pub/Sub subscriptions (each gets every
    message) or Kafka consumer-group ids (each group reads the whole topic)."""

    broker: Broker
    topic: str
    dlq: str
    readers: tuple[str, ...]


def create_feed(stack: StackEndpoints, broker: Broker, readers: int = 1) -> Feed:
    """A new topic with ``readers`` subscriptions (Pub/Sub, created before anything is
    published so each one sees the whole backlog) or group ids (Kafka, 6 partitions)."""
    name = unique(f"bench-{broker}").replace("_", "-")
    if broker == "kafka":
        feed = Feed(broker, name, f"{name}.dlq", tuple(f"{name}-g{i}" for i in range(readers)))
        asyncio.run(create_topic(stack.kafka, feed.topic, KAFKA_PARTITIONS))
        asyncio.run(create_topic(stack.kafka, feed.dlq, 1))
        return feed
    project = stack.pubsub.project
    feed = Feed(
        broker,
        f"projects/{project}/topics/{name}",
        f"projects/{project}/topics/{name}-dlq",
        tuple(f"projects/{project}/subscriptions/{name}-s{i}" for i in range(readers)),
    )
    publisher, subscriber = stack.pubsub.publisher(), stack.pubsub.subscriber()
    try:
        publisher.create_topic(name=feed.topic)
        publisher.create_topic(name=feed.dlq)
        for sub in feed.readers:
            subscriber.create_subscription(
                request=pstypes.Subscription(name=sub, topic=feed.topic, ack_deadline_seconds=60)
            )
    finally:
        publisher.transport.close()
        subscriber.close()
    return feed


def source_config(stack: StackEndpoints, feed: Feed, reader: int = 0) -> dict[str, Any]:
    if feed.broker == "kafka":
        return {
            "kind": "kafka",
            "bootstrap_servers": stack.kafka.bootstrap_servers,
            "topic": feed.topic,
            "group_id": feed.readers[reader],
            "dead_letter_topic": feed.dlq,
        }
    return {
        "kind": "pubsub",
        "subscription": feed.readers[reader],
        "dead_letter_topic": feed.dlq,
    }


def consumer_config(
    stack: StackEndpoints,
    feed: Feed,
    model: str,
    binding: Mapping[str, Any],
    sink: Mapping[str, Any],
    *,
    reader: int = 0,
    model_extra: Mapping[str, Any] | None = None,
    **top: Any,
) -> dict[str, Any]:
    """A consumer config (the dict form of the TOML file) for one reader of ``feed``."""
    return {
        "source": source_config(stack, feed, reader),
        "model": {"url": stack.triton.grpc_url, "name": model, **(model_extra or {})},
        "binding": dict(binding),
        "sink": dict(sink),
        "log_format": "text",
        "log_level": "WARNING",
        **top,
    }


# --- publishing -------------------------------------------------------------------------------


def backlog(
    kind: LoadKind,
    rows: int,
    chunk_rows: int,
    encoding: Encoding = Encoding.ARROW,
    *,
    prefix: str = "bench",
    max_chunk_bytes: int = 900_000,
) -> list[Message]:
    """A generated table (``rowbatch.producer.loadgen``), encoded as messages ready to publish."""
    spec = LoadSpec(
        rows=rows, chunk_rows=chunk_rows, kind=kind, encoding=encoding, id_prefix=prefix
    )
    return [p.message for p in plan_messages(spec, max_chunk_bytes=max_chunk_bytes)]


@contextlib.asynccontextmanager
async def publisher(stack: StackEndpoints, feed: Feed) -> Any:
    pub: Publisher
    if feed.broker == "kafka":
        pub = KafkaPublisher(stack.kafka.bootstrap_servers, feed.topic)
    else:
        pub = PubSubPublisher(feed.topic, emulator_host=stack.pubsub.host)
    await pub.start()
    try:
        yield pub
    finally:
        await pub.close()


@dataclass(frozen=True)
class Published:
    messages: int
    rows: int
    seconds: float


async def _publish(
    stack: StackEndpoints, feed: Feed, messages: Iterable[Message], max_in_flight: int
) -> Published:
    done: list[PublishedChunk] = []
    started = time.monotonic()
    async with publisher(stack, feed) as pub:
        window = PublishWindow(pub, max_in_flight=max_in_flight, on_done=done.append)
        for message in messages:
            await window.submit(message)
        await window.drain()
        await pub.flush()
    return Published(len(done), sum(d.rows for d in done), time.monotonic() - started)


def publish(
    stack: StackEndpoints, feed: Feed, messages: Iterable[Message], max_in_flight: int = 256
) -> Published:
    """Publish and wait for every message to be confirmed by the broker."""
    return asyncio.run(_publish(stack, feed, messages, max_in_flight))


# --- sinks ------------------------------------------------------------------------------------


def sink_config(bench: Bench, kind: SinkKind, table: str) -> dict[str, Any]:
    if kind == "postgres":
        return {"kind": "postgres", "dsn": bench.stack.postgres.dsn, "table": table}
    if kind == "sqlite":
        return {
            "kind": "sqlite",
            "path": str(bench.dir("sqlite") / f"{table}.sqlite"),
            "table": table,
        }
    return {"kind": "parquet", "url": str(bench.dir("parquet") / table), "table": table}


def count_rows(bench: Bench, kind: SinkKind, table: str) -> int:
    """Rows in a result table (to check a run wrote every row exactly once)."""
    if kind == "postgres":
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        with psycopg.connect(bench.stack.postgres.dsn) as conn:
            row = conn.execute(query).fetchone()
        return int(row[0]) if row else 0
    if kind == "sqlite":
        path = bench.dir("sqlite") / f"{table}.sqlite"
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as conn:
            text = f'SELECT count(*) FROM "{table}"'  # noqa: S608 - our own table name
            return int(conn.execute(text).fetchone()[0])
    return int(ds.dataset(bench.dir("parquet") / table, partitioning="hive").count_rows())


def remove_table(bench: Bench, kind: SinkKind, table: str) -> None:
    """Drop a result table once counted (benchmarks write millions of rows)."""
    if kind == "postgres":
        with psycopg.connect(bench.stack.postgres.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    elif kind == "sqlite":
        (bench.dir("sqlite") / f"{table}.sqlite").unlink(missing_ok=True)
    else:
        shutil.rmtree(bench.dir("parquet") / table, ignore_errors=True)
