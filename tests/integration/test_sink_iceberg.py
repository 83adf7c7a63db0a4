"""The Iceberg sink on the real services: Kafka, Triton's ``scorer``, PostgreSQL as the SQL
catalog (and its key ledger), the warehouse on a local S3-compatible server (moto).

- A fleet: 3 consumer processes write 300,000 rows into one table at once; two of them are
  killed (SIGKILL) right after a commit of theirs lands, before Kafka's offsets follow, and
  started again. Read back with pyiceberg and with pyarrow over the current snapshot's files:
  every row once, scores equal to the reference, and files counted in tens, not in batches.
- Several writers committing in the same second lose the compare-and-set to each other: the
  conflicts are retried and counted, and nothing is lost.
- SIGTERM: rows staged but not committed are committed, then acked, before the exit (both
  brokers).
- Pub/Sub: a consumer killed with rows staged but not committed; Pub/Sub redelivers their
  messages to the next one, which writes them once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from harness.consumer_process import ConsumerProcess, to_toml
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from harness.s3 import ACCESS_KEY, REGION, SECRET_KEY, S3Endpoint
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import load_config
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, TableSpec
from rowbatch.consumer.sinks.iceberg import ledger
from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog
from rowbatch.consumer.sinks.iceberg.sink import IcebergSink
from rowbatch.wire.chunks.encode import EncodedChunk
from tests.integration.consumer_helpers import Topics
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, group_offsets, produce
from tests.integration.pubsub_helpers import pull, use_emulator
from tests.integration.test_consumer_kafka import SCORER_BINDING, scorer_chunks

WAIT_S = 240.0


def catalog_uri(postgres: PostgresEndpoint) -> str:
    return postgres.dsn.replace("postgresql://", "postgresql+psycopg://", 1)


def s3_properties(s3: S3Endpoint) -> dict[str, str]:
    return {
        "s3.endpoint": s3.endpoint_url,
        "s3.access-key-id": ACCESS_KEY,
        "s3.secret-access-key": SECRET_KEY,
        "s3.region": REGION,
    }


def iceberg_sink_section(
    postgres: PostgresEndpoint, s3: S3Endpoint, catalog: str, **more: Any
) -> dict[str, Any]:
    """A ``[sink]`` for a table of its own in catalog ``catalog`` (a bucket of its own)."""
    s3.create_bucket(catalog)
    return {
        "kind": "iceberg",
        "catalog_uri": catalog_uri(postgres),
        "catalog_name": catalog,
        "warehouse": f"s3://{catalog}/warehouse",
        "namespace": "tests",
        "table": "scores",
        "properties": s3_properties(s3),
        **more,
    }


_OPENED: list[LedgerCatalog] = []


@pytest.fixture(autouse=True)
def _close_catalogs() -> Iterator[None]:
    """Every catalog a test opened is closed at its end, also when it fails."""
    yield
    while _OPENED:
        _OPENED.pop().close()


def open_catalog(sink: dict[str, Any]) -> LedgerCatalog:
    catalog = LedgerCatalog(
        sink["catalog_name"],
        uri=sink["catalog_uri"],
        warehouse=sink["warehouse"],
        **sink["properties"],
    )
    _OPENED.append(catalog)
    return catalog


def kafka_source(topics: KafkaTopics) -> dict[str, Any]:
    # Offsets follow acks every 5 s. A restarted member may wait for a rebalance to join:
    # the default join bound (KafkaSettings.join_timeout_s) covers it.
    return {**topics.source(), "commit_interval_s": 5.0}


def start_consumer(
    tmp_path: Path,
    name: str,
    source: dict[str, Any],
    triton: TritonEndpoint,
    sink: dict[str, Any],
) -> ConsumerProcess:
    port = free_port()
    config = {
        "source": source,
        "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 20},
        "binding": SCORER_BINDING,
        "sink": sink,
        "server": {"host": "127.0.0.1", "port": port},
        "shutdown_grace_s": 60.0,
        "log_format": "json",
    }
    path = tmp_path / f"{name}.toml"
    path.write_text(to_toml(config))
    load_config(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    proc = ConsumerProcess(name, path, tmp_path / f"{name}.log", port, env)
    proc.start()
    return proc


async def wait_for(
    predicate: Callable[[], bool],
    what: str,
    procs: list[ConsumerProcess] | None = None,
    wait_s: float = WAIT_S,
) -> None:
    deadline = time.monotonic() + wait_s
    while not predicate():
        for proc in procs or []:
            proc.check_alive(what)
        if time.monotonic() > deadline:
            tails = "".join(f"\n--- {p.name}:\n{p.log()}" for p in procs or [])
            raise AssertionError(f"timed out waiting for {what}{tails}")
        await asyncio.sleep(0.05)


def commits_of(catalog: LedgerCatalog, ident: str) -> int:
    key = f"{catalog.name}.{ident}"
    with catalog.engine.connect() as conn:
        query = sa.select(sa.func.count()).where(ledger.commits.c.table_ident == key)
        return int(conn.execute(query).scalar_one())


def read_back(catalog: LedgerCatalog, ident: str) -> tuple[pa.Table, pa.Table, list[int]]:
    """The table by pyiceberg's scan; the same from the current snapshot's data files read
    with pyarrow; the sizes of those files."""
    table = catalog.load_table(ident)
    scanned = table.scan(selected_fields=("chunk_id", "row_index", "id", "score")).to_arrow()
    tasks = list(table.scan().plan_files())
    parts = []
    for task in tasks:
        with table.io.new_input(task.file.file_path).open() as src:
            parts.append(pq.read_table(src, columns=["chunk_id", "row_index", "id", "score"]))
    direct = pa.concat_tables(parts) if parts else scanned.slice(0, 0)
    return scanned, direct, [int(task.file.file_size_in_bytes) for task in tasks]


def check_exactly_once(rows: pa.Table, expected: dict[int, tuple[Any, Any]]) -> None:
    ids = np.sort(rows["id"].to_numpy())
    keys = set(zip(rows["chunk_id"].to_pylist(), rows["row_index"].to_pylist(), strict=True))
    assert len(keys) == rows.num_rows, f"{rows.num_rows - len(keys)} rows are there twice"
    assert ids.shape[0] == len(expected), f"{rows.num_rows} rows, expected {len(expected)}"
    assert (ids == np.arange(len(expected))).all(), "a row is missing or there twice"
    order = np.argsort(rows["id"].to_numpy())
    got = rows["score"].to_numpy()[order]
    want = np.array([expected[i][0] for i in range(len(expected))], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.fixture
def procs() -> Iterator[list[ConsumerProcess]]:
    started: list[ConsumerProcess] = []
    try:
        yield started
    finally:
        for proc in started:
            proc.stop()


@pytest.mark.timeout(900)
async def test_three_consumers_with_two_kills_write_every_row_once_in_large_files(
    kafka: KafkaEndpoint,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    tmp_path: Path,
    procs: list[ConsumerProcess],
) -> None:
    total = 300_000
    chunks, expected = scorer_chunks(total, seed=26, max_rows=500)
    topics = await KafkaTopics.create(kafka, partitions=6)
    records = [chunk_record(c) for c in chunks]
    # A tenth to start with, the rest over ~45 s: commits keep landing while members die.
    await produce(kafka, topics.topic, records[: len(records) // 10])

    async def publish_the_rest() -> None:
        rest = records[len(records) // 10 :]
        step = max(1, len(rest) // 30)
        for start in range(0, len(rest), step):
            await produce(kafka, topics.topic, rest[start : start + step])
            await asyncio.sleep(1.5)

    publishing = asyncio.create_task(publish_the_rest())
    name = f"fleet{uuid.uuid4().hex[:8]}"
    target_mb = 0.5
    sink = iceberg_sink_section(postgres, s3, name, target_file_mb=target_mb, commit_interval_s=4.0)
    catalog = open_catalog(sink)
    ident = "tests.scores"

    for i in range(3):
        procs.append(start_consumer(tmp_path, f"c{i}", kafka_source(topics), triton, sink))
    kills = 0
    killed: list[ConsumerProcess] = []
    for victim in (0, 1):
        # Kill right after one of its commits lands: Kafka's offsets follow only every 5 s,
        # so the restarted member reads messages whose rows are in the table already.
        # Its own commit, not any member's: after another member's commit this one's offsets
        # may already have caught up with its last commit (then nothing is met twice).
        proc = procs[victim]
        await wait_for(
            lambda p=proc: (p.metric("rowbatch_iceberg_commits_total") or 0) >= 2,  # type: ignore[misc]
            f"{proc.name}'s second commit",
            procs,
        )
        own = proc.metric("rowbatch_iceberg_commits_total") or 0
        await wait_for(
            lambda p=proc, own=own: (p.metric("rowbatch_iceberg_commits_total") or 0) > own,  # type: ignore[misc]
            f"{proc.name}'s next commit",
            procs,
            60,
        )
        proc.send(signal.SIGKILL)
        proc.wait(30)
        proc.stop()
        kills += 1
        procs[victim] = start_consumer(
            tmp_path, f"c{victim}-again", kafka_source(topics), triton, sink
        )
        killed.append(proc)

    def acked() -> int:
        return sum(int(p.metric("rowbatch_rows_written_total") or 0) for p in procs[:3])

    async def drained() -> bool:
        committed, end = await group_offsets(kafka, topics.topic, topics.group, 6)
        return all(committed[p] == end[p] for p in end)

    await publishing
    deadline = time.monotonic() + WAIT_S
    while not await drained():
        for proc in procs[:3]:
            proc.check_alive("the backlog drained")
        assert time.monotonic() < deadline, "the group did not commit every offset in time"
        await asyncio.sleep(0.5)
    duplicates = sum(
        p.metric("rowbatch_iceberg_rows_already_committed_total") or 0 for p in procs[:3]
    )
    conflicts = sum(p.metric("rowbatch_iceberg_commit_conflicts_total") or 0 for p in procs[:3])
    for proc in procs[:3]:
        assert proc.terminate() == 0, proc.log()

    scanned, direct, sizes = read_back(catalog, ident)
    check_exactly_once(scanned, expected)
    check_exactly_once(direct, expected)
    commits, files = commits_of(catalog, ident), len(sizes)
    full = sum(sizes) / (target_mb * 2**20)
    batches = total / 256
    print(
        f"\n{total:,} rows by 3 consumers ({kills} killed after a commit and restarted): "
        f"{files} data files in {commits} commits ({total / files:,.0f} rows a file; one file "
        f"per batch would be {batches:,.0f}); rows found committed already and left out: "
        f"{duplicates:,.0f}; commit conflicts retried: {conflicts:,.0f}"
    )
    assert duplicates > 0, "no restarted consumer met rows committed before the kill"
    # Each commit closes each member's open file; a file is also rolled when full.
    assert files <= commits + full + 1, "more files than the commits and the target size make"
    assert files < batches / 10
    catalog.close()


def _rows(chunk: str, start: int, n: int) -> ResultRows:
    return ResultRows(
        chunk_id=np.array([chunk] * n, dtype=object),
        row_index=np.arange(start, start + n, dtype=np.int64),
        source_message_id=np.array([f"{chunk}-m"] * n, dtype=object),
        passthrough={"id": np.arange(start, start + n, dtype=np.int64)},
        outputs={"score": np.linspace(0, 1, n, dtype=np.float32)},
        nulls={},
        model_name="scorer",
        model_version="1",
        processed_at=datetime.now(UTC),
    )


@pytest.mark.timeout(300)
async def test_writers_committing_in_the_same_second_retry_their_conflicts_and_lose_nothing(
    postgres: PostgresEndpoint, s3: S3Endpoint
) -> None:
    name = f"race{uuid.uuid4().hex[:8]}"
    section = iceberg_sink_section(postgres, s3, name)
    spec = TableSpec("scores", (ColumnSpec("id", "int64"),), (ColumnSpec("score", "float32"),))
    registries = [CollectorRegistry() for _ in range(4)]
    sinks = [
        IcebergSink(lambda: open_catalog(section), namespace="tests", registry=r)
        for r in registries
    ]
    for sink in sinks:
        await sink.open(spec)
    rounds, rows = 0, 0
    try:
        while rounds < 10:
            rounds += 1
            for n, sink in enumerate(sinks):
                await sink.write(_rows(f"r{rounds}-w{n}", 0, 100))
                rows += 100
            await asyncio.gather(*(sink.commit() for sink in sinks))
            conflicts = sum(
                r.get_sample_value("rowbatch_iceberg_commit_conflicts_total") or 0
                for r in registries
            )
            if conflicts >= 3 and rounds >= 3:
                break
    finally:
        for sink in sinks:
            await sink.close()
    catalog = open_catalog(section)
    table = catalog.load_table("tests.scores").scan().to_arrow()
    keys = set(zip(table["chunk_id"].to_pylist(), table["row_index"].to_pylist(), strict=True))
    print(f"\n4 writers, {rounds} rounds of simultaneous commits: {conflicts:.0f} conflicts")
    assert table.num_rows == rows == len(keys)
    assert conflicts >= 1, "no commit ever lost the race: the test shows nothing"
    assert commits_of(catalog, "tests.scores") == 4 * rounds
    catalog.close()


@dataclass
class Broker:
    """One broker's side of a test: the ``[source]``, publishing, and what is left unacked."""

    name: str
    source: dict[str, Any]
    publish: Callable[[list[EncodedChunk]], Awaitable[None]]
    all_acked: Callable[[], Awaitable[bool]]
    """Whether every published message is acked (Kafka: the group's offsets at the end;
    Pub/Sub: nothing is delivered within a few seconds)."""


