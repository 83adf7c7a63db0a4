"""The ``kafka-share`` source (issue 51) through faults, on a real Kafka 4.4.0 broker with share
groups, real Triton and PostgreSQL:

- four consumer processes on a ONE-partition topic, two of them killed with SIGKILL mid-run:
  the records the dead ones held come back to the others once their lock runs out (counted as
  redeliveries), and every row is in the table exactly once, nothing dead-lettered;
- a model-server outage longer than the record lock: the members stop polling, the records in
  flight lose their lock and are delivered again once the server is back; no row lost, none
  archived by the broker, none dead-lettered, none released;
- the broker killed with SIGKILL and started again mid-run: the consumer rides through.

The lock is 5 s and the outage two locks (10 s) by default, to keep the suite short;
``ROWBATCH_TEST_SHARE_LOCK_S=30`` runs the issue's own figures (a 30 s lock, a 60 s outage)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import CollectorRegistry

from harness.chaos import ChaosControl
from harness.consumer_process import ConsumerProcess, to_toml
from harness.faults import RestartableTriton
from harness.kafka import KafkaEndpoint, KafkaService, create_topic
from harness.kafka.share import share_group_lag, share_kafka_service
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.service import RunDir
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig, load_config
from rowbatch.wire.chunks.encode import EncodedChunk
from tests.integration import share_fixtures
from tests.integration.consumer_helpers import InProcess, consumer_running, wait_until
from tests.integration.test_consumer_faults import own_triton
from tests.integration.test_consumer_kafka import CHAOS_BINDING
from tests.integration.test_consumer_process import SCORER_BINDING, unique_table, wait_for
from tests.integration.test_consumer_pubsub import text_chunk
from tests.integration.test_kafka_share import chunks_of, produce

share_kafka = share_fixtures.share_kafka  # the fixtures, where pytest finds them
__all__ = ["own_triton", "share_kafka"]  # fixtures used here

pytestmark = pytest.mark.timeout(600)

LOCK_S = float(os.environ.get("ROWBATCH_TEST_SHARE_LOCK_S", "5"))
OUTAGE_S = 2 * LOCK_S


def config_dict(
    endpoint: KafkaEndpoint, topic: str, triton: TritonEndpoint, dsn: str, table: str
) -> dict[str, Any]:
    return {
        "source": {
            "kind": "kafka-share",
            "bootstrap_servers": endpoint.bootstrap_servers,
            "topic": topic,
            "group_id": f"{topic}-group",
            "members": 2,
            "max_poll_records": 8,
            "lock_duration_s": LOCK_S,
        },
        "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 20},
        "binding": SCORER_BINDING,
        "sink": {"kind": "postgres", "dsn": dsn, "table": table},
        "log_format": "text",
    }


async def new_topic(endpoint: KafkaEndpoint) -> str:
    topic = f"share-{uuid.uuid4().hex[:8]}"
    await create_topic(endpoint, topic, partitions=1)
    await create_topic(endpoint, f"{topic}.dlq", partitions=1)
    return topic


def dead_letter_count(endpoint: KafkaEndpoint, topic: str) -> int:
    """Records on the dead-letter topic (its one partition's end offset)."""
    consumer = Consumer({"bootstrap.servers": endpoint.bootstrap_servers, "group.id": "peek"})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()
    return int(high - low)


def lag_is_zero(endpoint: KafkaEndpoint, group: str, topic: str) -> bool:
    """The group has every record of the partition done (accepted, rejected or archived)."""
    lag = share_group_lag(endpoint.bootstrap_servers, group, {topic: [0]})
    return lag[(topic, 0)].lag == 0


def table_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT id, score FROM {table} ORDER BY id").fetchall()


def assert_every_row_once(rows: list[tuple[Any, ...]], total: int, want: np.ndarray) -> None:
    assert [int(r[0]) for r in rows] == list(range(total)), "every id exactly once"
    np.testing.assert_array_equal(np.array([r[1] for r in rows], dtype=np.float32), want)


def pg_rows(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
            return 0
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def replica_loads(procs: list[ConsumerProcess]) -> float:
    """``sum(rowbatch_replica_load)`` over the processes (NaN and absent count as 0)."""
    loads = [(p.metrics() or {}).get("rowbatch_replica_load", 0.0) for p in procs]
    return sum(x for x in loads if x == x)


class LoadSampler:
    """``sum(rowbatch_replica_load)`` over the live processes every 0.5 s, on a thread; keeps
    the largest."""

    def __init__(self, procs: list[ConsumerProcess]) -> None:
        self._procs = procs
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.most = 0.0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            live = [p for p in self._procs if p.returncode() is None]
            self.most = max(self.most, replica_loads(live))


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[ConsumerProcess]]:
    started: list[ConsumerProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.stop()


def start_process(
    tmp_path: Path, name: str, config: dict[str, Any], started: list[ConsumerProcess]
) -> ConsumerProcess:
    port = free_port()
    path = tmp_path / f"consumer-{name}.toml"
    path.write_text(to_toml({**config, "server": {"host": "127.0.0.1", "port": port}}))
    load_config(path)  # a typo fails here, not in the child's log
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    proc = ConsumerProcess(name, path, tmp_path / f"consumer-{name}.log", port, env)
    started.append(proc)
    proc.start()
    return proc


async def test_kill_9_of_two_of_four_members_loses_and_duplicates_nothing(
    share_kafka: KafkaEndpoint,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
    processes: list[ConsumerProcess],
) -> None:
    total = 150_000
    topic = await new_topic(share_kafka)
    chunks, want = chunks_of(total, 100, seed=57)
    table = unique_table("share_kill")
    cfg = config_dict(share_kafka, topic, triton, postgres.dsn, table)
    # What one replica sustains is measured (while every member holds records), and the
    # backlog is to be gone in 1 s: a backlog far beyond what one replica clears in that.
    cfg["source"] |= {"target_latency_s": 1.0}
    await asyncio.to_thread(produce, share_kafka, topic, chunks)
    procs = [start_process(tmp_path, f"m{i}", cfg, processes) for i in range(4)]
    for proc in procs:
        await asyncio.to_thread(wait_for, proc.ready, 90, "/readyz", proc)
    await asyncio.to_thread(
        wait_for, lambda: pg_rows(postgres.dsn, table) >= total // 10, 240, "a tenth", procs[0]
    )
    loads = LoadSampler(procs)
    loads.start()
    killed, survivors = procs[:2], procs[2:]
    before = {p.name: p.rows_written() for p in killed}
    for proc in killed:
        proc.send(signal.SIGKILL)
    for proc in killed:
        assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
    at_kill = pg_rows(postgres.dsn, table)
    assert at_kill < total, "the backlog was gone before the kill"
    await asyncio.to_thread(
        wait_for, lambda: pg_rows(postgres.dsn, table) >= total, 300, "every row", survivors[0]
    )
    group = f"{topic}-group"
    await asyncio.to_thread(
        wait_for, lambda: lag_is_zero(share_kafka, group, topic), 60, "share lag 0", survivors[0]
    )
    loads.stop()
    metrics = {p.name: p.metrics() or {} for p in survivors}
    for proc in survivors:
        assert await asyncio.to_thread(proc.terminate, 60) == 0, proc.log()
    redelivered = sum(
        m.get("rowbatch_kafka_share_redelivered_records_total", 0) for m in metrics.values()
    )
    written = {n: m.get("rowbatch_rows_written_total", 0) for n, m in metrics.items()}
    lettered = sum(m.get("rowbatch_messages_dead_lettered_total", 0) for m in metrics.values())
    print(
        f"\nshare group, 1 partition, 4 processes x 2 members, {len(chunks)} records of 100 rows; "
        f"killed m0, m1 at {at_kill} rows (they had written {before}); survivors wrote "
        f"{written}; records delivered again: {redelivered:.0f}; most replicas asked for "
        f"(the loads summed): {loads.most:.2f}"
    )
    assert_every_row_once(table_rows(postgres.dsn, table), total, want)
    assert redelivered > 0, "the killed members' records were not delivered again"
    # The replica signal works past the partition count: the replicas' loads (the "share"
    # view, as on Pub/Sub: receive age x rate and their own writes over the rate each
    # measured while its members all held records) asked for more than one partition allows.
    assert loads.most > 1.0
    assert lettered == 0
    assert dead_letter_count(share_kafka, f"{topic}.dlq") == 0


@dataclass(frozen=True)
class Run:
    """One in-process consumer's scenario: ``first`` is produced and some of it written before
    the fault, ``rest`` after it; ``want`` is the model's score of every row."""

    topic: str
    table: str
    config: ConsumerConfig
    first: list[EncodedChunk]
    rest: list[EncodedChunk]
    want: np.ndarray


async def scenario(
    endpoint: KafkaEndpoint, triton: TritonEndpoint, dsn: str, seed: int, before: float
) -> Run:
    """30,000 rows in 300 records; the share ``before`` of them is produced before the fault."""
    topic = await new_topic(endpoint)
    chunks, want = chunks_of(30_000, 100, seed=seed)
    table = unique_table(f"share_{seed}")
    config = ConsumerConfig.model_validate(
        config_dict(endpoint, topic, triton, dsn, table) | {"server": {"port": 0}}
    )
    cut = int(len(chunks) * before)
    return Run(topic, table, config, chunks[:cut], chunks[cut:], want)


@contextlib.asynccontextmanager
async def first_rows_written(
    run: Run, endpoint: KafkaEndpoint, dsn: str
) -> AsyncIterator[tuple[InProcess, CollectorRegistry]]:
    """The consumer running, ``run.first`` produced and some of its rows written."""
    async with consumer_running(run.config) as consumer:
        await wait_until(lambda: bool(consumer.running), 60, "running", consumer.task)
        registry = consumer.running[0].metrics.registry
        await asyncio.to_thread(produce, endpoint, run.topic, run.first)
        await wait_until(lambda: pg_rows(dsn, run.table) > 0, 60, "the first rows", consumer.task)
        yield consumer, registry


def sample(registry: Any, name: str, **labels: str) -> float:
    return float(registry.get_sample_value(name, labels) or 0.0)


async def test_a_model_outage_longer_than_the_lock_loses_archives_and_dead_letters_nothing(
    share_kafka: KafkaEndpoint,
    own_triton: tuple[RestartableTriton, TritonEndpoint],
    postgres: PostgresEndpoint,
) -> None:
    service, triton = own_triton
    total = 30_000
    case = await scenario(share_kafka, triton, postgres.dsn, seed=58, before=1 / 3)
    topic, table, want = case.topic, case.table, case.want
    async with first_rows_written(case, share_kafka, postgres.dsn) as (run, registry):
        await asyncio.to_thread(service.interrupt, signal.SIGTERM)
        down_at = time.monotonic()
        await asyncio.to_thread(produce, share_kafka, topic, case.rest)
        at_outage = pg_rows(postgres.dsn, table)
        await asyncio.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))
        assert pg_rows(postgres.dsn, table) == at_outage, "rows written with the server down"
        await asyncio.to_thread(service.resume)
        outage_s = time.monotonic() - down_at
        await wait_until(lambda: pg_rows(postgres.dsn, table) >= total, 180, "every row", run.task)
        group = f"{topic}-group"
        await wait_until(lambda: lag_is_zero(share_kafka, group, topic), 60, "lag 0", run.task)
        labels = {"topic": topic}
        counts = {
            what: sample(registry, f"rowbatch_kafka_share_{what}_total", **labels)
            for what in ("redelivered_records", "refused_acknowledgements", "member_restarts")
        }
        released = sample(
            registry, "rowbatch_kafka_share_acknowledgements_total", type="release", **labels
        )
        lettered = sum(
            s.value
            for m in registry.collect()
            for s in m.samples
            if s.name == "rowbatch_messages_dead_lettered_total"
        )
    print(
        f"\nshare group: model server down {outage_s:.1f} s with a {LOCK_S:g} s lock, "
        f"{at_outage} of {total} rows written when it went down; {counts}, released {released}"
    )
    assert_every_row_once(table_rows(postgres.dsn, table), total, want)  # none archived
    assert counts["redelivered_records"] > 0, "no lock ran out during the outage"
    assert released == 0 and lettered == 0
    assert dead_letter_count(share_kafka, f"{topic}.dlq") == 0


