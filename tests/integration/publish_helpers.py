"""Shared by the publishing integration tests: a 100,000-row table written as CSV or Parquet, the
CLI run in-process, an exact comparison of decoded messages with the table, and each broker
behind one adapter (:class:`PublishBroker`: topics, the CLI's broker options, and a reader of
what was published, independent of rowbatch: aiokafka's own consumer, google-cloud-pubsub's
own streaming pull)."""

from __future__ import annotations

import asyncio
import io
import json
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from google.cloud import pubsub_v1
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from harness.kafka import KafkaEndpoint, create_topic
from harness.pubsub import PubSubEndpoint
from rowbatch.producer.cli.main import main
from rowbatch.wire.chunks.decode import decode_chunk

ROWS = 100_000
DIM = 4
SCHEMA = f"id:int64,text:string,score:float64,flag:bool,emb:vector[float32,{DIM}]"
REQUIRED_HEADERS = {
    "rowbatch-format-version",
    "content-type",
    "rowbatch-chunk-id",
    "rowbatch-table",
    "rowbatch-row-count",
    "rowbatch-produced-at",
}


def make_table(n: int = ROWS, *, text_nulls: bool = False) -> pa.Table:
    """``id`` 0..n-1, Unicode text (quotes, commas, newlines, empty strings), float64 with nulls,
    bool, and a float32 vector column; deterministic."""
    rng = np.random.default_rng(2024)
    ids = np.arange(n, dtype=np.int64)
    words = np.array(["tea", "coffee", "ünïcødé ✓", 'say "hi"', "a,b", "two\nlines", "日本"])
    picks = rng.integers(0, len(words), size=(n, 3))
    text: list[str | None] = [
        "" if i % 97 == 0 else f"{i}: " + " ".join(words[p]) for i, p in enumerate(picks)
    ]
    if text_nulls:
        text = [None if i % 13 == 0 else t for i, t in enumerate(text)]
    score = rng.standard_normal(n) * 1e3
    emb = rng.standard_normal((n, DIM)).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "text": pa.array(text, type=pa.string()),
            "score": pa.array(score, mask=ids % 17 == 5),
            "flag": ids % 3 == 0,
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM),
        }
    )


def write_file(table: pa.Table, path: Path) -> Path:
    """CSV (vectors as JSON arrays in text cells) or Parquet, by the suffix."""
    if path.suffix == ".parquet":
        pq.write_table(table, path)
        return path
    emb = table.column("emb").combine_chunks()
    flat = emb.flatten().to_numpy().reshape(-1, DIM)
    cells = [json.dumps([float(v) for v in row]) for row in flat]
    csv_table = table.set_column(table.schema.get_field_index("emb"), "emb", pa.array(cells))
    pcsv.write_csv(csv_table, path)
    return path


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    @property
    def rows_per_s(self) -> float:
        match = re.search(r"= ([\d,]+) rows/s", self.out)
        return float(match[1].replace(",", "")) if match else 0.0

    @property
    def id_prefix(self) -> str:
        match = re.search(r"chunk ids (\S+):N\)", self.out)
        assert match, self.out
        return match[1]


def run_cli(argv: Sequence[str]) -> CliRun:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return CliRun(code, out.getvalue(), err.getvalue())


def decoded_rows(
    messages: Iterable[tuple[bytes, Mapping[str, str]]],
) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]], list[str]]:
    """Decodes every message; returns columns and null masks in ``id`` order, and chunk ids."""
    values: dict[str, list[np.ndarray[Any, Any]]] = {}
    nulls: dict[str, list[np.ndarray[Any, Any]]] = {}
    chunk_ids = []
    for payload, attributes in messages:
        assert set(attributes) >= REQUIRED_HEADERS, sorted(attributes)
        chunk = decode_chunk(payload, attributes)
        chunk_ids.append(chunk.chunk_id)
        for name, column in chunk.columns.items():
            values.setdefault(name, []).append(np.asarray(column))
            mask = chunk.null_masks.get(name)
            nulls.setdefault(name, []).append(
                np.zeros(chunk.row_count, np.bool_) if mask is None else np.asarray(mask)
            )
    order = np.argsort(np.concatenate(values["id"]), kind="stable")
    return (
        {name: np.concatenate(parts)[order] for name, parts in values.items()},
        {name: np.concatenate(parts)[order] for name, parts in nulls.items()},
        chunk_ids,
    )