@pytest.fixture(params=["kafka", "pubsub"])
async def broker(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Broker]:
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        t = await KafkaTopics.create(kafka, partitions=2)

        async def kafka_publish(chunks: list[EncodedChunk]) -> None:
            await produce(kafka, t.topic, [chunk_record(c) for c in chunks])

        async def kafka_acked() -> bool:
            committed, end = await group_offsets(kafka, t.topic, t.group, t.partitions)
            return committed == end

        source = kafka_source(t)
        yield Broker("kafka", source, kafka_publish, kafka_acked)
        return
    pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
    use_emulator(pubsub, monkeypatch)
    topics = Topics.create(pubsub, ack_deadline_s=20)

    async def pubsub_publish(chunks: list[EncodedChunk]) -> None:
        await asyncio.to_thread(topics.publish, chunks)

    async def pubsub_acked() -> bool:
        return await pull(topics, topics.subscription, 1, within_s=5.0) == []

    try:
        yield Broker("pubsub", topics.source(), pubsub_publish, pubsub_acked)
    finally:
        topics.close()


@pytest.mark.timeout(300)
async def test_sigterm_commits_the_staged_rows_then_acks_them(
    broker: Broker,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    tmp_path: Path,
    procs: list[ConsumerProcess],
) -> None:
    chunks, expected = scorer_chunks(5_000, seed=27, max_rows=200)
    await broker.publish(chunks)
    name = f"term{uuid.uuid4().hex[:8]}"
    # Neither the age nor the size of what is staged ever calls for a commit.
    sink = iceberg_sink_section(postgres, s3, name, commit_interval_s=3600.0)
    catalog = open_catalog(sink)
    proc = start_consumer(tmp_path, "term", broker.source, triton, sink)
    procs.append(proc)
    await wait_for(
        lambda: (proc.metric("rowbatch_rows_written_total") or 0) >= len(expected),
        "every row staged",
        [proc],
    )
    assert (proc.metric("rowbatch_messages_awaiting_commit") or 0) == len(chunks)
    assert (proc.metric("rowbatch_messages_acked_total") or 0) == 0
    assert commits_of(catalog, "tests.scores") == 0

    assert proc.terminate() == 0, proc.log()

    scanned, _, sizes = read_back(catalog, "tests.scores")
    check_exactly_once(scanned, expected)
    assert await broker.all_acked(), "the rows were committed but their messages not acked"
    assert len(sizes) == 1
    catalog.close()


