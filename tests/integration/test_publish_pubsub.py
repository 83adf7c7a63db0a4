"""Publishing to the Pub/Sub emulator with the CLI, read back with google-cloud-pubsub's own
streaming pull: a 100,000-row file arrives exactly (CSV as JSON, Parquet as Arrow), chunks are
split under a limit (also near the real 10 MB one), errors are one clear line, and a message
built by hand as the wire-format doc says (raw client, no rowbatch code) decodes with rowbatch."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pyarrow as pa
import pytest
from google.cloud import pubsub_v1
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from rowbatch.producer.publishers.pubsub import PubSubPublisher
from rowbatch.producer.publishers.splitting import publish_rows
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.split import PUBSUB_MAX_MESSAGE_BYTES
from tests.integration.publish_helpers import (
    ROWS,
    SCHEMA,
    assert_rows_equal,
    decoded_rows,
    make_table,
    run_cli,
    write_file,
)

_WAIT_S = 60.0
_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


@dataclass
class Received:
    data: bytes
    attributes: dict[str, str]
    ordering_key: str


@dataclass
class Topic:
    path: str
    subscription: str
    name: str


@pytest.fixture
def clients(
    pubsub: PubSubEndpoint,
) -> Iterator[tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]]:
    # A streaming-pull response can hold many big messages: lift gRPC's 4 MB receive limit, as
    # the client does for its own channels (the emulator, unlike Pub/Sub, does not cap them).
    channel = grpc.insecure_channel(pubsub.host, options=_UNLIMITED)
    subscriber = pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))
    publisher = pubsub.publisher()
    yield publisher, subscriber
    publisher.transport.close()
    subscriber.close()


@pytest.fixture
def make_topic(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
) -> Callable[[str], Topic]:
    publisher, subscriber = clients

    def make(stem: str) -> Topic:
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        topic = f"projects/{pubsub.project}/topics/{name}"
        subscription = f"projects/{pubsub.project}/subscriptions/{name}"
        publisher.create_topic(name=topic)
        subscriber.create_subscription(
            request={
                "name": subscription,
                "topic": topic,
                "ack_deadline_seconds": 60,
                "enable_message_ordering": True,
            }
        )
        return Topic(topic, subscription, name)

    return make


def _pull(
    subscriber: pubsub_v1.SubscriberClient,
    subscription: str,
    *,
    rows: int | None = None,
    count: int | None = None,
) -> list[Received]:
    """Streaming pull until ``rows`` rows (by their headers) or ``count`` messages came, then
    a moment more to see that nothing else arrives."""
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
    streaming = subscriber.subscribe(subscription, callback=on_message, flow_control=flow)
    try:
        assert enough.wait(_WAIT_S), f"only {len(received)} messages ({seen_rows} rows) came"
        time.sleep(0.5)
    finally:
        streaming.cancel()
        streaming.result(timeout=_WAIT_S)
    return received


def _broker(pubsub: PubSubEndpoint) -> list[str]:
    return ["--broker", "pubsub", "--emulator-host", pubsub.host, "--project", pubsub.project]


@pytest.mark.parametrize(
    ("suffix", "encoding"),
    [(".csv", "json"), (".parquet", "arrow")],
    ids=["csv-json", "parquet-arrow"],
)
def test_publish_a_100k_row_file_and_read_every_row_back(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
    make_topic: Callable[[str], Topic],
    tmp_path: Path,
    suffix: str,
    encoding: str,
) -> None:
    topic = make_topic("rows")
    table = make_table(text_nulls=suffix == ".parquet")
    path = write_file(table, tmp_path / f"orders{suffix}")
    run = run_cli(
        [
            "publish",
            *_broker(pubsub),
            "--topic",
            topic.name,
            "--file",
            str(path),
            "--chunk-rows",
            "1000",
            "--encoding",
            encoding,
            "--table",
            "orders",
            "--schema",
            SCHEMA,
        ]
    )
    assert run.code == 0, run.err
    assert run.out.startswith(f"published: {ROWS:,} rows, 100 chunks, ")
    print(f"\npubsub {suffix[1:]} {encoding}: {run.out.strip()}")

    messages = _pull(clients[1], topic.subscription, rows=ROWS)
    assert len(messages) == 100
    columns, nulls, chunk_ids = decoded_rows((m.data, m.attributes) for m in messages)
    assert_rows_equal(table, columns, nulls)
    assert sorted(chunk_ids) == sorted(f"{run.id_prefix}:{i}" for i in range(100))


def test_chunks_over_the_limit_are_split(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
    make_topic: Callable[[str], Topic],
    tmp_path: Path,
) -> None:
    topic = make_topic("split")
    table = make_table(20_000)
    path = write_file(table, tmp_path / "split.csv")
    run = run_cli(
        [
            *["publish", *_broker(pubsub), "--topic", topic.name, "--file", str(path)],
            *["--chunk-rows", "5000", "--max-message-bytes", "60000", "--id-prefix", "split"],
            *["--schema", SCHEMA, "--encoding", "json"],
        ]
    )
    assert run.code == 0, run.err
    messages = _pull(clients[1], topic.subscription, rows=20_000)
    ids = [m.attributes["rowbatch-chunk-id"] for m in messages]
    parts = Counter(i.rsplit(".", 1)[0] for i in ids)
    assert set(parts) == {f"split:{c}" for c in range(4)}
    for base, n in parts.items():
        assert n > 1
        assert sorted(i for i in ids if i.startswith(base + ".")) == sorted(
            f"{base}.{k}" for k in range(n)
        )
    assert all(len(m.data) < 60_000 for m in messages)
    columns, nulls, _ = decoded_rows((m.data, m.attributes) for m in messages)
    assert_rows_equal(table, columns, nulls)


def test_parts_near_the_10_mb_limit_are_accepted(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
    make_topic: Callable[[str], Topic],
) -> None:
    topic = make_topic("big")
    n = 24_000
    texts = [f"{i:08d}" + "x" * 1000 for i in range(n)]

    async def publish() -> list[tuple[str, int, int]]:
        async with PubSubPublisher(topic.path, emulator_host=pubsub.host) as publisher:
            done = await publish_rows(
                publisher, "big", {"id": np.arange(n), "text": texts}, "arrow", "big:1"
            )
        return [(p.chunk_id, p.rows, p.bytes) for p in done]

    parts = asyncio.run(publish())
    assert [p[0] for p in parts] == ["big:1.0", "big:1.1", "big:1.2"]
    assert all(9_000_000 < size <= PUBSUB_MAX_MESSAGE_BYTES for _, _, size in parts[:2])
    messages = _pull(clients[1], topic.subscription, rows=n)
    got = sorted(
        (t for m in messages for t in decode_chunk(m.data, m.attributes).columns["text"]),
    )
    assert got == texts


def test_missing_topic_and_unreachable_emulator_are_one_line(
    pubsub: PubSubEndpoint, tmp_path: Path
) -> None:
    path = write_file(make_table(10), tmp_path / "few.csv")
    run = run_cli(["publish", *_broker(pubsub), "--topic", "no-such-topic", "--file", str(path)])
    assert run.code == 1 and run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert (
        f"Pub/Sub topic 'projects/{pubsub.project}/topics/no-such-topic' does not exist" in run.err
    )

    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    run = run_cli(
        [
            *["publish", "--broker", "pubsub", "--emulator-host", address, "--project", "p1"],
            *["--topic", "rows", "--file", str(path), "--connect-timeout", "2"],
        ]
    )
    assert time.monotonic() - started < 15
    assert run.code == 1
    assert run.err.count("\n") == 1, run.err
    assert f"cannot reach Pub/Sub at {address}" in run.err
    assert "projects/p1/topics/rows" in run.err


def test_ordering_key_is_the_message_ordering_key(
    pubsub: PubSubEndpoint,
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
    make_topic: Callable[[str], Topic],
    tmp_path: Path,
) -> None:
    topic = make_topic("ordered")
    path = write_file(make_table(5000), tmp_path / "o.parquet")
    run = run_cli(
        [
            *["publish", *_broker(pubsub), "--topic", topic.name, "--file", str(path)],
            *["--chunk-rows", "500", "--ordering-key", "customer-42", "--id-prefix", "ord"],
        ]
    )
    assert run.code == 0, run.err
    messages = _pull(clients[1], topic.subscription, rows=5000)
    assert {m.ordering_key for m in messages} == {"customer-42"}
    assert {m.attributes["rowbatch-ordering-key"] for m in messages} == {"customer-42"}
    assert [m.attributes["rowbatch-chunk-id"] for m in messages] == [f"ord:{i}" for i in range(10)]


def test_a_hand_built_message_decodes(
    clients: tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient],
    make_topic: Callable[[str], Topic],
) -> None:
    """Built exactly as docs/wire-format.md says, with google-cloud-pubsub, json and pyarrow."""
    publisher, subscriber = clients
    topic = make_topic("handbuilt")
    json_payload = json.dumps(
        {
            "columns": [
                {"name": "order_id", "type": "int64", "values": [18446001, 18446002]},
                {"name": "text", "type": "string", "values": ["two teas", "one coffee"]},
            ]
        }
    ).encode("utf-8")
    publisher.publish(
        topic.path,
        json_payload,
        **{
            "rowbatch-format-version": "1",
            "content-type": "application/json",
            "rowbatch-chunk-id": "orders-db:18446",
            "rowbatch-table": "orders",
            "rowbatch-row-count": "2",
            "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
        },
    ).result(timeout=_WAIT_S)
    batch = pa.record_batch(
        [
            pa.array([1, 2], pa.int64()),
            pa.FixedSizeListArray.from_arrays(pa.array([0.1, 0.2, 0.3, 0.4], pa.float32()), 2),
        ],
        names=["id", "embedding"],
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    publisher.publish(
        topic.path,
        sink.getvalue().to_pybytes(),
        **{
            "rowbatch-format-version": "1",
            "content-type": "application/vnd.apache.arrow.stream",
            "rowbatch-chunk-id": "f3b1c9e2-8a3e-4c55-9d1e-0a6c2b7e5d10",
            "rowbatch-table": "embeddings",
            "rowbatch-row-count": "2",
            "rowbatch-produced-at": "2024-05-01T12:34:57.000Z",
        },
    ).result(timeout=_WAIT_S)

    messages = _pull(subscriber, topic.subscription, count=2)
    by_table = {
        chunk.table: chunk for chunk in (decode_chunk(m.data, m.attributes) for m in messages)
    }
    orders = by_table["orders"]
    assert orders.chunk_id == "orders-db:18446"
    assert orders.columns["order_id"].tolist() == [18446001, 18446002]
    assert orders.columns["text"].tolist() == ["two teas", "one coffee"]
    embeddings = by_table["embeddings"]
    assert embeddings.columns["id"].tolist() == [1, 2]
    np.testing.assert_array_equal(
        embeddings.columns["embedding"], np.array([[0.1, 0.2], [0.3, 0.4]], np.float32)
    )
