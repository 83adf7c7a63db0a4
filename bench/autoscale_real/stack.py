"""The real stack under ``bench/autoscale_real.py``: the model (``fixed_latency`` with three
instances), a topic with its consumer-group or subscription, the consumer configuration, a
publisher that follows an arrival plan second by second, and what the result table says
(latency per row, rows written exactly once)."""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psycopg
import tritonclient.grpc as grpcclient
from google.pubsub_v1 import types as pstypes
from psycopg import sql

from harness.kafka import KafkaEndpoint, create_topic
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.triton import TritonEndpoint
from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.kafka import KafkaPublisher
from rowbatch.producer.publishers.pubsub import PubSubPublisher
from rowbatch.wire.chunks.encode import encode_chunk

Broker = Literal["kafka", "pubsub"]
MODEL = "autoscale_fixed"
VARIANT = FixedLatency(base_ms=100.0, per_row_us=0.0, max_batch_size=200)
"""100 ms per execution whatever its size, asleep: with one request in flight a consumer
writes at most 2,000 rows/s, and the CPU does not move that."""
INSTANCES = 3
"""Executions run side by side on this many instances: room for three such consumers."""
KAFKA_PARTITIONS = 6
BINDING: Mapping[str, Any] = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score"},
    "passthrough": {"id": "int64", "sent_at": "float64"},
}


def model_repository(root: Path) -> Path:
    """``root`` as a model repository holding :data:`MODEL` (:data:`VARIANT`, on
    :data:`INSTANCES` instances)."""
    fixed_latency_repository(root, {MODEL: VARIANT})
    path = root / MODEL / "config.pbtxt"
    text, count = re.subn(
        r"(instance_group \[\s*\{\s*count: )1\b", rf"\g<1>{INSTANCES}", path.read_text()
    )
    if count != 1:
        raise ValueError(f"{path} has no instance count to set")
    path.write_text(text)
    return root


def server_rows_per_s() -> float:
    """What the model server executes at most, all consumers together."""
    return INSTANCES * VARIANT.ceiling()