@pytest.mark.timeout(400)
async def test_pubsub_a_kill_mid_run_and_a_restart_write_every_row_once(
    pubsub: PubSubEndpoint,
    monkeypatch: pytest.MonkeyPatch,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    s3: S3Endpoint,
    tmp_path: Path,
    procs: list[ConsumerProcess],
) -> None:
    """Killed with rows staged and not committed (their messages leased, unacked): Pub/Sub
    redelivers them to the restarted consumer, which writes them once."""
    use_emulator(pubsub, monkeypatch)
    topics = Topics.create(pubsub, ack_deadline_s=10)
    try:
        chunks, expected = scorer_chunks(40_000, seed=28, max_rows=300)

        async def publish_paced() -> None:  # ~20 s of traffic: the kill lands mid-stream
            step = max(1, len(chunks) // 20)
            for start in range(0, len(chunks), step):
                await asyncio.to_thread(topics.publish, chunks[start : start + step])
                await asyncio.sleep(1.0)

        publishing = asyncio.create_task(publish_paced())
        name = f"pskill{uuid.uuid4().hex[:8]}"
        sink = iceberg_sink_section(postgres, s3, name, commit_interval_s=2.0)
        catalog = open_catalog(sink)
        source = topics.source()
        first = start_consumer(tmp_path, "first", source, triton, sink)
        procs.append(first)
        await wait_for(
            lambda: (
                (first.metric("rowbatch_iceberg_commits_total") or 0) >= 1
                and (first.metric("rowbatch_messages_awaiting_commit") or 0) > 0
            ),
            "a commit, and rows staged after it",
            [first],
        )
        first.send(signal.SIGKILL)
        first.wait(30)
        before = read_back(catalog, "tests.scores")[0].num_rows
        assert 0 < before < len(expected), "the kill came too early or too late"
        second = start_consumer(tmp_path, "second", source, triton, sink)
        procs.append(second)
        await publishing

        def all_in() -> bool:
            return bool(read_back(catalog, "tests.scores")[0].num_rows >= len(expected))

        await wait_for(all_in, "every row in the table", [second], 300)
        assert second.terminate() == 0, second.log()
        scanned, direct, _ = read_back(catalog, "tests.scores")
        check_exactly_once(scanned, expected)
        check_exactly_once(direct, expected)
        assert await pull(topics, topics.subscription, 1, within_s=5.0) == []
        print(f"\nPub/Sub: killed with {before:,} of {len(expected):,} rows committed")
        catalog.close()
    finally:
        topics.close()
