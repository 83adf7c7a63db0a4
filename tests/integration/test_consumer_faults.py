"""Faults of the dependencies, ridden through on real services: a Triton stopped with SIGTERM
(it answers NOT_FOUND while it unloads) and started again on the same port, and a PostgreSQL
restarted under the consumer, pause consumption and lose nothing (no dead letter, no delivery
attempt spent); rows a sink can never store are dead-lettered as ``rejected-by-sink`` while a
``bytes`` column the contract allows is stored faithfully."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from harness.faults import RestartablePostgres, RestartableTriton
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.service import RunDir
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, paced_producer, read_all
from tests.integration.test_consumer_kafka import count_rows, kafka_config, scorer_chunks
from tests.integration.test_consumer_pubsub import read_results

pytestmark = pytest.mark.timeout(600)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def total(registry: CollectorRegistry, name: str) -> float:
    return sum(
        s.value for m in registry.collect() for s in m.samples if s.name == name and s.value > 0
    )


@pytest.fixture
def own_triton(run_dir: RunDir) -> Iterator[tuple[RestartableTriton, TritonEndpoint]]:
    service = RestartableTriton(RunDir(run_dir.root / f"triton-{time.monotonic_ns()}"))
    try:
        yield service, service.start()
    finally:
        service.stop()


@pytest.fixture
def own_postgres(run_dir: RunDir) -> Iterator[tuple[RestartablePostgres, PostgresEndpoint]]:
    service = RestartablePostgres(RunDir(run_dir.root / f"pg-{time.monotonic_ns()}"))
    try:
        yield service, service.start()
    finally:
        service.stop()


async def test_triton_sigterm_and_restart_spends_no_delivery_attempt(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    own_triton: tuple[RestartableTriton, TritonEndpoint],
) -> None:
    """Finding: while tritonserver unloads on SIGTERM it answers NOT_FOUND; the consumer
    nacked, and on Kafka each nack counted toward max_delivery_attempts, so good rows were
    dead-lettered as too-many-attempts. Now: backoff and pause, nothing nacked or dead-lettered,
    and rows flow again soon after the server is ready."""
    service, triton = own_triton
    topics = await KafkaTopics.create(kafka, partitions=3)
    chunks, expected = scorer_chunks(12_000, seed=11, max_rows=100)
    table = f"faults_triton_{topics.group.replace('-', '_')}"
    cfg = kafka_config(
        topics,
        triton,
        {"kind": "postgres", "dsn": postgres.dsn, "table": table},
        max_delivery_attempts=1,
        redelivery_backoff_s=0.1,
    )
    async with consumer_running(cfg) as run, paced_producer(kafka) as send:
        for chunk in chunks[: len(chunks) // 3]:
            await send(topics.topic, chunk_record(chunk))
        await wait_until(lambda: count_rows(postgres.dsn, table) > 1000, alive=run.task)
        registry = run.running[0].metrics.registry
        producing = asyncio.create_task(_send_all(send, topics.topic, chunks[len(chunks) // 3 :]))
        stopped_in = await asyncio.to_thread(service.interrupt, signal.SIGTERM)
        await asyncio.sleep(2.0)  # the server is down for a while
        ready_in = await asyncio.to_thread(service.resume)
        ready_at = time.monotonic()
        before = count_rows(postgres.dsn, table)
        await wait_until(
            lambda: count_rows(postgres.dsn, table) > before, timeout_s=60, alive=run.task
        )
        resumed_after = time.monotonic() - ready_at
        await producing
        await wait_until(lambda: count_rows(postgres.dsn, table) == len(expected), alive=run.task)
        assert sample(registry, "rowbatch_messages_nacked_total") == 0
        assert total(registry, "rowbatch_messages_dead_lettered_total") == 0
        transient = total(registry, "rowbatch_inference_errors_total")
        kinds = {
            s.labels["kind"]: s.value
            for m in registry.collect()
            for s in m.samples
            if s.name == "rowbatch_inference_errors_total" and s.value > 0
        }
        assert transient > 0, "the outage was not seen (no failed inference call counted)"
    print(
        f"\ntriton SIGTERM: exited in {stopped_in:.1f} s, ready again in {ready_in:.1f} s, "
        f"rows flowing {resumed_after:.2f} s after ready; failed calls counted: {kinds}"
    )
    assert resumed_after < 5.0
    assert await read_all(kafka, topics.dlq) == []
    with psycopg.connect(postgres.dsn) as conn:
        rows = conn.execute(f"SELECT id, score, label FROM {table}").fetchall()
    assert len(rows) == len(expected) == len({r[0] for r in rows})
    for i, s, lab in rows:
        assert np.isclose(s, expected[i][0], rtol=1e-6) and lab == expected[i][1]


async def _send_all(send: Any, topic: str, chunks: list[Any]) -> None:
    for chunk in chunks:
        await send(topic, chunk_record(chunk))
        await asyncio.sleep(0.01)


async def test_database_restart_is_ridden_through(
    topics: Topics,
    triton: TritonEndpoint,
    own_postgres: tuple[RestartablePostgres, PostgresEndpoint],
) -> None:
    """Finding: a 10 s PostgreSQL restart made the consumer exit 1 (then exit 2 at each start
    while it was down). Now: writes are retried with backoff and consumption paused; the
    consumer stays up, and every row is written once."""
    service, pg = own_postgres
    chunks, expected = scorer_chunks(12_000, seed=12, max_rows=100)
    cfg = pubsub_scorer_config(topics, triton, {"kind": "postgres", "dsn": pg.dsn})
    async with consumer_running(cfg) as run:
        topics.publish(chunks[: len(chunks) // 2])
        await wait_until(lambda: count_rows(pg.dsn, "results") > 1000, alive=run.task)
        registry = run.running[0].metrics.registry
        await asyncio.to_thread(service.interrupt, signal.SIGINT)
        await asyncio.to_thread(topics.publish, chunks[len(chunks) // 2 :])
        await asyncio.sleep(5.0)  # the database is down for a while
        assert not run.task.done(), "the consumer exited while the database was down"
        assert sample(registry, "rowbatch_paused", why="backoff") == 1
        await asyncio.to_thread(service.resume)
        await wait_until(lambda: count_rows(pg.dsn, "results") == len(expected), alive=run.task)
        assert sample(registry, "rowbatch_sink_errors_total", kind="unavailable") > 0
        assert sample(registry, "rowbatch_messages_nacked_total") == 0
        assert total(registry, "rowbatch_messages_dead_lettered_total") == 0
    got = read_results("postgres", pg.dsn, "results")
    assert set(got) == set(expected)


def pubsub_scorer_config(
    topics: Topics, triton: TritonEndpoint, sink: dict[str, Any], **extra: Any
) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "subscription": topics.subscription,
                "dead_letter_topic": topics.dlq_topic,
            },
            "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 50},
            "binding": extra.pop(
                "binding",
                {
                    "inputs": {"features": "FEATURES", "count": "COUNT"},
                    "outputs": {"SCORE": "score", "LABEL": "label"},
                    "passthrough": {"id": "int64"},
                },
            ),
            "sink": {**sink, "backoff_max_s": 1.0},
            "server": {"port": 0},
            "log_format": "text",
            **extra,
        }
    )


async def test_values_the_sink_cannot_store_are_dead_lettered_and_bytes_are_stored(
    topics: Topics, triton: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    """Finding: a ``bytes`` passthrough column crashed the PostgreSQL sink ("expected str,
    found bytes") and a text value with U+0000 crash-looped it. Now bytes are stored as bytea,
    and only the row holding U+0000 is dead-lettered, as a row part of its message
    (rejected-by-sink, with the database's reason and the fine code), its 9 siblings and every
    other row written once."""
    table = f"faults_values_{int(time.time() * 1000)}"
    rng = np.random.default_rng(5)
    chunks, blobs = [], {}
    for n in range(20):
        ids = np.arange(n * 100, n * 100 + 10, dtype=np.int64)
        raw = [bytes(rng.integers(0, 256, size=int(k)).astype(np.uint8)) for k in range(10)]
        note = [f"note {i}" for i in ids]
        if n == 7:
            note[3] = "bad \x00 note"
        blobs.update(dict(zip(ids.tolist(), raw, strict=True)))
        cols = {
            "id": ids,
            "features": rng.normal(size=(10, 16)).astype(np.float32),
            "count": rng.integers(0, 9, size=10).astype(np.int64),
            "note": note,
            "raw": raw,
        }
        chunks.append(encode_chunk("events", cols, "arrow" if n % 2 else "json", f"v{n}-{table}"))
    binding = {
        "inputs": {"features": "FEATURES", "count": "COUNT"},
        "outputs": {"SCORE": "score", "LABEL": "label"},
        "passthrough": {"id": "int64", "note": "string", "raw": "bytes"},
    }
    cfg = pubsub_scorer_config(
        topics, triton, {"kind": "postgres", "dsn": postgres.dsn, "table": table}, binding=binding
    )
    async with consumer_running(cfg) as run:
        topics.publish(chunks)
        await wait_until(lambda: count_rows(postgres.dsn, table) == 199, alive=run.task)
        dead = await asyncio.to_thread(topics.dead_letters, 1)
        registry = run.running[0].metrics.registry
        assert sample(registry, "rowbatch_rows_dead_lettered_total", reason="rejected-by-sink") == 1
        assert (
            sample(registry, "rowbatch_messages_dead_lettered_total", reason="rejected-by-sink")
            == 0
        )
    [letter] = dead
    attrs = dict(letter.attributes)
    assert attrs["rowbatch-parent-chunk-id"] == f"v7-{table}"
    assert attrs["rowbatch-parent-rows"] == "3"
    assert attrs["rowbatch-row-count"] == "1"
    part = decode_chunk(letter.data, attrs)
    assert part.columns["note"].tolist() == ["bad \x00 note"]
    assert part.columns["id"].tolist() == [703]
    assert attrs["rowbatch-dlq-reason"] == "rejected-by-sink"
    assert attrs["rowbatch-dlq-code"] == "text_contains_nul"
    assert "note" in attrs["rowbatch-dlq-message"]
    with psycopg.connect(postgres.dsn) as conn:
        kind = conn.execute(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_name = %s AND column_name = 'raw'",
            (table,),
        ).fetchone()
        rows = conn.execute(f"SELECT id, raw, note FROM {table}").fetchall()
    assert kind == ("bytea",)
    assert len(rows) == 199
    assert all(bytes(raw) == blobs[i] for i, raw, _ in rows)
    assert {i for i, _, _ in rows if 700 <= i < 710} == set(range(700, 710)) - {703}


async def test_an_inference_server_down_at_start_up_is_waited_for(
    topics: Topics,
    postgres: PostgresEndpoint,
    own_triton: tuple[RestartableTriton, TritonEndpoint],
) -> None:
    """A consumer started while its inference server is down (a rollout restarting both) waits
    with backoff instead of exiting 2, and consumes once the server answers."""
    service, triton = own_triton
    await asyncio.to_thread(service.interrupt, signal.SIGKILL)
    table = f"faults_startup_{int(time.time() * 1000)}"
    chunks, expected = scorer_chunks(2_000, seed=13, max_rows=100)
    cfg = pubsub_scorer_config(
        topics, triton, {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    )
    async with consumer_running(cfg) as run:
        await asyncio.sleep(3.0)  # the server stays down for a while
        assert not run.task.done(), "the consumer gave up while the server was down"
        assert not run.running, "the consumer reported ready without a model"
        await asyncio.to_thread(service.resume)
        topics.publish(chunks)
        await wait_until(
            lambda: count_rows(postgres.dsn, table) == len(expected), timeout_s=90, alive=run.task
        )
    assert set(read_results("postgres", postgres.dsn, table)) == set(expected)
