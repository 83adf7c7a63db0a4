"""The ``kafka-share`` source (issue 51, experimental) on a real Kafka 4.4.0 broker with share
groups, real Triton and PostgreSQL: two consumers of two members each share a ONE-partition
topic (four members past the partition count), every row lands exactly once in PostgreSQL,
each consumer's share is reported, and records that are poison are dead-lettered once each,
with their reason, by rowbatch (then rejected), none of them archived silently."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import numpy as np
import psycopg
import pytest
from confluent_kafka import Consumer, Producer

from harness.kafka import KafkaEndpoint, create_topic
from harness.postgres import PostgresEndpoint
from harness.reference_models import score
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.dead_letter import ATTR_REASON
from tests.integration import share_fixtures
from tests.integration.consumer_helpers import consumer_running, wait_until
from tests.integration.test_consumer_process import SCORER_BINDING, pg_count, unique_table

share_kafka = share_fixtures.share_kafka  # the fixture, where pytest finds it

pytestmark = pytest.mark.timeout(300)

RECORDS_PER_BATCH = 4
"""The producer's record batches: the broker hands a share group's members whole batches."""


def produce(endpoint: KafkaEndpoint, topic: str, chunks: list[EncodedChunk], raw: int = 0) -> None:
    """``chunks`` as records (and ``raw`` records of garbage with valid rowbatch headers)."""
    producer = Producer(
        {
            "bootstrap.servers": endpoint.bootstrap_servers,
            "acks": "all",
            "batch.num.messages": RECORDS_PER_BATCH,
        }
    )
    for chunk in chunks:
        producer.produce(topic, value=chunk.payload, headers=list(chunk.attributes.items()))
    for i in range(raw):
        headers = dict(chunks[0].attributes) | {"rowbatch-chunk-id": f"garbage-{i}"}
        producer.produce(topic, value=b"\x00not a chunk", headers=list(headers.items()))
    assert producer.flush(60) == 0


def dead_letters(endpoint: KafkaEndpoint, topic: str, expect: int) -> list[dict[str, bytes]]:
    """The dead-letter topic's records' headers, read from its start until ``expect`` came and
    2 s more passed with nothing new."""
    consumer = Consumer(
        {
            "bootstrap.servers": endpoint.bootstrap_servers,
            "group.id": f"read-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    found: list[dict[str, bytes]] = []
    quiet_until = deadline = time.monotonic() + 60
    try:
        while time.monotonic() < min(deadline, quiet_until):
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            headers = message.headers() or []
            pairs = headers.items() if isinstance(headers, dict) else headers
            found.append({k: v.encode() if isinstance(v, str) else v or b"" for k, v in pairs})
            if len(found) >= expect:
                quiet_until = time.monotonic() + 2.0
    finally:
        consumer.close()
    return found


def config(
    endpoint: KafkaEndpoint,
    topic: str,
    group: str,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    table: str,
) -> ConsumerConfig:
    source: dict[str, Any] = {
        "kind": "kafka-share",
        "bootstrap_servers": endpoint.bootstrap_servers,
        "topic": topic,
        "group_id": group,
        "members": 2,
        "max_poll_records": 8,
        "lock_duration_s": 30,
        "lag_interval_s": 1.0,
    }
    return ConsumerConfig.model_validate(
        {
            "source": source,
            "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 20},
            "binding": SCORER_BINDING,
            "sink": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
            "server": {"port": 0},
            "log_format": "text",
        }
    )


def chunks_of(total: int, rows: int, seed: int) -> tuple[list[EncodedChunk], np.ndarray]:
    """Chunks of ``rows`` rows (ids 0..total-1), alternately Arrow and JSON, and the scores
    the model gives them."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(total, 16)).astype(np.float32)
    counts = rng.integers(0, 1000, size=total).astype(np.int64)
    out = [
        encode_chunk(
            "events",
            {
                "id": np.arange(start, start + rows, dtype=np.int64),
                "features": features[start : start + rows],
                "count": counts[start : start + rows],
            },
            "arrow" if n % 2 == 0 else "json",
            f"share-{seed}-{n}",
        )
        for n, start in enumerate(range(0, total, rows))
    ]
    return out, score(features, counts.reshape(-1, 1))[0][:, 0]


async def test_two_consumers_past_the_partition_count_write_every_row_once(
    share_kafka: KafkaEndpoint, triton: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    total, poison = 40_000, 3
    topic = f"share-{uuid.uuid4().hex[:8]}"
    group = f"{topic}-group"
    await create_topic(share_kafka, topic, partitions=1)
    await create_topic(share_kafka, f"{topic}.dlq", partitions=1)
    chunks, want = chunks_of(total, 100, seed=51)
    table = unique_table("share")
    cfg = config(share_kafka, topic, group, triton, postgres, table)
    async with consumer_running(cfg) as first, consumer_running(cfg) as second:
        for run in (first, second):
            await wait_until(lambda r=run: bool(r.running), 60, "running", run.task)  # type: ignore[misc]
        # Both members of both consumers are in the group before the records are there.
        await asyncio.to_thread(produce, share_kafka, topic, chunks, poison)
        await wait_until(
            lambda: pg_count(postgres.dsn, table) == total,
            what=f"{total} rows",
            alive=first.task,
        )
        registries = [run.running[0].metrics.registry for run in (first, second)]
        await wait_until(
            lambda: sum(undecodable(r) for r in registries) == poison,
            30,
            "the poison dead-lettered",
            first.task,
        )
        shares = [r.get_sample_value("rowbatch_rows_written_total") or 0 for r in registries]
        # Each consumer reads the group's lag from the broker: every record done.
        await wait_until(
            lambda: all(share_lag(r, topic) == 0 for r in registries),
            30,
            "share lag 0",
            first.task,
        )
    print(
        f"\nshare group, 1 partition, 2 consumers x 2 members, {len(chunks)} records of 100 "
        f"rows: rows written by each consumer {shares}"
    )
    with psycopg.connect(postgres.dsn) as conn:
        rows = conn.execute(f"SELECT id, score FROM {table} ORDER BY id").fetchall()
    assert [int(r[0]) for r in rows] == list(range(total)), "every id exactly once"
    np.testing.assert_array_equal(np.array([r[1] for r in rows], dtype=np.float32), want)
    assert sum(shares) == total, shares
    letters = await asyncio.to_thread(dead_letters, share_kafka, f"{topic}.dlq", poison)
    assert len(letters) == poison
    assert {h[ATTR_REASON] for h in letters} == {b"undecodable"}


def share_lag(registry: Any, topic: str) -> float | None:
    value = registry.get_sample_value("rowbatch_kafka_share_lag_total", {"topic": topic})
    return None if value is None else float(value)


def undecodable(registry: Any) -> float:
    value = registry.get_sample_value(
        "rowbatch_messages_dead_lettered_total", {"reason": "undecodable"}
    )
    return float(value or 0)