def assert_rows_equal(
    table: pa.Table, columns: Mapping[str, np.ndarray[Any, Any]], nulls: Mapping[str, Any]
) -> None:
    """Every row and column exactly as in ``table``: same ids (no loss, no duplicates), the
    same bits for floats, the same nulls."""
    assert list(columns) == table.column_names
    assert columns["id"].tolist() == table.column("id").to_pylist()
    for name in table.column_names:
        expected = table.column(name).combine_chunks()
        mask = np.asarray(expected.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
        assert np.array_equal(nulls[name], mask), name
        got = columns[name]
        if pa.types.is_fixed_size_list(expected.type):
            want = expected.flatten().to_numpy().reshape(len(expected), -1)
            assert got.dtype == np.float32
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
        elif pa.types.is_floating(expected.type):
            want = expected.fill_null(0.0).to_numpy()
            assert got.dtype == want.dtype
            assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), name
        else:
            want_list = expected.to_pylist()
            got_list = [None if m else v for v, m in zip(got.tolist(), mask, strict=True)]
            assert got_list == want_list, name


async def run_cli_async(*argv: str) -> CliRun:
    """:func:`run_cli` off the event loop (the CLI runs a loop of its own)."""
    return await asyncio.to_thread(run_cli, argv)


# --- each broker behind one adapter ------------------------------------------------------------

READ_WAIT_S = 60.0
"""How long a reader waits for what it expects."""


@dataclass
class Received:
    """One message as the broker's own client read it back."""

    data: bytes
    attributes: dict[str, str]
    """Pub/Sub attributes, or Kafka headers as docs/wire-format.md maps them (names as they
    are, values UTF-8)."""
    ordering_key: str
    """Pub/Sub's ordering key; Kafka's record key (the ordering key, else the chunk id)."""
    partition: int | None = None
    """Kafka's partition; None on Pub/Sub."""


class PublishBroker(Protocol):
    """One broker as the publishing tests see it."""

    name: str
    partitioned: bool
    """Kafka: records have a key (the chunk id unless an ordering key is given) and chunks
    spread over the topic's partitions."""

    def options(self) -> list[str]:
        """The CLI's options that name this broker."""
        ...

    async def topic(
        self, stem: str, *, partitions: int = 1, max_message_bytes: int | None = None
    ) -> str:
        """A fresh topic (with a subscription, on Pub/Sub); returns what ``--topic`` takes.
        ``max_message_bytes``: the topic's own limit, where the broker has one (Kafka)."""
        ...

    async def read(
        self, topic: str, *, rows: int | None = None, count: int | None = None
    ) -> list[Received]:
        """Everything published to ``topic``, until ``rows`` rows (by their headers) or
        ``count`` messages came, and a check (or a moment's wait) that nothing more is there."""
        ...

    async def publish_raw(
        self, topic: str, messages: Sequence[tuple[bytes, dict[str, str]]]
    ) -> None:
        """Publishes with the broker's own client, no rowbatch code."""
        ...

    def missing_topic(self) -> tuple[str, str]:
        """A topic that does not exist, as ``--topic`` takes it, and what the error says."""
        ...

    def unreachable(self, address: str) -> tuple[list[str], list[str]]:
        """The options that point the CLI at ``address`` (nothing listens there) with topic
        ``rows``, and what the one-line error must say."""
        ...


def kafka_attributes(headers: Any) -> dict[str, str]:
    """Kafka headers as the doc maps them: names as they are, values UTF-8."""
    return {key: value.decode("utf-8") for key, value in headers}