@pytest.fixture
def own_share_broker(run_dir: RunDir) -> Iterator[KafkaService]:
    service = share_kafka_service(run_dir, name=f"kafka-share-crash-{uuid.uuid4().hex[:8]}")
    with service:
        yield service


async def test_a_broker_crash_mid_run_is_ridden_through(
    own_share_broker: KafkaService, triton: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    """The broker is killed with SIGKILL and started again while two members hold records:
    the consumer neither exits nor loses a row (its members retry, or are made again), and
    every row is written once."""
    endpoint = own_share_broker.endpoint
    assert endpoint is not None
    total = 30_000
    case = await scenario(endpoint, triton, postgres.dsn, seed=59, before=1 / 2)
    topic, table, want = case.topic, case.table, case.want
    async with first_rows_written(case, endpoint, postgres.dsn) as (run, registry):
        began = time.monotonic()
        endpoint = await asyncio.to_thread(own_share_broker.restart, crash=True)
        down_s = time.monotonic() - began
        at_crash = pg_rows(postgres.dsn, table)
        await asyncio.to_thread(produce, endpoint, topic, case.rest)
        await wait_until(lambda: pg_rows(postgres.dsn, table) >= total, 240, "every row", run.task)
        labels = {"topic": topic}
        restarts = sample(registry, "rowbatch_kafka_share_member_restarts_total", **labels)
        redelivered = sample(registry, "rowbatch_kafka_share_redelivered_records_total", **labels)
        assert not run.task.done(), "the consumer stopped after the broker restart"
    print(
        f"\nshare broker killed with {at_crash} of {total} rows written, back after "
        f"{down_s:.1f} s; members made again: {restarts:.0f}, records delivered again: "
        f"{redelivered:.0f}"
    )
    assert_every_row_once(table_rows(postgres.dsn, table), total, want)
    assert dead_letter_count(endpoint, f"{topic}.dlq") == 0


@pytest.fixture
def stuck_model(triton: TritonEndpoint) -> Iterator[TritonEndpoint]:
    """The chaos model taking 10 s a batch: whatever a consumer takes, it is still holding."""
    ChaosControl(delay_s=10.0).write(triton.chaos_control)
    yield triton
    ChaosControl().write(triton.chaos_control)


async def test_a_record_past_max_delivery_attempts_is_dead_lettered_with_its_reason(
    share_kafka: KafkaEndpoint,
    stuck_model: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
    processes: list[ConsumerProcess],
) -> None:
    """Two consumers in turn take the records and die holding them (SIGKILL): each lock runs
    out and the broker delivers the records again, counting. The third consumer gets them on
    their third delivery, past ``max_delivery_attempts = 2``, and dead-letters each with its
    reason (``too-many-attempts``) before the broker's own limit would archive it silently."""
    records = 10
    topic = await new_topic(share_kafka)
    table = unique_table("share_attempts")
    cfg = config_dict(share_kafka, topic, stuck_model, postgres.dsn, table)
    cfg["source"] |= {"members": 1, "max_poll_records": 50, "max_delivery_attempts": 2}
    cfg["source"]["lock_duration_s"] = 2.0
    cfg["model"] = {"url": stuck_model.grpc_url, "name": "chaos", "max_wait_ms": 20}
    cfg["binding"] = CHAOS_BINDING
    chunks = [text_chunk(n, 10) for n in range(records)]
    await asyncio.to_thread(produce, share_kafka, topic, chunks)

    def took_all(proc: ConsumerProcess) -> Callable[[], bool]:
        return lambda: (
            (proc.metrics() or {}).get("rowbatch_kafka_share_records_total", 0) >= records
        )

    for attempt in (1, 2):
        proc = start_process(tmp_path, f"holder{attempt}", cfg, processes)
        await asyncio.to_thread(wait_for, took_all(proc), 90, f"all {records} records", proc)
        proc.send(signal.SIGKILL)
        assert await asyncio.to_thread(proc.wait, 10) == -signal.SIGKILL
    last = start_process(tmp_path, "third", cfg, processes)

    def too_many() -> float:
        return (last.metrics() or {}).get(
            'rowbatch_messages_dead_lettered_total{reason="too-many-attempts"}', 0.0
        )

    await asyncio.to_thread(wait_for, lambda: too_many() >= records, 90, "dead letters", last)
    group = f"{topic}-group"
    await asyncio.to_thread(
        wait_for, lambda: lag_is_zero(share_kafka, group, topic), 60, "share lag 0", last
    )
    assert await asyncio.to_thread(last.terminate, 60) == 0, last.log()
    assert dead_letter_count(share_kafka, f"{topic}.dlq") == records
    assert pg_rows(postgres.dsn, table) == 0
