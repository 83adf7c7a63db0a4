"""Adding a consumer helps on the real stack (Kafka, a ``fixed_latency`` model, PostgreSQL): two
consumers in one group on a 6-partition topic, the second joining while the first drains a
backlog. Every row lands once, the server executes (almost) no row twice, the first member's
revoke took back the records it had not yet sent to the model, and the two together write
faster than one consumer can.

"Faster than one can" is bounded by the model, not by this machine's CPUs: each consumer keeps
one request in flight (``model.max_in_flight`` = 1) and every execution of the model sleeps
80 ms on one of its two instances, so one consumer never writes more than 256 rows per 80 ms
(3,200 rows/s), whatever the machine's load, while the server has room for two (the two
reach 1.5-1.9x here, 1.3x with two busy loops hogging the 2 cores)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from harness.kafka import KafkaEndpoint
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.postgres import PostgresEndpoint
from harness.reference_models import score
from harness.service import RunDir
from harness.triton import TritonEndpoint, TritonService
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import wait_until
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, group_offsets, produce
from tests.integration.test_consumer_kafka import count_rows, started, written
from tests.integration.test_consumer_pubsub import triton_batch_rows

MODEL = "scale_fixed"
INSTANCES = 2
VARIANT = FixedLatency(base_ms=80.0, per_row_us=0.0, max_batch_size=256, instances=INSTANCES)
ONE_CONSUMER_MAX = VARIANT.ceiling()
"""3,200 rows/s: the most one consumer with one request in flight can write."""
HELPS = 1.2
"""The two together must write at least this many times what one consumer can at most (they
can reach 2x: the server runs two executions side by side)."""
WINDOW_ROWS = 16_000
"""Rows written by the two, once both write, over which their rate is measured (both still
have a backlog then)."""
TOTAL = 64_000
"""About 20 s for one consumer alone, about 11 s for two."""
CHUNK_ROWS = 500
REPEATED_MAX = 0.02
BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score"},
    "passthrough": {"id": "int64"},
}


def backlog(seed: int) -> tuple[list[EncodedChunk], NDArray[np.float32]]:
    """``TOTAL`` rows with ids 0..TOTAL-1 in Arrow chunks of ``CHUNK_ROWS``; their scores."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(TOTAL, 16)).astype(np.float32)
    counts = rng.integers(0, 1000, size=TOTAL).astype(np.int64)
    scores, _ = score(features, counts.reshape(-1, 1))
    chunks = [
        encode_chunk(
            "events",
            {
                "id": np.arange(start, start + CHUNK_ROWS, dtype=np.int64),
                "features": features[start : start + CHUNK_ROWS],
                "count": counts[start : start + CHUNK_ROWS],
            },
            "arrow",
            f"scale-{seed}-{start // CHUNK_ROWS}",
        )
        for start in range(0, TOTAL, CHUNK_ROWS)
    ]
    return chunks, scores[:, 0]


def withdrawn(registry: CollectorRegistry, topic: str) -> float:
    value = registry.get_sample_value("rowbatch_kafka_records_withdrawn_total", {"topic": topic})
    return value or 0.0


@pytest.fixture(scope="module")
def triton(run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonEndpoint]:
    """A tritonserver of its own serving :data:`VARIANT` on :data:`INSTANCES` instances."""
    root = fixed_latency_repository(tmp_path_factory.mktemp("scale-models"), {MODEL: VARIANT})
    service = TritonService(
        RunDir(run_dir.root / f"scale-{time.monotonic_ns()}"), root, name="triton-scale"
    )
    try:
        yield service.start()
    finally:
        service.stop()


@pytest.mark.timeout(180)
async def test_a_second_consumer_joining_mid_drain_helps_and_repeats_no_inference(
    kafka: KafkaEndpoint, triton: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    t = await KafkaTopics.create(kafka, partitions=6)
    chunks, scores = backlog(seed=14)
    await produce(kafka, t.topic, [chunk_record(c) for c in chunks])
    table = f"scale_out_{int(time.time() * 1000) % 10**8}"
    config = ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "kafka",
                "bootstrap_servers": t.bootstrap,
                "topic": t.topic,
                "group_id": t.group,
                "commit_interval_s": 0.5,
                "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 1000,
            },
            "model": {
                "url": triton.grpc_url,
                "name": MODEL,
                "max_wait_ms": 20,
                "max_in_flight": 1,
            },
            "binding": BINDING,
            "sink": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
            "server": {"port": 0},
            "log_format": "text",
        }
    )
    before = sum(triton_batch_rows(triton, MODEL).values())

    async with started(config) as first:
        one = first.running[0].metrics.registry
        await wait_until(lambda: written(one) >= TOTAL // 10, 60, "10% written", first.task)
        joined_at = written(one)
        async with started(config) as second:
            two = second.running[0].metrics.registry

            def both() -> float:
                return written(one) + written(two)

            # Their rate once both write (the rebalance done, a few batches in), over
            # WINDOW_ROWS rows.
            await wait_until(
                lambda: written(two) >= 4 * VARIANT.max_batch_size,
                60,
                "the second writing",
                second.task,
            )
            began, at_start = time.monotonic(), both()
            while both() < at_start + WINDOW_ROWS:
                assert not first.task.done() and not second.task.done(), "a consumer stopped"
                assert time.monotonic() - began < 60, "the window took over 60 s"
                await asyncio.sleep(0.05)
            together = (both() - at_start) / (time.monotonic() - began)
            await wait_until(
                lambda: count_rows(postgres.dsn, table) >= TOTAL, 90, "every row", first.task
            )
            await second.stop_and_wait()
        await first.stop_and_wait()

    executed = sum(triton_batch_rows(triton, MODEL).values()) - before
    with psycopg.connect(postgres.dsn) as conn:
        rows = conn.execute(f"SELECT id, score FROM {table} ORDER BY id").fetchall()
    ids = np.array([r[0] for r in rows])
    assert len(ids) == TOTAL
    assert (ids == np.arange(TOTAL)).all(), "a row is missing or written twice"
    np.testing.assert_allclose(np.array([r[1] for r in rows]), scores, rtol=1e-5, atol=1e-6)
    committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
    assert committed == end

    repeated = executed - TOTAL
    taken_back = withdrawn(one, t.topic) + withdrawn(two, t.topic)
    print(
        f"\n{TOTAL:,} rows in {len(chunks)} records on 6 partitions; the second consumer "
        f"joined after {joined_at:,.0f} rows and wrote {written(two):,.0f}; the server "
        f"executed {executed:,} rows ({repeated:,} repeated, {repeated / TOTAL:.2%}); "
        f"records taken back at revokes: {taken_back:.0f}; the two wrote {together:,.0f} rows/s "
        f"together, {together / ONE_CONSUMER_MAX:.2f}x the most one consumer can "
        f"({ONE_CONSUMER_MAX:,.0f})"
    )
    assert together >= HELPS * ONE_CONSUMER_MAX, (
        f"two consumers wrote {together:,.0f} rows/s: not {HELPS}x the "
        f"{ONE_CONSUMER_MAX:,.0f} rows/s one consumer can write at most"
    )
    assert 0 <= repeated <= REPEATED_MAX * TOTAL
    assert taken_back >= 1, "the revoke took back nothing the first consumer had not sent"