@dataclass
class KafkaPublishBroker:
    endpoint: KafkaEndpoint
    name: str = "kafka"
    partitioned: bool = True

    def options(self) -> list[str]:
        return ["--broker", "kafka", "--bootstrap", self.endpoint.bootstrap_servers]

    async def topic(
        self, stem: str, *, partitions: int = 1, max_message_bytes: int | None = None
    ) -> str:
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        configs = (
            None if max_message_bytes is None else {"max.message.bytes": str(max_message_bytes)}
        )
        await create_topic(self.endpoint, name, partitions, configs=configs)
        return name

    async def read(
        self, topic: str, *, rows: int | None = None, count: int | None = None
    ) -> list[Received]:
        records = await self.records(topic, rows=rows, count=count)
        return [
            Received(
                r.value,
                kafka_attributes(r.headers),
                r.key.decode() if r.key is not None else "",
                r.partition,
            )
            for r in records
        ]

    async def records(
        self, topic: str, *, rows: int | None = None, count: int | None = None
    ) -> list[Any]:
        """Every record of ``topic`` (until ``rows`` rows or ``count`` records have come), read
        by a fresh consumer group from the start; checks nothing more is there."""
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=self.endpoint.bootstrap_servers,
            group_id=f"check-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            max_partition_fetch_bytes=20 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )
        await consumer.start()
        try:
            records: list[Any] = []
            seen_rows = 0
            async with asyncio.timeout(READ_WAIT_S):
                while (rows is not None and seen_rows < rows) or (
                    count is not None and len(records) < count
                ):
                    batches = await consumer.getmany(timeout_ms=500)
                    for batch in batches.values():
                        for record in batch:
                            records.append(record)
                            row_count = kafka_attributes(record.headers).get(
                                "rowbatch-row-count", "0"
                            )
                            seen_rows += int(row_count) if row_count.isdigit() else 0
            end = await consumer.end_offsets(list(consumer.assignment()))
            assert sum(end.values()) == len(records), "more records than expected"
            return records
        finally:
            await consumer.stop()

    async def publish_raw(
        self, topic: str, messages: Sequence[tuple[bytes, dict[str, str]]]
    ) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=self.endpoint.bootstrap_servers, acks="all")
        await producer.start()
        try:
            for payload, attributes in messages:
                headers = [(k, v.encode("utf-8")) for k, v in attributes.items()]
                await producer.send_and_wait(topic, payload, headers=headers)
        finally:
            await producer.stop()

    def missing_topic(self) -> tuple[str, str]:
        name = f"missing-{uuid.uuid4().hex[:8]}"
        return name, f"Kafka topic {name!r} does not exist on {self.endpoint.bootstrap_servers}"

    def unreachable(self, address: str) -> tuple[list[str], list[str]]:
        options = ["--broker", "kafka", "--bootstrap", address, "--topic", "rows"]
        return [*options, "--connect-timeout", "5"], [f"cannot reach Kafka at {address}", "'rows'"]


