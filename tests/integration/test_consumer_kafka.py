"""The consumer end to end on the real Kafka broker, Triton (the scorer model) and a real sink:
a consumer group that grows and shrinks while rows are published writes every row exactly
once and commits to the end; poison records land in the dead-letter topic with their
reasons and everything else is written once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from harness.chaos import ChaosControl
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.proc import free_port, log_tail
from harness.reference_models import score
from harness.service import REPO_ROOT
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.build_io import make_source
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.consumer.sinks.settings import PostgresSinkSettings
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import InProcess, consumer_running, wait_until
from tests.integration.kafka_helpers import (
    KafkaTopics,
    chunk_record,
    group_offsets,
    paced_producer,
    produce,
    read_all,
)
from tests.integration.test_consumer_pubsub import (
    dead_lettered,
    read_results,
    text_chunk,
    triton_batch_rows,
)

REWRITTEN_MAX = 0.01
"""Of the rows, the share a group that grows and shrinks may write twice (0 seen)."""
SCORER_BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}


def kafka_config(
    t: KafkaTopics, triton: TritonEndpoint, sink: dict[str, Any], **source: Any
) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "kafka",
                "bootstrap_servers": t.bootstrap,
                "topic": t.topic,
                "group_id": t.group,
                "commit_interval_s": 0.5,
                "revoke_grace_s": 2.0,
                "lag_interval_s": 0.5,
                "session_timeout_ms": 6000,
                "heartbeat_interval_ms": 1000,
                **source,
            },
            "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 50},
            "binding": SCORER_BINDING,
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
        }
    )


def scorer_chunks(
    total: int, seed: int, max_rows: int
) -> tuple[list[EncodedChunk], dict[int, tuple[Any, Any]]]:
    """Chunks of 1..max_rows rows, alternately JSON and Arrow; rows' ids are 0..total-1."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(total, 16)).astype(np.float32)
    counts = rng.integers(0, 1000, size=total).astype(np.int64)
    scores, labels = score(features, counts.reshape(-1, 1))
    expected = {i: (scores[i, 0], labels[i, 0]) for i in range(total)}
    chunks: list[EncodedChunk] = []
    start = 0
    while start < total:
        size = min(total - start, int(rng.integers(1, max_rows + 1)))
        sl = slice(start, start + size)
        cols = {
            "id": np.arange(start, start + size, dtype=np.int64),
            "features": features[sl],
            "count": counts[sl],
        }
        n = len(chunks)
        chunks.append(encode_chunk("events", cols, "json" if n % 2 else "arrow", f"k{seed}-{n}"))
        start += size
    return chunks, expected


