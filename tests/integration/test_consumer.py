"""The consumer end to end on each real broker (Kafka, the Pub/Sub emulator), Triton and a real
sink, each test written once and run on both through a small adapter (:class:`Broker`): a
backlog drains into the sink in full Triton batches, poison messages land in the dead-letter
topic with their reasons while everything else is written once, and a 20 s model-server outage
pauses consumption within the memory budget and loses nothing. What only one broker has (a
Kafka group that grows and shrinks, kill -9, work in flight across a rebalance; Pub/Sub batches
slower than the ack deadline) is in test_consumer_kafka.py and test_consumer_pubsub.py."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from bench.triton import server_stats
from harness.chaos import ChaosControl
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.reference_models import embed
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.build_io import make_source
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.consumer.sources.base import Source
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.chunks.row_parts import format_rows
from tests.integration.consumer_helpers import Topics, wait_until
from tests.integration.kafka_helpers import (
    Header,
    KafkaTopics,
    chunk_record,
    group_offsets,
    produce,
    read_all,
)
from tests.integration.pubsub_helpers import use_emulator
from tests.integration.test_consumer_kafka import scorer_chunks
from tests.integration.test_consumer_pubsub import (
    dead_lettered,
    read_embeddings,
    read_results,
    settled,
    text_chunk,
    triton_batch_rows,
)

BINDINGS: dict[str, dict[str, Any]] = {
    "scorer": {
        "inputs": {"features": "FEATURES", "count": "COUNT"},
        "outputs": {"SCORE": "score", "LABEL": "label"},
        "passthrough": {"id": "int64"},
    },
    "chaos": {
        "inputs": {"text": "TEXT"},
        "outputs": {"EMBEDDING": "embedding"},
        "passthrough": {"id": "int64"},
    },
}


@dataclass(frozen=True)
class DeadLetter:
    """A message read back from the dead-letter topic."""

    key: bytes | None
    """Kafka's record key; None on Pub/Sub."""
    payload: bytes
    headers: dict[str, bytes]
    """Kafka headers, or Pub/Sub attributes encoded as UTF-8."""

    def text(self, name: str) -> str:
        return self.headers[name].decode()


class Broker(Protocol):
    """One broker as the consumer tests see it: a fresh topic with what the consumer reads it
    with (subscription or group) and a dead-letter topic, publishing with the broker's own
    client, reading the dead letters back, and the broker-side checks."""

    name: str
    counts_attempts: bool
    """The dead letters' ``rowbatch-dlq-delivery-attempt`` is counted (Kafka counts locally;
    Pub/Sub only on a subscription with a dead-letter policy, which these have not)."""
    outage_head: int
    """Of the outage test's chunks, how many wait on the broker when the consumer starts; the
    rest are published once the outage began."""
    outage_source: dict[str, Any]
    """``[source]`` settings of the outage test."""

    async def prepare(self, partitions: int) -> None:
        """Creates the topic (``partitions``: Kafka's; Pub/Sub has none)."""
        ...

    def source(self, **overrides: Any) -> dict[str, Any]:
        """The consumer's ``[source]`` section."""
        ...

    async def publish(
        self, messages: Sequence[tuple[bytes | None, bytes, Sequence[Header]]]
    ) -> list[str]:
        """Publishes (key, payload, headers); returns their ids as the consumer names them
        (``rowbatch-dlq-message-id``). Pub/Sub has no key, and attributes are strings."""
        ...

    async def dead_letters(self, expect: int) -> list[DeadLetter]: ...

    def source_for_run(self, config: ConsumerConfig) -> Source | None:
        """A source to run the consumer with, kept for the checks below (Kafka: the group
        membership); None: the consumer builds its own."""
        ...

    def assert_member(self, source: Source | None) -> None:
        """The consumer still holds what it was assigned (Kafka: one assignment, no
        rebalance)."""
        ...

    def assert_paused(self, source: Source | None) -> None:
        """Called while the consumer reports itself paused for the backoff."""
        ...

    async def drained(self, registry: CollectorRegistry, source: Source | None) -> None:
        """Waits until the broker side shows everything consumed (Kafka: the lag gauge, or
        the outstanding records of ``source``)."""
        ...

    def assert_dead_letter_origin(
        self, dead: DeadLetter, message_id: str, key: bytes | None
    ) -> None:
        """The dead letter names where the message came from."""
        ...

    async def assert_consumed(self) -> None:
        """Everything is settled on the broker (Kafka: the group committed to the end)."""
        ...

    def close(self) -> None: ...