_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@dataclass
class PubSubPublishBroker:
    endpoint: PubSubEndpoint
    publisher: pubsub_v1.PublisherClient
    subscriber: pubsub_v1.SubscriberClient
    name: str = "pubsub"
    partitioned: bool = False

    @classmethod
    def open(cls, endpoint: PubSubEndpoint) -> PubSubPublishBroker:
        # A streaming-pull response can hold many big messages: lift gRPC's 4 MB receive
        # limit, as the client does for its own channels (the emulator, unlike Pub/Sub, does
        # not cap them).
        channel = grpc.insecure_channel(endpoint.host, options=_UNLIMITED)
        subscriber = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
        return cls(endpoint, endpoint.publisher(), subscriber)

    def close(self) -> None:
        self.publisher.transport.close()
        self.subscriber.close()

    def options(self) -> list[str]:
        e = self.endpoint
        return ["--broker", "pubsub", "--emulator-host", e.host, "--project", e.project]

    def path(self, topic: str) -> str:
        return f"projects/{self.endpoint.project}/topics/{topic}"

    def subscription(self, topic: str) -> str:
        return f"projects/{self.endpoint.project}/subscriptions/{topic}"

    async def topic(
        self, stem: str, *, partitions: int = 1, max_message_bytes: int | None = None
    ) -> str:
        """A topic and a subscription of the same name, with message ordering (Pub/Sub has
        no partitions, and no per-topic limit: ``max_message_bytes`` is ignored)."""
        name = f"{stem}-{uuid.uuid4().hex[:8]}"

        def create() -> None:
            self.publisher.create_topic(name=self.path(name))
            self.subscriber.create_subscription(
                request={
                    "name": self.subscription(name),
                    "topic": self.path(name),
                    "ack_deadline_seconds": 60,
                    "enable_message_ordering": True,
                }
            )

        await asyncio.to_thread(create)
        return name

    async def read(
        self, topic: str, *, rows: int | None = None, count: int | None = None
    ) -> list[Received]:
        return await asyncio.to_thread(self.pull, topic, rows=rows, count=count)

    def pull(
        self, topic: str, *, rows: int | None = None, count: int | None = None
    ) -> list[Received]:
        """Streaming pull until ``rows`` rows (by their headers) or ``count`` messages came,
        then a moment more to see that nothing else arrives."""
        received: list[Received] = []
        lock = threading.Lock()
        enough = threading.Event()
        seen_rows = 0

        def on_message(message: pubsub_v1.subscriber.message.Message) -> None:
            nonlocal seen_rows
            with lock:
                attributes = dict(message.attributes)
                received.append(Received(message.data, attributes, message.ordering_key))
                seen_rows += int(attributes.get("rowbatch-row-count", "0") or 0)
                if (rows is not None and seen_rows >= rows) or (
                    count is not None and len(received) >= count
                ):
                    enough.set()
            message.ack()

        flow = pubsub_v1.types.FlowControl(max_messages=1000, max_bytes=500 * 1024 * 1024)
        streaming = self.subscriber.subscribe(
            self.subscription(topic), callback=on_message, flow_control=flow
        )
        try:
            assert enough.wait(READ_WAIT_S), f"only {len(received)} messages ({seen_rows} rows)"
            time.sleep(0.5)
        finally:
            streaming.cancel()
            streaming.result(timeout=READ_WAIT_S)
        return received

    async def publish_raw(
        self, topic: str, messages: Sequence[tuple[bytes, dict[str, str]]]
    ) -> None:
        def send() -> None:
            for payload, attributes in messages:
                self.publisher.publish(self.path(topic), payload, **attributes).result(
                    timeout=READ_WAIT_S
                )

        await asyncio.to_thread(send)

    def missing_topic(self) -> tuple[str, str]:
        name = f"no-such-topic-{uuid.uuid4().hex[:8]}"
        return name, f"Pub/Sub topic {self.path(name)!r} does not exist"

    def unreachable(self, address: str) -> tuple[list[str], list[str]]:
        options = ["--broker", "pubsub", "--emulator-host", address, "--project", "p1"]
        return (
            [*options, "--topic", "rows", "--connect-timeout", "2"],
            [f"cannot reach Pub/Sub at {address}", "projects/p1/topics/rows"],
        )


def kafka_publish_broker(endpoint: KafkaEndpoint) -> Iterator[KafkaPublishBroker]:
    """For a fixture: the Kafka adapter (nothing to close)."""
    yield KafkaPublishBroker(endpoint)


def pubsub_publish_broker(endpoint: PubSubEndpoint) -> Iterator[PubSubPublishBroker]:
    """For a fixture: the Pub/Sub adapter, its clients closed afterwards."""
    broker = PubSubPublishBroker.open(endpoint)
    try:
        yield broker
    finally:
        broker.close()
