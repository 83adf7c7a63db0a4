"""The consumer end to end on the real Kafka broker, Triton and a real sink, what only Kafka
has: a consumer group that grows and shrinks while rows are published writes every row exactly
once and commits to the end; a consumer killed with kill -9 mid-run and restarted leaves every
row once; records in flight across a rebalance are written by two members but stored once.
What both brokers share (a backlog in full batches, poison, a server outage) is in
test_consumer.py; the helpers here are shared with other integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
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
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.sinks.settings import PostgresSinkSettings
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


# --- slow batches: work in flight across a rebalance -----------------------------------------


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


@pytest.mark.timeout(600)
async def test_kill_9_after_a_row_part_is_dead_lettered_and_before_the_commit_leaves_every_row_once(
    kafka: KafkaEndpoint, triton: TritonEndpoint, postgres: PostgresEndpoint, tmp_path: Path
) -> None:
    """500-row messages with marked rows the model rejects; the consumer commits offsets only
    every 60 s, and is killed with -9 once row parts are in the dead-letter topic (their
    messages acked, the offsets not yet committed). The restarted consumer reads those messages
    again: their good rows are rewritten under the same keys (no duplicate row), their bad rows
    dead-lettered again under the same part chunk id (the dead-letter topic is at least once,
    as for whole messages), and a replay of every letter writes each marked row once."""
    ChaosControl(reject_marker="POISON-ROW").write(triton.chaos_control)
    t = await KafkaTopics.create(kafka, partitions=1)
    marked = {n: [n * 37 % 500] for n in range(0, 12, 3)}
    chunks = [text_chunk_marked(n, 500, marked.get(n, [])) for n in range(12)]
    table = f"kafka_kill_rows_{int(time.time() * 1000) % 10**8}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    config = ConsumerConfig.model_validate(
        {
            **kafka_config(t, triton, sink, commit_interval_s=60.0).model_dump(mode="json"),
            "model": {"url": triton.grpc_url, "name": "chaos", "max_wait_ms": 50},
            "binding": {
                "inputs": {"text": "TEXT"},
                "outputs": {"EMBEDDING": "embedding"},
                "passthrough": {"id": "int64"},
            },
            "sink": sink,
        }
    )
    env = child_env(config)
    children = [
        Child(n, env | {"ROWBATCH_SERVER": json.dumps({"port": free_port()})}, tmp_path / n)
        for n in ("a", "a2")
    ]
    a, a2 = children
    want = {n * 1000 + r for n in range(12) for r in range(500)}
    bad = {n * 1000 + r for n, rows in marked.items() for r in rows}

    def ids() -> list[int]:
        with psycopg.connect(postgres.dsn) as conn:
            if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
                return []
            return [i for (i,) in conn.execute(f"SELECT id FROM {table}").fetchall()]

    try:
        a.start()
        await wait_until(a.ready, 60, "consumer a ready")
        await produce(kafka, t.topic, [chunk_record(c) for c in chunks])
        await wait_until(lambda: len(ids()) == len(want - bad), 180, "every good row written")
        letters = await read_all(kafka, t.dlq)
        assert len(letters) == len(marked)
        committed, _ = await group_offsets(kafka, t.topic, t.group, 1)
        assert not committed.get(0), "the offsets were committed before the kill"
        a.kill9()
        a2.start()
        await wait_until(a2.ready, 60, "the restarted consumer ready")
        deadline = time.monotonic() + 120
        while len(await read_all(kafka, t.dlq)) < 2 * len(marked):
            assert time.monotonic() < deadline, log_tail(a2.log_path)
            await asyncio.sleep(0.5)
        assert a2.terminate() == 0, log_tail(a2.log_path)
    finally:
        for child in children:
            child.cleanup()
    got = ids()
    assert len(got) == len(set(got)) == len(want - bad)  # no duplicate row
    assert set(got) == want - bad
    letters = await read_all(kafka, t.dlq)
    by_parent: dict[str, set[str]] = {}
    for record in letters:
        headers = {k: bytes(v or b"").decode() for k, v in record.headers}
        by_parent.setdefault(headers["rowbatch-parent-chunk-id"], set()).add(
            headers["rowbatch-chunk-id"]
        )
    assert set(by_parent) == {f"t{n}" for n in marked}
    assert all(len(parts) == 1 for parts in by_parent.values()), by_parent  # same part id
    print(f"\n{len(letters)} letters for {len(marked)} parts after the kill; no row twice")

    # Every letter replayed (the duplicates too), the model taking the marked rows now.
    ChaosControl().write(triton.chaos_control)
    replay = [
        (r.key, bytes(r.value), [(k, bytes(v or b"")) for k, v in r.headers
                                 if not k.startswith("rowbatch-dlq-")])
        for r in letters
    ]  # fmt: skip
    await produce(kafka, t.topic, replay)
    replayer = Child(
        "r", env | {"ROWBATCH_SERVER": json.dumps({"port": free_port()})}, tmp_path / "r.log"
    )
    try:
        replayer.start()
        await wait_until(lambda: len(ids()) == len(want), 120, "the replayed rows written")
        assert replayer.terminate() == 0, log_tail(replayer.log_path)
    finally:
        replayer.cleanup()
    got = ids()
    assert len(got) == len(set(got)) == len(want)


def text_chunk_marked(n: int, rows: int, marked: list[int]) -> EncodedChunk:
    texts = [f"message {n} row {r}" + (" POISON-ROW" if r in marked else "") for r in range(rows)]
    ids = np.arange(n * 1000, n * 1000 + rows, dtype=np.int64)
    return encode_chunk("docs", {"id": ids, "text": texts}, "arrow" if n % 2 else "json", f"t{n}")