@dataclass
class PubSubBroker:
    endpoint: PubSubEndpoint
    name: str = "pubsub"
    counts_attempts: bool = False
    outage_head: int = 200
    outage_source: dict[str, Any] = field(default_factory=dict)
    topics: Topics | None = None

    @property
    def t(self) -> Topics:
        assert self.topics is not None, "prepare() first"
        return self.topics

    async def prepare(self, partitions: int) -> None:
        self.topics = await asyncio.to_thread(Topics.create, self.endpoint)

    def source(self, **overrides: Any) -> dict[str, Any]:
        return {
            "kind": "pubsub",
            "subscription": self.t.subscription,
            "dead_letter_topic": self.t.dlq_topic,
            "max_lease_extension_s": 10,
            **overrides,
        }

    async def publish(
        self, messages: Sequence[tuple[bytes | None, bytes, Sequence[Header]]]
    ) -> list[str]:
        def send() -> list[str]:
            futures = [
                self.t.publisher.publish(
                    self.t.topic, payload, **{k: v.decode() for k, v in headers}
                )
                for _, payload, headers in messages
            ]
            return [f.result(timeout=60) for f in futures]

        return await asyncio.to_thread(send)

    async def dead_letters(self, expect: int) -> list[DeadLetter]:
        got = await asyncio.to_thread(self.t.dead_letters, expect)
        return [
            DeadLetter(None, bytes(m.data), {k: v.encode() for k, v in m.attributes.items()})
            for m in got
        ]

    def source_for_run(self, config: ConsumerConfig) -> Source | None:
        return None

    def assert_member(self, source: Source | None) -> None:
        pass

    def assert_paused(self, source: Source | None) -> None:
        pass

    async def drained(self, registry: CollectorRegistry, source: Source | None) -> None:
        pass

    def assert_dead_letter_origin(
        self, dead: DeadLetter, message_id: str, key: bytes | None
    ) -> None:
        assert dead.text("rowbatch-dlq-source") == self.t.subscription

    async def assert_consumed(self) -> None:
        pass

    def close(self) -> None:
        if self.topics is not None:
            self.topics.close()


@dataclass
class KafkaBroker:
    endpoint: KafkaEndpoint
    name: str = "kafka"
    counts_attempts: bool = True
    outage_head: int = 20
    outage_source: dict[str, Any] = field(default_factory=lambda: {"max_poll_interval_ms": 10_000})
    """Less than the outage: a member that stopped polling while paused would be dropped."""
    topics: KafkaTopics | None = None

    @property
    def t(self) -> KafkaTopics:
        assert self.topics is not None, "prepare() first"
        return self.topics

    async def prepare(self, partitions: int) -> None:
        self.topics = await KafkaTopics.create(self.endpoint, partitions=partitions)

    def source(self, **overrides: Any) -> dict[str, Any]:
        return {
            "kind": "kafka",
            "bootstrap_servers": self.t.bootstrap,
            "topic": self.t.topic,
            "group_id": self.t.group,
            "commit_interval_s": 0.5,
            "revoke_grace_s": 2.0,
            "lag_interval_s": 0.5,
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            **overrides,
        }

    async def publish(
        self, messages: Sequence[tuple[bytes | None, bytes, Sequence[Header]]]
    ) -> list[str]:
        sent = await produce(self.endpoint, self.t.topic, messages)
        return [f"{self.t.topic}/{m.partition}/{m.offset}" for m in sent]

    async def dead_letters(self, expect: int) -> list[DeadLetter]:
        records = await read_all(self.endpoint, self.t.dlq)
        return [DeadLetter(r.key, r.value, dict(r.headers)) for r in records]

    def source_for_run(self, config: ConsumerConfig) -> Source | None:
        source = make_source(config.source)
        assert isinstance(source, KafkaSource)
        return source

    def assert_member(self, source: Source | None) -> None:
        assert isinstance(source, KafkaSource)
        assert source.assignments == 1, "the member lost its partitions while paused"

    def assert_paused(self, source: Source | None) -> None:
        assert isinstance(source, KafkaSource)
        assert source.paused

    async def drained(self, registry: CollectorRegistry, source: Source | None) -> None:
        """The consumer's lag gauge at 0; with a source of the test's own (which reports its
        lag elsewhere), nothing outstanding in it."""
        if isinstance(source, KafkaSource):
            await wait_until(lambda: source.outstanding == 0, 30, "nothing outstanding")
            return
        topic = self.t.topic
        await wait_until(
            lambda: registry.get_sample_value("rowbatch_kafka_lag_total", {"topic": topic}) == 0,
            60,
            "lag at 0",
        )

    def assert_dead_letter_origin(
        self, dead: DeadLetter, message_id: str, key: bytes | None
    ) -> None:
        assert dead.key == key
        assert dead.text("rowbatch-dlq-topic") == self.t.topic
        partition, offset = message_id.rsplit("/", 2)[1:]
        assert dead.text("rowbatch-dlq-partition") == partition
        assert dead.text("rowbatch-dlq-offset") == offset

    async def assert_consumed(self) -> None:
        t = self.t
        committed, end = await group_offsets(self.endpoint, t.topic, t.group, t.partitions)
        assert committed == end

    def close(self) -> None:
        pass


@pytest.fixture(params=["kafka", "pubsub"])
def broker(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Broker]:
    made: Broker
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        made = KafkaBroker(kafka)
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
        use_emulator(pubsub, monkeypatch)  # the consumer builds its clients from it
        made = PubSubBroker(pubsub)
    try:
        yield made
    finally:
        made.close()