def count_rows(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return 0
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def lag_total(registry: CollectorRegistry, topic: str) -> float | None:
    return registry.get_sample_value("rowbatch_kafka_lag_total", {"topic": topic})


def written(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("rowbatch_rows_written_total") or 0.0


def duplicates(registry: CollectorRegistry) -> float:
    """Rows a write skipped because they were in the table already: work done twice."""
    return registry.get_sample_value("rowbatch_rows_duplicate_total") or 0.0


def lag_is_zero(run: InProcess, topic: str) -> Callable[[], bool]:
    registry = run.running[0].metrics.registry
    return lambda: lag_total(registry, topic) == 0


@contextlib.asynccontextmanager
async def started(config: ConsumerConfig) -> AsyncIterator[InProcess]:
    async with consumer_running(config) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        yield run


@pytest.mark.timeout(900)
async def test_a_group_that_grows_and_shrinks_mid_run_writes_every_row_exactly_once(
    kafka: KafkaEndpoint, triton: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    t = await KafkaTopics.create(kafka, partitions=6)
    total = 200_000
    chunks, expected = scorer_chunks(total, seed=5, max_rows=500)
    table = f"kafka_group_{int(time.time() * 1000) % 10**8}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    config = kafka_config(t, triton, sink)

    def rows() -> int:
        return count_rows(postgres.dsn, table)

    published = 0

    # A backlog of 10% to start with, then the rest published over ~40 s, so the group
    # changes while records arrive and batches are in flight (a 40% backlog drains in ~1 s).
    backlog = len(chunks) // 10
    await produce(kafka, t.topic, [chunk_record(c) for c in chunks[:backlog]])
    published = backlog

    async def publish_paced() -> None:
        nonlocal published
        async with paced_producer(kafka) as send:
            for chunk in chunks[backlog:]:
                await send(t.topic, chunk_record(chunk))
                published += 1
                await asyncio.sleep(0.05)

    began = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        first = [await stack.enter_async_context(started(config)) for _ in range(3)]
        registries = [run.running[0].metrics.registry for run in first]
        publisher = asyncio.create_task(publish_paced())
        await wait_until(lambda: rows() >= total // 20, 120, "5% of the rows written")

        # A fourth member joins while records arrive: every member's partitions are revoked
        # and reassigned.
        fourth = await stack.enter_async_context(started(config))
        registries.append(fourth.running[0].metrics.registry)
        assert not publisher.done(), "the publisher finished before the fourth member joined"
        await wait_until(lambda: published >= len(chunks) * 3 // 4, 120, "3/4 published")
        assert rows() < total

        # Two members leave mid-run (SIGTERM-like: drain, commit, leave the group).
        await asyncio.gather(first[0].stop_and_wait(), first[1].stop_and_wait())
        assert not publisher.done(), "the publisher finished before the members left"
        await publisher
        survivors = [first[2], fourth]
        await wait_until(lambda: rows() >= total, 300, "every row written", survivors[0].task)
        finished = time.monotonic() - began
        for run in survivors:
            await wait_until(lag_is_zero(run, t.topic), 60, "lag gauge at 0", run.task)
        desired = (
            survivors[0].running[0].metrics.registry.get_sample_value("rowbatch_desired_replicas")
        )
        per_replica = (
            survivors[0]
            .running[0]
            .metrics.registry.get_sample_value("rowbatch_rows_per_s_per_replica")
        )
        for run in survivors:
            await run.stop_and_wait()

    got = read_results("postgres", postgres.dsn, table)  # asserts no duplicate ids
    assert set(got) == set(expected)
    scores = np.array([got[i][0] for i in range(total)])
    want = np.array([expected[i][0] for i in range(total)], dtype=np.float64)
    np.testing.assert_allclose(scores, want, rtol=1e-6)
    assert all(got[i][1] == int(expected[i][1]) for i in range(0, total, 97))

    committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
    assert committed == end
    assert sum(end.values()) == len(chunks)
    for registry in registries:
        assert dead_lettered(registry) == {}
    # The sink upserts, so a row written twice is not in the table twice, but each one is work
    # done again: a member that leaves drains and commits first, and at a revoke the records
    # in flight are finished and committed within revoke_grace_s (2 s), the rest withdrawn
    # unsent. So (almost) none: 0 in the runs seen; a batch or so caught by the grace is let be.
    assert sum(written(r) for r in registries) == total  # stored once each
    rewritten = sum(duplicates(r) for r in registries)
    assert 0 <= rewritten <= REWRITTEN_MAX * total, f"rows written twice: {rewritten:.0f}"
    print(
        f"\n{total} rows in {len(chunks)} records over {t.partitions} partitions, 4 members "
        f"(3, then 4, then 2): done in {finished:.1f} s ({total / finished:.0f} rows/s); "
        f"rows written twice after rebalances: {rewritten:.0f}; measured rows/s per replica "
        f"{per_replica}, desired replicas at the end: {desired}"
    )
    assert desired == 1  # no backlog left: the floor


@pytest.mark.timeout(600)
async def test_a_backlog_drains_in_full_batches(
    kafka: KafkaEndpoint, triton: TritonEndpoint, tmp_path: Path
) -> None:
    """One consumer, 50,000 rows already waiting: the figure is its rows/s; Triton runs
    nearly all of them in full batches."""
    t = await KafkaTopics.create(kafka, partitions=6)
    total = 50_000
    chunks, expected = scorer_chunks(total, seed=3, max_rows=3000)
    await produce(kafka, t.topic, [chunk_record(c) for c in chunks])
    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"}
    before = triton_batch_rows(triton, "scorer")
    async with started(kafka_config(t, triton, sink)) as run:
        registry = run.running[0].metrics.registry
        began = time.monotonic()
        await wait_until(lambda: written(registry) >= total, 300, "every row written", run.task)
        took = time.monotonic() - began
        await wait_until(lag_is_zero(run, t.topic), 60, "lag at 0", run.task)
        rate = registry.get_sample_value("rowbatch_rows_per_s_per_replica")
        await run.stop_and_wait()
    got = read_results("sqlite", tmp_path / "r.sqlite", "scores")
    assert set(got) == set(expected)
    after = triton_batch_rows(triton, "scorer")
    executed = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert sum(executed.values()) == total
    # Full batches: 256 (the preferred size), or two of them merged by Triton's dynamic
    # batcher when requests arrive together (max_batch_size 512).
    full = sum(rows for size, rows in executed.items() if size >= 256)
    assert full >= 0.95 * total, f"rows per Triton batch size: {executed}"
    print(
        f"\n{total} rows in {len(chunks)} records, one consumer: {took:.1f} s "
        f"({total / took:.0f} rows/s); measured rows/s per replica gauge: {rate}"
    )


@pytest.mark.timeout(300)
async def test_poison_records_go_to_the_dead_letter_topic_with_reasons(
    kafka: KafkaEndpoint, triton: TritonEndpoint, tmp_path: Path
) -> None:
    t = await KafkaTopics.create(kafka, partitions=3)
    chunks, expected = scorer_chunks(6000, seed=9, max_rows=200)
    good = [chunk_record(c) for c in chunks]
    template = chunks[0]
    wrong_type = encode_chunk(
        "events",
        {
            "id": [f"id-{i}" for i in range(3)],
            "features": np.zeros((3, 16), dtype=np.float32),
            "count": np.arange(3, dtype=np.int64),
        },
        "json",
        "wrong-type",
    )
    no_content_type = [(k, v) for k, v in template.kafka_headers if k != "content-type"]
    bad_header = [*template.kafka_headers, ("note", b"\xff\xfe not utf-8")]
    poison = {
        "garbage": (b"garbage", b"\x00garbage{", template.kafka_headers),
        "wrong-type": chunk_record(wrong_type),
        "no-content-type": (b"nct", template.payload, no_content_type),
        "bad-header": (b"bh", template.payload, bad_header),
    }
    reasons = {
        "garbage": "undecodable",
        "wrong-type": "schema-mismatch",
        "no-content-type": "undecodable",
        "bad-header": "undecodable",
    }
    codes = {
        "garbage": "corrupt_arrow",  # the template chunk is Arrow
        "wrong-type": "column_type_mismatch",
        "no-content-type": "missing_header",
        "bad-header": "invalid_header",
    }
    await produce(kafka, t.topic, good[: len(good) // 2])
    sent = await produce(kafka, t.topic, list(poison.values()))
    await produce(kafka, t.topic, good[len(good) // 2 :])
    ids = {
        name: f"{t.topic}/{meta.partition}/{meta.offset}"
        for name, meta in zip(poison, sent, strict=True)
    }

    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"}
    async with started(kafka_config(t, triton, sink)) as run:
        registry = run.running[0].metrics.registry
        await wait_until(
            lambda: written(registry) >= len(expected), 120, "good rows written", run.task
        )
        await wait_until(lambda: lag_total(registry, t.topic) == 0, 60, "lag at 0", run.task)
        await run.stop_and_wait()
        # The bad header never reaches the pipeline: the source dead-letters it itself, and
        # it is counted all the same (every dead letter once, whoever sends it).
        assert dead_lettered(registry) == {"undecodable": 3, "schema-mismatch": 1}

    dead = await read_all(kafka, t.dlq)
    by_id = {dict(r.headers)["rowbatch-dlq-message-id"].decode(): r for r in dead}
    assert len(dead) == len(poison) == len(by_id)
    assert set(by_id) == set(ids.values())
    for name, message_id in ids.items():
        record = by_id[message_id]
        headers = dict(record.headers)
        key, value, original = poison[name]
        assert record.key == key
        assert record.value == value
        for k, v in original:
            assert headers[k] == v, (name, k)
        assert headers["rowbatch-dlq-reason"].decode() == reasons[name], name
        assert headers["rowbatch-dlq-code"].decode() == codes[name], name
        assert headers["rowbatch-dlq-message"]
        assert headers["rowbatch-dlq-topic"].decode() == t.topic
        partition, offset = message_id.rsplit("/", 2)[1:]
        assert headers["rowbatch-dlq-partition"].decode() == partition
        assert headers["rowbatch-dlq-offset"].decode() == offset
        assert headers["rowbatch-dlq-delivery-attempt"] == b"1"
    assert b"id" in dict(by_id[ids["wrong-type"]].headers)["rowbatch-dlq-message"]

    got = read_results("sqlite", tmp_path / "r.sqlite", "scores")
    assert set(got) == set(expected)
    committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
    assert committed == end


# --- kill -9 a consumer process mid-run and restart it -----------------------------------------


@dataclass
class Child:
    """``python -m rowbatch.consumer run`` configured by environment variables alone."""

    name: str
    env: dict[str, str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "rowbatch.consumer", "run"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env,
                cwd=REPO_ROOT,
                start_new_session=True,
            )

    def ready(self) -> bool:
        port = json.loads(self.env["ROWBATCH_SERVER"])["port"]
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as answer:
                return int(answer.status) == 200
        except OSError:
            return False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None and self.alive(), log_tail(self.log_path)
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self, timeout_s: float = 60) -> int:
        assert self.proc is not None and self.alive(), log_tail(self.log_path)
        os.kill(self.proc.pid, signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def child_env(config: ConsumerConfig) -> dict[str, str]:
    """The configuration as ``ROWBATCH_<SECTION>`` JSON values (secrets revealed)."""
    data = config.model_dump(mode="json", exclude={"server"})
    if "dsn" in data["sink"]:
        sink = config.sink
        assert isinstance(sink, PostgresSinkSettings)
        data["sink"]["dsn"] = sink.dsn.get_secret_value()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    for key, value in data.items():
        env[f"ROWBATCH_{key.upper()}"] = (
            json.dumps(value) if isinstance(value, dict) else str(value)
        )
    return env


@pytest.mark.timeout(600)
async def test_kill_9_of_a_consumer_mid_run_and_a_restart_leave_every_row_exactly_once(
    kafka: KafkaEndpoint, triton: TritonEndpoint, postgres: PostgresEndpoint, tmp_path: Path
) -> None:
    t = await KafkaTopics.create(kafka, partitions=6)
    total = 30_000
    chunks, expected = scorer_chunks(total, seed=21, max_rows=400)
    table = f"kafka_kill_{int(time.time() * 1000) % 10**8}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    env = child_env(kafka_config(t, triton, sink))
    children = [
        Child(
            n, env | {"ROWBATCH_SERVER": json.dumps({"port": free_port()})}, tmp_path / f"{n}.log"
        )
        for n in ("a", "b", "a2")
    ]
    a, b, a2 = children

    def rows() -> int:
        return count_rows(postgres.dsn, table)

    published = 0

    async def publish_paced() -> None:
        nonlocal published
        for chunk in chunks:
            await produce(kafka, t.topic, [chunk_record(chunk)])
            published += 1
            await asyncio.sleep(0.08)

    try:
        for child in (a, b):
            child.start()
            await wait_until(child.ready, 60, f"consumer {child.name} ready")
        publisher = asyncio.create_task(publish_paced())
        await wait_until(lambda: rows() >= total // 4, 180, "a quarter of the rows written")
        assert a.alive() and b.alive(), log_tail(a.log_path) + log_tail(b.log_path)
        a.kill9()  # no drain, no commit, no LeaveGroup: b takes over after the session timeout
        killed_at = rows()
        await asyncio.sleep(2)
        a2.start()
        await wait_until(a2.ready, 60, "the restarted consumer ready")
        await publisher
        await wait_until(lambda: rows() >= total, 300, "every row written")
        assert killed_at < total
        # Both survivors commit to the end (the group's committed offsets reach the end).
        deadline = time.monotonic() + 60
        while True:
            committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
            if committed == end or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert committed == end
        assert b.terminate() == 0, log_tail(b.log_path)
        assert a2.terminate() == 0, log_tail(a2.log_path)
    finally:
        for child in children:
            child.cleanup()
    got = read_results("postgres", postgres.dsn, table)  # asserts no duplicate ids
    assert set(got) == set(expected)
    assert all(got[i][1] == int(expected[i][1]) for i in range(0, total, 89))
    print(f"\nkill -9 at {killed_at}/{total} rows written; restarted; every row once")


# --- slow batches: work in flight across a rebalance; a server outage ------------------------


@pytest.fixture
def chaos_model(triton: TritonEndpoint) -> Iterator[TritonEndpoint]:
    ChaosControl().write(triton.chaos_control)
    yield triton
    ChaosControl().write(triton.chaos_control)


CHAOS_BINDING = {
    "inputs": {"text": "TEXT"},
    "outputs": {"EMBEDDING": "embedding"},
    "passthrough": {"id": "int64"},
}


def chaos_config(
    t: KafkaTopics, triton: TritonEndpoint, sink: dict[str, Any], **source: Any
) -> ConsumerConfig:
    base = kafka_config(t, triton, sink, **source).model_dump()
    base["model"] = {"url": triton.grpc_url, "name": "chaos", "max_wait_ms": 50}
    base["binding"] = CHAOS_BINDING
    return ConsumerConfig.model_validate(base)


def count_distinct(dsn: str, table: str) -> tuple[int, int]:
    """(rows, distinct (chunk_id, row_index)) in the table."""
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return 0, 0
        row = conn.execute(
            f"SELECT count(*), count(DISTINCT (chunk_id, row_index)) FROM {table}"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.timeout(300)
async def test_records_in_flight_across_a_rebalance_are_written_by_two_members_but_once(
    kafka: KafkaEndpoint, chaos_model: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    """Batches take 1.5 s and the revoke grace is 0: when a second member joins, the first
    one's in-flight records are not committed, so their partitions' next owner reads them
    again while the first one is still writing them. Both write; the table holds each row
    once (the sink upserts on (chunk_id, row_index))."""
    ChaosControl(delay_s=1.5).write(chaos_model.chaos_control)
    t = await KafkaTopics.create(kafka, partitions=2)
    chunks = [text_chunk(n, 10) for n in range(40)]
    await produce(kafka, t.topic, [chunk_record(c) for c in chunks])
    table = f"kafka_twice_{int(time.time() * 1000) % 10**8}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    config = chaos_config(t, chaos_model, sink, revoke_grace_s=0.0)
    async with started(config) as a:
        ra = a.running[0].metrics.registry
        await wait_until(
            lambda: (ra.get_sample_value("rowbatch_inflight_batches") or 0) > 0,
            60,
            "a batch in flight",
            a.task,
        )
        async with started(config) as b:
            rb = b.running[0].metrics.registry
            await wait_until(
                lambda: count_distinct(postgres.dsn, table)[1] >= 400, 120, "400 rows", a.task
            )
            for run in (a, b):
                await wait_until(lag_is_zero(run, t.topic), 60, "lag at 0", run.task)
            await b.stop_and_wait()
        await a.stop_and_wait()
    assert written(ra) + written(rb) == 400  # stored once each
    twice = duplicates(ra) + duplicates(rb)
    assert twice > 0, "no row was processed twice: the test did not exercise the case"
    assert count_distinct(postgres.dsn, table) == (400, 400)
    committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
    assert committed == end
    print(f"\nrows written twice across the rebalance: {twice:.0f}; in the table once each")


@pytest.mark.timeout(300)
async def test_a_20_s_server_outage_pauses_within_budget_without_leaving_the_group(
    kafka: KafkaEndpoint, chaos_model: TritonEndpoint, tmp_path: Path
) -> None:
    """The model answers UNAVAILABLE for 20 s (more than session_timeout_ms=6 s and
    max_poll_interval_ms=10 s) while 20,000 rows wait: consumption pauses (the partitions are
    paused, polling goes on), the member keeps its partitions, memory in flight stays inside
    the 32 MiB budget, nothing is dead-lettered and nothing is lost."""
    ChaosControl(delay_s=0.05).write(chaos_model.chaos_control)
    t = await KafkaTopics.create(kafka, partitions=3)
    chunks = [text_chunk(n, 100) for n in range(200)]  # 20,000 rows
    await produce(kafka, t.topic, [chunk_record(c) for c in chunks[:20]])
    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    budget = 32 * 1024 * 1024
    base = chaos_config(t, chaos_model, sink, max_poll_interval_ms=10_000).model_dump()
    config = ConsumerConfig.model_validate({**base, "budget_bytes": budget})
    assert isinstance(config.source, KafkaSettings)
    stop = asyncio.Event()
    running: list[Running] = []
    source = make_source(config.source)
    assert isinstance(source, KafkaSource)
    task = asyncio.create_task(run_consumer(config, stop, source=source, on_running=running.append))
    try:
        await wait_until(lambda: bool(running), 60, "consumer start", task)
        registry = running[0].metrics.registry
        await wait_until(lambda: written(registry) >= 1000, 60, "first rows", task)
        assert source.assignments == 1
        outage_s = 20.0
        ChaosControl(unavailable_until=time.time() + outage_s, delay_s=0.05).write(
            chaos_model.chaos_control
        )
        started_at = time.monotonic()
        await produce(kafka, t.topic, [chunk_record(c) for c in chunks[20:]])
        peak_inflight, paused_for = 0.0, 0.0
        last = time.monotonic()
        while written(registry) < 20_000:
            assert not task.done(), "consumer stopped"
            now = time.monotonic()
            if registry.get_sample_value("rowbatch_paused", {"why": "backoff"}) == 1:
                assert source.paused
                paused_for += now - last
            last = now
            peak_inflight = max(
                peak_inflight, registry.get_sample_value("rowbatch_inflight_bytes") or 0.0
            )
            assert now - started_at < 180, "not finished 180 s after the outage began"
            await asyncio.sleep(0.1)
        assert time.monotonic() - started_at >= outage_s * 0.9
        assert paused_for >= 10, f"paused for backoff only {paused_for:.1f} s of the outage"
        assert source.assignments == 1, "the member lost its partitions while paused"
        assert (registry.get_sample_value("rowbatch_backoff_periods_total") or 0) >= 1
        assert dead_lettered(registry) == {}
        assert peak_inflight <= budget
        await wait_until(lambda: source.outstanding == 0, 30, "nothing outstanding", task)
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
    assert committed == end
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        assert conn.execute("SELECT count(DISTINCT id), count(*) FROM emb").fetchone() == (
            20_000,
            20_000,
        )
    print(
        f"\n20 s outage: paused {paused_for:.1f} s, peak in flight "
        f"{peak_inflight / 2**20:.1f} MiB of {budget / 2**20:.0f} MiB, partitions kept"
    )