def executed_rows(triton: TritonEndpoint) -> int:
    """Rows the server has executed for :data:`MODEL` so far (its own statistics)."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        stats = client.get_inference_statistics(MODEL, as_json=True)
    finally:
        client.close()
    return sum(int(m.get("inference_count", 0)) for m in stats.get("model_stats", []))


@dataclass(frozen=True)
class Services:
    """The running services a burst needs (a broker's endpoint only for that broker)."""

    triton: TritonEndpoint
    postgres: PostgresEndpoint
    kafka: KafkaEndpoint | None = None
    pubsub: PubSubEndpoint | None = None

    def env(self) -> dict[str, str]:
        """What a consumer process needs in its environment (the emulator's address)."""
        return self.pubsub.env() if self.pubsub is not None else {}


@dataclass(frozen=True)
class Feed:
    """A new topic and the ``[source]`` section that reads it (without the autoscaling
    settings)."""

    broker: Broker
    topic: str
    source: Mapping[str, Any]

    def publisher(self, services: Services) -> Publisher:
        if self.broker == "kafka":
            assert services.kafka is not None
            return KafkaPublisher(services.kafka.bootstrap_servers, self.topic)
        assert services.pubsub is not None
        return PubSubPublisher(self.topic, emulator_host=services.pubsub.host)


def create_feed(broker: Broker, services: Services) -> Feed:
    """A topic (Kafka: :data:`KAFKA_PARTITIONS` partitions, a new group) or a topic with one
    subscription (Pub/Sub; a 10 s ack deadline, so a message a stopped replica's cancelled
    Pull took comes back within seconds), and its dead-letter topic. Read-ahead is kept to
    about two batches per consumer, so a consumer that joins finds work left."""
    name = f"autoscale-{uuid.uuid4().hex[:10]}"
    if broker == "kafka":
        assert services.kafka is not None
        kafka = services.kafka
        asyncio.run(create_topic(kafka, name, KAFKA_PARTITIONS))
        asyncio.run(create_topic(kafka, f"{name}.dlq", 1))
        return Feed(
            broker,
            name,
            {
                "kind": "kafka",
                "bootstrap_servers": kafka.bootstrap_servers,
                "topic": name,
                "group_id": f"{name}-g",
                "dead_letter_topic": f"{name}.dlq",
                "commit_interval_s": 0.5,
                "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 1000,
            },
        )
    assert services.pubsub is not None
    project = services.pubsub.project
    topic = f"projects/{project}/topics/{name}"
    dlq = f"projects/{project}/topics/{name}-dlq"
    subscription = f"projects/{project}/subscriptions/{name}"
    publisher, subscriber = services.pubsub.publisher(), services.pubsub.subscriber()
    try:
        publisher.create_topic(name=topic)
        publisher.create_topic(name=dlq)
        subscriber.create_subscription(
            request=pstypes.Subscription(name=subscription, topic=topic, ack_deadline_seconds=10)
        )
    finally:
        publisher.transport.close()
        subscriber.close()
    return Feed(
        broker,
        topic,
        {
            "kind": "pubsub",
            "subscription": subscription,
            "dead_letter_topic": dlq,
            "max_messages": 4,
            "pull_max_messages": 4,
            "pull_concurrency": 1,
            "max_lease_extension_s": 10,
        },
    )


def consumer_config(
    feed: Feed,
    services: Services,
    table: str,
    autoscaling: Mapping[str, Any],
) -> dict[str, Any]:
    """The consumer configuration (the dict form of its TOML file; the metrics port is added
    per process): one request in flight, the result table in PostgreSQL, ``autoscaling``
    (``target_latency_s``, ``rows_per_s_per_replica``, ...) in the ``[source]`` section."""
    return {
        "source": {**feed.source, **autoscaling},
        "model": {
            "url": services.triton.grpc_url,
            "name": MODEL,
            "max_wait_ms": 20,
            "max_in_flight": 1,
        },
        "binding": dict(BINDING),
        "sink": {"kind": "postgres", "dsn": services.postgres.dsn, "table": table},
        "shutdown_grace_s": 20.0,
        "log_format": "text",
        "log_level": "WARNING",
    }


# --- the arrivals ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    """``seconds`` of ``rows_per_s``; ``burst`` marks the phases the scaling answers."""

    seconds: float
    rows_per_s: float
    burst: bool = False


@dataclass(frozen=True)
class Plan:
    """What is published: phases one after the other, in messages of ``rows_per_message``
    rows spread evenly over each phase."""

    phases: tuple[Phase, ...]
    rows_per_message: int = 100

    @property
    def duration_s(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in self.sends())

    def windows(self) -> list[tuple[float, float, Phase]]:
        """``(start, end, phase)`` per phase, seconds from the first publish."""
        out: list[tuple[float, float, Phase]] = []
        at = 0.0
        for p in self.phases:
            out.append((at, at + p.seconds, p))
            at += p.seconds
        return out

    def sends(self) -> list[tuple[float, int]]:
        """``(seconds from the start, rows)`` per message."""
        out: list[tuple[float, int]] = []
        for start, _, p in self.windows():
            n = round(p.seconds * p.rows_per_s / self.rows_per_message)
            out += [(start + (i + 0.5) * p.seconds / n, self.rows_per_message) for i in range(n)]
        return out

    def describe(self) -> str:
        return ", ".join(
            f"{p.seconds:g} s at {p.rows_per_s:,.0f} rows/s{' (burst)' if p.burst else ''}"
            for p in self.phases
        )


class PacedPublisher:
    """Publishes ``plan`` from ``t0`` (a ``time.monotonic()`` instant) in a thread of its own,
    each message when its time comes; every row carries its ``id`` (0, 1, ...) and its
    ``sent_at`` (``time.time()`` when handed to the broker's client)."""

    def __init__(
        self, make_publisher: Callable[[], Publisher], plan: Plan, t0: float, tag: str
    ) -> None:
        self.make_publisher = make_publisher
        self.plan = plan
        self.t0 = t0
        self.tag = tag
        self.sent: list[tuple[float, int]] = []
        """``(seconds from t0, rows)`` per message handed to the client."""
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="paced-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def done(self) -> bool:
        """Every message published and acknowledged (or the publisher failed)."""
        return not self._thread.is_alive()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    @property
    def rows(self) -> int:
        return sum(rows for _, rows in list(self.sent))

    def _run(self) -> None:
        try:
            asyncio.run(self._publish())
        except BaseException as exc:  # noqa: BLE001 - reported to the caller, who raises it
            self.error = exc

    async def _publish(self) -> None:
        rng = np.random.default_rng(0)
        pub = self.make_publisher()
        await pub.start()
        try:
            pending: list[asyncio.Task[str]] = []
            next_id = 0
            for at, rows in self.plan.sends():
                wait = self.t0 + at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                chunk = encode_chunk(
                    "events",
                    {
                        "id": np.arange(next_id, next_id + rows, dtype=np.int64),
                        "features": rng.normal(size=(rows, 16)).astype(np.float32),
                        "count": rng.integers(0, 1000, size=rows).astype(np.int64),
                        "sent_at": np.full(rows, time.time(), dtype=np.float64),
                    },
                    "arrow",
                    f"{self.tag}-{next_id}",
                )
                pending.append(asyncio.create_task(pub.publish(chunk)))
                self.sent.append((time.monotonic() - self.t0, rows))
                next_id += rows
            await asyncio.gather(*pending)
            await pub.flush()
        finally:
            await pub.close()


# --- the result table -----------------------------------------------------------------------


def count_rows(dsn: str, table: str) -> int:
    """Rows in the result table (0 before a consumer created it)."""
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if found is None or found[0] is None:
            return 0
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        got = row.fetchone()
    return int(got[0]) if got else 0


@dataclass(frozen=True)
class Written:
    """What the result table holds."""

    rows: int
    distinct_ids: int
    ids_complete: bool
    """Every id 0..published-1 is there, and no other."""
    latency_s: tuple[float, ...]
    """Per row: inference answered (``processed_at``) minus handed to the broker."""
    processed_at: tuple[float, ...]
    """Per row (same order): ``processed_at``, seconds since the epoch."""

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latency_s, q * 100)) if self.latency_s else math.nan

    def longest_gap_s(self, start: float, end: float) -> float:
        """The longest time between consecutive answers from the model within ``start..end``
        (epoch seconds): while work waits, how long the group wrote nothing (a rebalance)."""
        times = np.unique([t for t in self.processed_at if start <= t <= end])
        return float(np.diff(times).max()) if len(times) > 1 else 0.0


def read_written(dsn: str, table: str, published: int) -> Written:
    query = sql.SQL("SELECT id, extract(epoch FROM processed_at)::float8, sent_at FROM {}").format(
        sql.Identifier(table)
    )
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    ids = np.array([r[0] for r in rows], dtype=np.int64)
    distinct = np.unique(ids)
    complete = len(distinct) == published and (
        published == 0 or (int(distinct[0]) == 0 and int(distinct[-1]) == published - 1)
    )
    return Written(
        len(rows),
        len(distinct),
        complete,
        tuple(float(r[1]) - float(r[2]) for r in rows),
        tuple(float(r[1]) for r in rows),
    )


def drop_table(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