def consumer_config(
    broker: Broker,
    triton: TritonEndpoint,
    model: str,
    sink: dict[str, Any],
    source: dict[str, Any] | None = None,
    **extra: Any,
) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": broker.source(**(source or {})),
            "model": {"url": triton.grpc_url, "name": model, "max_wait_ms": 50},
            "binding": BINDINGS[model],
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
            **extra,
        }
    )


@dataclass
class Run:
    """A consumer running in this process, on ``source`` when given."""

    task: asyncio.Task[None]
    stop: asyncio.Event
    running: list[Running]

    @property
    def registry(self) -> CollectorRegistry:
        return self.running[0].metrics.registry

    async def stop_and_wait(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 60)  # raises what the consumer failed with


@pytest.fixture
async def consumers() -> AsyncIterator[list[Run]]:
    """Consumers started by the test; each is stopped at the end if the test did not."""
    runs: list[Run] = []
    yield runs
    for run in runs:
        run.stop.set()
    for run in runs:
        if not run.task.done():
            await asyncio.wait({run.task}, timeout=60)


async def start(consumers: list[Run], config: ConsumerConfig, source: Source | None = None) -> Run:
    stop = asyncio.Event()
    running: list[Running] = []
    task = asyncio.create_task(run_consumer(config, stop, source=source, on_running=running.append))
    run = Run(task, stop, running)
    consumers.append(run)
    await wait_until(lambda: bool(running), 60, "consumer start", task)
    return run


def written(registry: CollectorRegistry) -> float:
    return registry.get_sample_value("rowbatch_rows_written_total") or 0.0


def records(chunks: Sequence[EncodedChunk]) -> list[tuple[bytes, bytes, list[Header]]]:
    return [chunk_record(c) for c in chunks]


# --- a backlog drains in full batches -----------------------------------------------------------


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("broker", "kind", "total"),
    [
        ("pubsub", "sqlite", 100_000),
        ("pubsub", "postgres", 100_000),
        ("pubsub", "parquet", 100_000),
        ("kafka", "sqlite", 50_000),
    ],
    indirect=["broker"],
)
async def test_a_backlog_drains_into_the_sink_in_full_batches(
    broker: Broker,
    kind: str,
    total: int,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    consumers: list[Run],
    tmp_path: Path,
) -> None:
    """Rows already waiting, in chunks of 1..3,000 rows, alternately JSON and Arrow: every row
    is written once with the model's result, and Triton runs nearly all of them in full
    batches."""
    await broker.prepare(partitions=6)
    table = f"scores_{kind}_{int(time.time() * 1000) % 10**8}"
    sink: dict[str, Any] = {
        "sqlite": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": table},
        "postgres": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
        "parquet": {"kind": "parquet", "url": str(tmp_path / "ds"), "table": table},
    }[kind]
    where = {"sqlite": tmp_path / "r.sqlite", "postgres": postgres.dsn, "parquet": tmp_path / "ds"}[
        kind
    ]
    chunks, expected = scorer_chunks(total, seed=len(kind), max_rows=3000)
    await broker.publish(records(chunks))
    before = triton_batch_rows(triton, "scorer")
    run = await start(consumers, consumer_config(broker, triton, "scorer", sink))
    registry = run.registry
    began = time.monotonic()
    await wait_until(
        lambda: settled(registry) == len(chunks), 300, f"{len(chunks)} settled", run.task
    )
    took = time.monotonic() - began
    await broker.drained(registry, None)
    rate = registry.get_sample_value("rowbatch_rows_per_s_per_replica")
    await run.stop_and_wait()
    assert dead_lettered(registry) == {}
    assert written(registry) == total
    print(
        f"\n{broker.name}, {kind}: {total} rows in {len(chunks)} messages, one consumer: "
        f"{took:.1f} s ({total / took:.0f} rows/s); measured rows/s per replica gauge: {rate}"
    )

    got = read_results(kind, where, table)  # asserts no duplicate ids
    assert set(got) == set(expected)
    for i in (0, 1, total // 2, total - 1):
        assert got[i][0] == pytest.approx(float(expected[i][0]), rel=1e-6)
        assert got[i][1] == int(expected[i][1])
    scores = np.array([got[i][0] for i in range(total)])
    want = np.array([expected[i][0] for i in range(total)], dtype=np.float64)
    np.testing.assert_allclose(scores, want, rtol=1e-6)
    after = triton_batch_rows(triton, "scorer")
    executed = {size: after.get(size, 0) - before.get(size, 0) for size in after}
    assert sum(executed.values()) == total
    # Full batches: 256 (the preferred size, what rowbatch sends), or two requests of 256
    # merged by Triton's dynamic batcher when they arrive together (max_batch_size 512).
    full = sum(rows for size, rows in executed.items() if size >= 256 and size % 256 == 0)
    assert full >= 0.95 * total, f"rows per Triton batch size: {executed}"
    await broker.assert_consumed()


# --- poison, outage (the chaos model: TEXT -> EMBEDDING, faults on demand) ---------------------


@pytest.fixture
def chaos(triton: TritonEndpoint) -> Iterator[TritonEndpoint]:
    ChaosControl().write(triton.chaos_control)
    yield triton
    ChaosControl().write(triton.chaos_control)


@dataclass(frozen=True)
class Poison:
    """A message the consumer must dead-letter, and what the dead letter must say."""

    key: bytes | None
    payload: bytes
    headers: list[Header]
    reason: str
    code: str | None = None
    """``rowbatch-dlq-code``, where the test pins it."""
    names: str | None = None
    """A word ``rowbatch-dlq-message`` must contain (the column at fault)."""


def marked_one_row() -> EncodedChunk:
    """A one-row message the model rejects: dead-lettered whole (a row part of one row would
    be the message itself). Rows rejected among others: ``test_one_bad_row_costs_one_row``."""
    return text_chunk(500, 1, marker_row=0)


def poison_messages(good: Sequence[EncodedChunk], kafka: bool) -> dict[str, Poison]:
    """Every kind of poison, from the good chunks' payloads and headers (``good[0]`` is JSON,
    ``good[1]`` Arrow); a header that is not UTF-8 only on Kafka (Pub/Sub attributes are
    strings)."""
    as_json, as_arrow = good[0], good[1]
    assert as_json.attributes["content-type"] == "application/json"
    wrong_input = encode_chunk(
        "docs",
        {"id": np.arange(3, dtype=np.int64), "text": np.arange(3, dtype=np.int64)},
        "json",
        "wrong-type",
    )
    wrong_passthrough = encode_chunk(
        "docs",
        {"id": [f"id-{i}" for i in range(3)], "text": ["a", "b", "c"]},
        "json",
        "wrong-id",
    )
    no_content_type = [(k, v) for k, v in as_arrow.kafka_headers if k != "content-type"]
    poison = {
        "marker": Poison(*chunk_record(marked_one_row()), "rejected-by-model"),
        "wrong-type": Poison(*chunk_record(wrong_input), "schema-mismatch"),
        "wrong-passthrough-type": Poison(
            *chunk_record(wrong_passthrough),
            "schema-mismatch",
            code="column_type_mismatch",
            names="id",
        ),
        "garbage-json": Poison(b"gj", b"\x00garbage{", as_json.kafka_headers, "undecodable"),
        "garbage": Poison(
            b"garbage", b"\x00garbage{", as_arrow.kafka_headers, "undecodable", "corrupt_arrow"
        ),
        "only-content-type": Poison(
            b"oct", as_arrow.payload, [("content-type", b"application/json")], "undecodable"
        ),
        "no-content-type": Poison(
            b"nct", as_arrow.payload, no_content_type, "undecodable", "missing_header"
        ),
    }
    if kafka:
        bad_header = [*as_arrow.kafka_headers, ("note", b"\xff\xfe not utf-8")]
        # Never reaches the pipeline: the source dead-letters it itself, and it is counted all
        # the same (every dead letter once, whoever sends it).
        poison["bad-header"] = Poison(
            b"bh", as_arrow.payload, bad_header, "undecodable", "invalid_header"
        )
    return poison


@pytest.mark.timeout(300)
async def test_poison_is_dead_lettered_with_its_reason_and_the_rest_written_once(
    broker: Broker, chaos: TritonEndpoint, consumers: list[Run], tmp_path: Path
) -> None:
    await broker.prepare(partitions=3)
    ChaosControl(reject_marker="POISON-ROW").write(chaos.chaos_control)
    good = [text_chunk(n, 10) for n in range(196)]
    poison = poison_messages(good, kafka=broker.name == "kafka")
    await broker.publish(records(good[:100]))
    sent = await broker.publish([(p.key, p.payload, p.headers) for p in poison.values()])
    ids = dict(zip(poison, sent, strict=True))
    await broker.publish(records(good[100:]))
    total = len(good) + len(poison)

    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    run = await start(consumers, consumer_config(broker, chaos, "chaos", sink))
    registry = run.registry
    await wait_until(lambda: settled(registry) == total, 120, f"{total} settled", run.task)
    await broker.drained(registry, None)
    await run.stop_and_wait()
    assert dead_lettered(registry) == Counter(p.reason for p in poison.values())

    dead = await broker.dead_letters(expect=len(poison))
    by_id = {d.text("rowbatch-dlq-message-id"): d for d in dead}
    assert len(dead) == len(poison) == len(by_id), sorted(by_id)
    assert set(by_id) == set(ids.values())
    for name, message_id in ids.items():
        letter, sent_as = by_id[message_id], poison[name]
        assert letter.payload == sent_as.payload, name
        for k, v in sent_as.headers:
            assert letter.headers[k] == v, (name, k)
        assert letter.text("rowbatch-dlq-reason") == sent_as.reason, name
        if sent_as.code is not None:
            assert letter.text("rowbatch-dlq-code") == sent_as.code, name
        assert letter.text("rowbatch-dlq-message"), name
        if sent_as.names is not None:
            assert sent_as.names in letter.text("rowbatch-dlq-message"), name
        if broker.counts_attempts:
            assert letter.text("rowbatch-dlq-delivery-attempt") == "1", name
        broker.assert_dead_letter_origin(letter, message_id, sent_as.key)
    assert by_id[ids["marker"]].text("rowbatch-chunk-id") == "t500"
    assert "rowbatch-parent-chunk-id" not in by_id[ids["marker"]].headers

    rows = read_embeddings(tmp_path / "r.sqlite", "emb")
    assert set(rows) == {(f"t{n}", r) for n in range(196) for r in range(10)}
    for (chunk, r), (row_id, blob) in list(rows.items())[:50]:
        n = int(chunk[1:])
        assert row_id == n * 1000 + r
        want = embed(f"message {n} row {r} ✓")
        assert np.array_equal(np.frombuffer(blob, "<f4"), want)
    await broker.assert_consumed()


def marked_chunk(n: int, rows: int, marked: Sequence[int]) -> EncodedChunk:
    texts = [f"message {n} row {r} ✓" + (" POISON-ROW" if r in marked else "") for r in range(rows)]
    ids = np.arange(n * 1000, n * 1000 + rows, dtype=np.int64)
    return encode_chunk("docs", {"id": ids, "text": texts}, "arrow" if n % 2 else "json", f"t{n}")


def triton_requests(triton: TritonEndpoint, model: str) -> int:
    """Requests Triton answered for ``model`` so far, successes and failures (its own
    statistics)."""
    stats = server_stats(triton.grpc_url, model)
    return stats.requests + stats.failed


@pytest.mark.timeout(300)
async def test_one_bad_row_costs_one_row(
    broker: Broker, chaos: TritonEndpoint, consumers: list[Run], tmp_path: Path
) -> None:
    """500-row messages, a few of whose rows the model rejects (marked): exactly the marked
    rows are dead-lettered, as row parts of their messages (a valid chunk of just those rows,
    naming its parent and their indexes there), every other row is written once, every message
    is acked, and Triton answered no more requests than the stated bound; the parts replayed
    once the model takes them write their rows under the original keys."""
    await broker.prepare(partitions=3)
    ChaosControl(reject_marker="POISON-ROW").write(chaos.chaos_control)
    marked = {3: [17], 11: [0, 499], 16: [250]}
    chunks = [marked_chunk(n, 500, marked.get(n, [])) for n in range(20)]
    bad_rows = sum(len(rows) for rows in marked.values())
    before = triton_requests(chaos, "chaos")
    await broker.publish(records(chunks))

    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    run = await start(consumers, consumer_config(broker, chaos, "chaos", sink))
    registry = run.registry
    await wait_until(lambda: settled(registry) == len(chunks), 120, "all settled", run.task)
    await broker.drained(registry, None)
    requests = triton_requests(chaos, "chaos") - before
    await run.stop_and_wait()
    assert dead_lettered(registry) == {}  # no message dead-lettered whole
    assert (
        registry.get_sample_value(
            "rowbatch_rows_dead_lettered_total", {"reason": "rejected-by-model"}
        )
        == bad_rows
    )
    # Bound (inference_stage.py): the clean run's batches (at most one more per message
    # boundary), per bad batch the message-level isolation of its <= 3 segments
    # (1 + 2 x 2 + 1), per bad message 1 + 2k x ceil(log2 500) + k for its k bad rows.
    clean = -(-500 * len(chunks) // 256) + len(chunks)
    bound = clean + sum(6 + 1 + 2 * len(rows) * 9 + len(rows) for rows in marked.values())
    print(f"\n{broker.name}: {requests} requests for {len(chunks)} messages, bound {bound}")
    assert requests <= bound

    letters = await broker.dead_letters(expect=len(marked))
    by_parent = {d.text("rowbatch-parent-chunk-id"): d for d in letters}
    assert set(by_parent) == {f"t{n}" for n in marked}
    for n, rows in marked.items():
        letter = by_parent[f"t{n}"]
        assert letter.text("rowbatch-parent-rows") == ",".join(map(str, rows))
        assert letter.text("rowbatch-dlq-reason") == "rejected-by-model"
        assert letter.text("rowbatch-row-count") == str(len(rows))
        part = decode_chunk(letter.payload, {k: v.decode() for k, v in letter.headers.items()})
        assert [str(t).endswith(" POISON-ROW") for t in part.columns["text"]] == [True] * len(rows)
        assert part.columns["id"].tolist() == [n * 1000 + r for r in rows]
    got = read_embeddings(tmp_path / "r.sqlite", "emb")  # asserts each key once
    want = {(f"t{n}", r) for n in range(len(chunks)) for r in range(500)}
    bad = {(f"t{n}", r) for n, rows in marked.items() for r in rows}
    assert set(got) == want - bad

    # The model fixed, the parts replayed as ``dlq replay`` sends them (their headers, less
    # the rowbatch-dlq-* ones): their rows land under the original keys.
    ChaosControl().write(chaos.chaos_control)
    await broker.publish(
        [
            (
                d.key,
                d.payload,
                [(k, v) for k, v in d.headers.items() if not k.startswith("rowbatch-dlq-")],
            )
            for d in letters
        ]
    )
    run = await start(consumers, consumer_config(broker, chaos, "chaos", sink))
    await wait_until(
        lambda: settled(run.registry) == len(marked), 120, "the parts settled", run.task
    )
    await run.stop_and_wait()
    got = read_embeddings(tmp_path / "r.sqlite", "emb")
    assert set(got) == want
    for chunk, r in bad:
        n = int(chunk[1:])
        assert got[(chunk, r)][0] == n * 1000 + r
        assert np.array_equal(
            np.frombuffer(got[(chunk, r)][1], "<f4"), embed(f"message {n} row {r} ✓ POISON-ROW")
        )


@pytest.mark.timeout(300)
async def test_rows_failing_the_input_checks_cost_their_rows(
    broker: Broker, chaos: TritonEndpoint, consumers: list[Run], tmp_path: Path
) -> None:
    """500-row messages (JSON and Arrow), a few rows with a null text where the model takes
    none: those rows are set apart at intake and dead-lettered as row parts (schema-mismatch,
    null_not_allowed, naming their row), never sent to Triton (no isolation requests: the
    clean run's count), every other row written once, no message dead-lettered whole."""
    await broker.prepare(partitions=3)
    nulls = {2: [0], 5: [7, 8, 499], 12: [300]}
    chunks = []
    for n in range(16):
        texts = [f"message {n} row {r} ✓" for r in range(500)]
        ids = np.arange(n * 1000, n * 1000 + 500, dtype=np.int64)
        mask = np.zeros(500, dtype=np.bool_)
        mask[nulls.get(n, [])] = True
        chunks.append(
            encode_chunk(
                "docs",
                {"id": ids, "text": texts},
                "arrow" if n % 2 else "json",
                f"t{n}",
                null_masks={"text": mask},
            )
        )
    bad_rows = sum(len(rows) for rows in nulls.values())
    failed_before = server_stats(chaos.grpc_url, "chaos").failed
    await broker.publish(records(chunks))

    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    run = await start(consumers, consumer_config(broker, chaos, "chaos", sink))
    registry = run.registry
    await wait_until(lambda: settled(registry) == len(chunks), 120, "all settled", run.task)
    await broker.drained(registry, None)
    failed = server_stats(chaos.grpc_url, "chaos").failed - failed_before
    await run.stop_and_wait()
    assert dead_lettered(registry) == {}  # no message dead-lettered whole
    assert (
        registry.get_sample_value(
            "rowbatch_rows_dead_lettered_total", {"reason": "schema-mismatch"}
        )
        == bad_rows
    )
    assert failed == 0  # the null rows never reached Triton: no request failed, no isolation
    letters = await broker.dead_letters(expect=len(nulls))
    by_parent = {d.text("rowbatch-parent-chunk-id"): d for d in letters}
    assert set(by_parent) == {f"t{n}" for n in nulls}
    for n, rows in nulls.items():
        letter = by_parent[f"t{n}"]
        assert letter.text("rowbatch-parent-rows") == format_rows(rows)
        assert letter.text("rowbatch-dlq-reason") == "schema-mismatch"
        assert letter.text("rowbatch-dlq-code") == "null_not_allowed"
        assert f"row {rows[0]} is null" in letter.text("rowbatch-dlq-message")
        part = decode_chunk(letter.payload, {k: v.decode() for k, v in letter.headers.items()})
        assert part.columns["id"].tolist() == [n * 1000 + r for r in rows]
    got = read_embeddings(tmp_path / "r.sqlite", "emb")  # asserts each key once
    want = {(f"t{n}", r) for n in range(len(chunks)) for r in range(500)}
    assert set(got) == want - {(f"t{n}", r) for n, rows in nulls.items() for r in rows}


@pytest.mark.timeout(300)
async def test_rows_postgresql_refuses_cost_their_rows_only(
    broker: Broker, chaos: TritonEndpoint, consumers: list[Run], postgres: PostgresEndpoint
) -> None:
    """A CHECK constraint added to the result table refuses one row of each 500-row message:
    the write is bisected down to those rows, each dead-lettered as a row part
    (rejected-by-sink, PostgreSQL's words in the message), every other row written once."""
    await broker.prepare(partitions=3)
    table = f"rows_refused_{broker.name}_{int(time.time() * 1000)}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    run = await start(consumers, consumer_config(broker, chaos, "chaos", sink))
    await wait_until(lambda: table_exists(postgres.dsn, table), 60, "the table", run.task)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT no_123 CHECK (id % 1000 <> 123)")
    chunks = [marked_chunk(n, 500, []) for n in range(10)]
    await broker.publish(records(chunks))
    registry = run.registry
    await wait_until(lambda: settled(registry) == len(chunks), 120, "all settled", run.task)
    await broker.drained(registry, None)
    await run.stop_and_wait()
    assert dead_lettered(registry) == {}
    assert registry.get_sample_value(
        "rowbatch_rows_dead_lettered_total", {"reason": "rejected-by-sink"}
    ) == len(chunks)
    letters = await broker.dead_letters(expect=len(chunks))
    assert {d.text("rowbatch-parent-chunk-id") for d in letters} == {f"t{n}" for n in range(10)}
    for letter in letters:
        assert letter.text("rowbatch-parent-rows") == "123"
        assert letter.text("rowbatch-dlq-reason") == "rejected-by-sink"
        assert "no_123" in letter.text("rowbatch-dlq-message")
    with psycopg.connect(postgres.dsn) as conn:
        ids = [i for (i,) in conn.execute(f"SELECT id FROM {table}").fetchall()]
    assert len(ids) == len(set(ids)) == 10 * 499
    assert set(ids) == {n * 1000 + r for n in range(10) for r in range(500) if r != 123}


@pytest.mark.timeout(300)
async def test_json_rows_that_do_not_decode_cost_their_rows(
    broker: Broker, triton: TritonEndpoint, consumers: list[Run], tmp_path: Path
) -> None:
    """JSON messages of 100 rows for the ``scorer`` model (a vector[float32,16] input), a few
    rows of which hold 15 numbers: those rows are dead-lettered as row parts holding their
    values as sent (undecodable, column_type_mismatch, the row named), every other row scored
    by Triton and written once, no message dead-lettered whole."""
    await broker.prepare(partitions=3)
    short = {1: [0], 3: [50, 99]}
    rng = np.random.default_rng(5)
    records_: list[tuple[bytes | None, bytes, list[Header]]] = []
    for n in range(6):
        ids = np.arange(n * 1000, n * 1000 + 100, dtype=np.int64)
        features = rng.normal(size=(100, 16)).astype(np.float32)
        good = encode_chunk(
            "events",
            {"id": ids, "features": features, "count": np.ones(100, np.int64)},
            "json",
            f"j{n}",
        )
        doc = json.loads(good.payload)
        for entry in doc["columns"]:
            if entry["name"] == "features":
                for r in short.get(n, []):
                    entry["values"][r] = entry["values"][r][:15]
        key, _, headers = chunk_record(good)
        records_.append((key, json.dumps(doc).encode(), headers))
    await broker.publish(records_)
    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"}
    run = await start(consumers, consumer_config(broker, triton, "scorer", sink))
    registry = run.registry
    await wait_until(lambda: settled(registry) == 6, 120, "all settled", run.task)
    await broker.drained(registry, None)
    await run.stop_and_wait()
    assert dead_lettered(registry) == {}
    letters = await broker.dead_letters(expect=len(short))
    by_parent = {d.text("rowbatch-parent-chunk-id"): d for d in letters}
    assert set(by_parent) == {f"j{n}" for n in short}
    for n, rows in short.items():
        letter = by_parent[f"j{n}"]
        assert letter.text("rowbatch-parent-rows") == format_rows(rows)
        assert letter.text("rowbatch-dlq-reason") == "undecodable"
        assert letter.text("rowbatch-dlq-code") == "column_type_mismatch"
        assert f"row {rows[0]} has 15 elements" in letter.text("rowbatch-dlq-message")
        columns = {c["name"]: c["values"] for c in json.loads(letter.payload)["columns"]}
        assert columns["id"] == [n * 1000 + r for r in rows]
        assert [len(v) for v in columns["features"]] == [15] * len(rows)
    got = read_results("sqlite", tmp_path / "r.sqlite", "scores")
    bad = {n * 1000 + r for n, rows in short.items() for r in rows}
    assert set(got) == {n * 1000 + r for n in range(6) for r in range(100)} - bad


@pytest.mark.timeout(300)
async def test_error_rows_land_in_postgresql_beside_their_siblings(
    broker: Broker, chaos: TritonEndpoint, consumers: list[Run], postgres: PostgresEndpoint
) -> None:
    """``on_row_error = "error-row"``: rows Triton rejects (marked) and rows failing the input
    checks (a null text) are written to PostgreSQL with a null embedding and the error
    columns, their siblings as usual; nothing is dead-lettered, every row is in the table
    once."""
    await broker.prepare(partitions=3)
    ChaosControl(reject_marker="POISON-ROW").write(chaos.chaos_control)
    marked = {1: [42], 4: [0, 499]}
    nulls = {6: [7]}
    chunks = []
    for n in range(8):
        chunk = marked_chunk(n, 500, marked.get(n, []))
        if n in nulls:
            mask = np.zeros(500, dtype=np.bool_)
            mask[nulls[n]] = True
            texts = [f"message {n} row {r} ✓" for r in range(500)]
            ids = np.arange(n * 1000, n * 1000 + 500, dtype=np.int64)
            chunk = encode_chunk(
                "docs", {"id": ids, "text": texts}, "json", f"t{n}", null_masks={"text": mask}
            )
        chunks.append(chunk)
    table = f"error_rows_{broker.name}_{int(time.time() * 1000)}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table, "on_row_error": "error-row"}
    await broker.publish(records(chunks))
    run = await start(consumers, consumer_config(broker, chaos, "chaos", sink))
    registry = run.registry
    await wait_until(lambda: settled(registry) == len(chunks), 120, "all settled", run.task)
    await broker.drained(registry, None)
    await run.stop_and_wait()
    ChaosControl().write(chaos.chaos_control)
    assert dead_lettered(registry) == {}
    for reason, count in (("rejected-by-model", 3), ("schema-mismatch", 1)):
        labels = {"reason": reason}
        assert registry.get_sample_value("rowbatch_rows_errored_total", labels) == count
        assert registry.get_sample_value("rowbatch_rows_dead_lettered_total", labels) == 0
    with psycopg.connect(postgres.dsn) as conn:
        got = conn.execute(
            f"SELECT chunk_id, row_index, id, embedding IS NULL, error_reason, error_code, "
            f"error_message FROM {table}"
        ).fetchall()
    assert len(got) == len({(c, r) for c, r, *_ in got}) == 8 * 500
    errors = {
        (c, r): (i, null, reason, code, words)
        for c, r, i, null, reason, code, words in got
        if reason
    }
    want_rejected = {(f"t{n}", r) for n, rows in marked.items() for r in rows}
    assert set(errors) == want_rejected | {("t6", 7)}
    for key in want_rejected:
        _, null, reason, _, words = errors[key]
        assert null and reason == "rejected-by-model" and words
    assert errors[("t6", 7)][1:4] == (True, "schema-mismatch", "null_not_allowed")
    assert errors[("t6", 7)][0] == 6007  # the passthrough column kept
    assert all(not null for c, r, _, null, reason, *_ in got if not reason)


def table_exists(dsn: str, table: str) -> bool:
    with psycopg.connect(dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    return found is not None and found[0] is not None


@pytest.mark.timeout(300)
async def test_a_20_s_server_outage_pauses_within_budget_and_loses_nothing(
    broker: Broker, chaos: TritonEndpoint, consumers: list[Run], tmp_path: Path
) -> None:
    """The model answers UNAVAILABLE for 20 s while 20,000 rows wait: consumption pauses
    (Kafka: the partitions are paused, polling goes on, and the member keeps its partitions
    although the outage is longer than session_timeout_ms=6 s and max_poll_interval_ms=10 s),
    memory in flight stays inside the 32 MiB budget, nothing is dead-lettered and nothing is
    lost."""
    await broker.prepare(partitions=3)
    ChaosControl(delay_s=0.05).write(chaos.chaos_control)
    chunks = [text_chunk(n, 100) for n in range(200)]  # 20,000 rows
    await broker.publish(records(chunks[: broker.outage_head]))
    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    budget = 32 * 1024 * 1024
    config = consumer_config(
        broker, chaos, "chaos", sink, source=broker.outage_source, budget_bytes=budget
    )
    source = broker.source_for_run(config)
    run = await start(consumers, config, source)
    registry = run.registry
    await wait_until(lambda: written(registry) >= 1000, 60, "first rows", run.task)
    broker.assert_member(source)

    outage_s = 20.0
    ChaosControl(unavailable_until=time.time() + outage_s, delay_s=0.05).write(chaos.chaos_control)
    started_at = time.monotonic()
    await broker.publish(records(chunks[broker.outage_head :]))
    peak_inflight, paused_for = 0.0, 0.0
    last = time.monotonic()
    while settled(registry) < len(chunks):
        assert not run.task.done(), "consumer stopped"
        now = time.monotonic()
        if registry.get_sample_value("rowbatch_paused", {"why": "backoff"}) == 1:
            broker.assert_paused(source)
            paused_for += now - last
        last = now
        peak_inflight = max(
            peak_inflight, registry.get_sample_value("rowbatch_inflight_bytes") or 0.0
        )
        assert now - started_at < 180, "not finished 180 s after the outage began"
        await asyncio.sleep(0.1)
    assert time.monotonic() - started_at >= outage_s * 0.9
    assert paused_for >= 10, f"paused for backoff only {paused_for:.1f} s of the outage"
    broker.assert_member(source)
    assert (registry.get_sample_value("rowbatch_backoff_periods_total") or 0) >= 1
    assert dead_lettered(registry) == {}
    assert peak_inflight <= budget
    await broker.drained(registry, source)
    await run.stop_and_wait()
    assert written(registry) == 20_000
    await broker.assert_consumed()
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        assert conn.execute("SELECT count(DISTINCT id), count(*) FROM emb").fetchone() == (
            20_000,
            20_000,
        )
    assert len(read_embeddings(tmp_path / "r.sqlite", "emb")) == 20_000
    print(
        f"\n{broker.name}, 20 s outage: paused {paused_for:.1f} s, peak in flight "
        f"{peak_inflight / 2**20:.1f} MiB of {budget / 2**20:.0f} MiB"
    )
