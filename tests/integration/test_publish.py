"""Publishing with the CLI to each real broker (Kafka, the Pub/Sub emulator), read back with the
broker's own client (aiokafka's consumer, google-cloud-pubsub's streaming pull): a 100,000-row
file arrives exactly (CSV as JSON, Parquet as Arrow), chunks over the limit are split, a missing
topic and an unreachable broker are one clear line, the ordering key reaches the broker, and a
message built by hand as the wire-format doc says (the broker's client, no rowbatch code)
decodes with rowbatch. What only one broker has is in test_publish_kafka.py and
test_publish_pubsub.py."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from aiokafka import codec

from harness.kafka import KafkaEndpoint
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from rowbatch.wire.chunks.decode import decode_chunk
from tests.integration.publish_helpers import (
    ROWS,
    SCHEMA,
    PublishBroker,
    assert_rows_equal,
    decoded_rows,
    kafka_publish_broker,
    make_table,
    pubsub_publish_broker,
    run_cli_async,
    write_file,
)

ARROW_TYPE = "application/vnd.apache.arrow.stream"


@pytest.fixture(params=["kafka", "pubsub"])
def broker(request: pytest.FixtureRequest) -> Iterator[PublishBroker]:
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        yield from kafka_publish_broker(kafka)
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
        yield from pubsub_publish_broker(pubsub)


@pytest.mark.parametrize(
    ("suffix", "encoding"),
    [(".csv", "json"), (".parquet", "arrow")],
    ids=["csv-json", "parquet-arrow"],
)
async def test_publish_a_100k_row_file_and_read_every_row_back(
    broker: PublishBroker, tmp_path: Path, suffix: str, encoding: str
) -> None:
    topic = await broker.topic("rows", partitions=6)
    table = make_table(text_nulls=suffix == ".parquet")
    path = write_file(table, tmp_path / f"orders{suffix}")
    run = await run_cli_async(
        *["publish", *broker.options(), "--topic", topic, "--file", str(path)],
        *["--chunk-rows", "1000", "--encoding", encoding, "--table", "orders"],
        *["--schema", SCHEMA],
    )
    assert run.code == 0, run.err
    assert run.out.startswith(f"published: {ROWS:,} rows, 100 chunks, ")
    print(f"\n{broker.name} {suffix[1:]} {encoding}: {run.out.strip()}")

    messages = await broker.read(topic, rows=ROWS)
    assert len(messages) == 100
    columns, nulls, chunk_ids = decoded_rows((m.data, m.attributes) for m in messages)
    assert_rows_equal(table, columns, nulls)
    assert sorted(chunk_ids) == sorted(f"{run.id_prefix}:{i}" for i in range(100))
    content_type = "application/json" if encoding == "json" else ARROW_TYPE
    assert {m.attributes["content-type"] for m in messages} == {content_type}
    if broker.partitioned:
        # The record key is the chunk id; chunks spread over the partitions.
        assert all(m.ordering_key == m.attributes["rowbatch-chunk-id"] for m in messages)
        assert len({m.partition for m in messages}) > 1


SPLIT_LIMIT = {"kafka": 50_000, "pubsub": 60_000}
"""``--max-message-bytes`` (and, on Kafka, the topic's own ``max.message.bytes``)."""


@pytest.mark.parametrize(
    ("broker", "suffix", "options"),
    [
        pytest.param("kafka", ".parquet", ["--compression", "none"], id="kafka-none"),
        pytest.param("kafka", ".parquet", ["--compression", "gzip"], id="kafka-gzip"),
        pytest.param(
            "kafka",
            ".parquet",
            ["--compression", "zstd"],
            id="kafka-zstd",
            marks=pytest.mark.skipif(
                not codec.has_zstd(), reason="zstd needs cramjam: aiokafka[zstd]"
            ),
        ),
        pytest.param("pubsub", ".csv", ["--schema", SCHEMA, "--encoding", "json"], id="pubsub"),
    ],
    indirect=["broker"],
)
async def test_chunks_over_the_limit_are_split(
    broker: PublishBroker, tmp_path: Path, suffix: str, options: list[str]
) -> None:
    limit = SPLIT_LIMIT[broker.name]
    topic = await broker.topic("split", partitions=3, max_message_bytes=limit)
    table = make_table(20_000)
    path = write_file(table, tmp_path / f"split{suffix}")
    run = await run_cli_async(
        *["publish", *broker.options(), "--topic", topic, "--file", str(path)],
        *["--chunk-rows", "5000", "--max-message-bytes", str(limit), "--id-prefix", "split"],
        *options,
    )
    assert run.code == 0, run.err
    messages = await broker.read(topic, rows=20_000)
    ids = [m.attributes["rowbatch-chunk-id"] for m in messages]
    parts = Counter(i.rsplit(".", 1)[0] for i in ids)
    assert set(parts) == {f"split:{c}" for c in range(4)}
    assert all(n > 1 for n in parts.values())
    for base, n in parts.items():
        assert sorted(i for i in ids if i.startswith(base + ".")) == sorted(
            f"{base}.{k}" for k in range(n)
        )
    assert all(len(m.data) < limit for m in messages)
    columns, nulls, _ = decoded_rows((m.data, m.attributes) for m in messages)
    assert_rows_equal(table, columns, nulls)


async def test_missing_topic_and_unreachable_broker_are_one_line(
    broker: PublishBroker, tmp_path: Path
) -> None:
    path = write_file(make_table(10), tmp_path / "few.csv")
    missing, says = broker.missing_topic()
    run = await run_cli_async("publish", *broker.options(), "--topic", missing, "--file", str(path))
    assert run.code == 1 and run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert says in run.err

    address = f"127.0.0.1:{free_port()}"
    options, said = broker.unreachable(address)
    started = time.monotonic()
    run = await run_cli_async("publish", *options, "--file", str(path))
    assert time.monotonic() - started < 15
    assert run.code == 1
    assert run.err.count("\n") == 1, run.err
    for part in said:
        assert part in run.err


async def test_the_ordering_key_reaches_the_broker(broker: PublishBroker, tmp_path: Path) -> None:
    """Pub/Sub: the message's ordering key; Kafka: the record key, so one partition."""
    topic = await broker.topic("ordered", partitions=6)
    path = write_file(make_table(5000), tmp_path / "o.parquet")
    run = await run_cli_async(
        *["publish", *broker.options(), "--topic", topic, "--file", str(path)],
        *["--chunk-rows", "500", "--ordering-key", "customer-42", "--id-prefix", "ord"],
    )
    assert run.code == 0, run.err
    messages = await broker.read(topic, rows=5000)
    assert {m.ordering_key for m in messages} == {"customer-42"}
    assert len({m.partition for m in messages}) == 1
    assert {m.attributes["rowbatch-ordering-key"] for m in messages} == {"customer-42"}
    # in order (within the partition)
    assert [m.attributes["rowbatch-chunk-id"] for m in messages] == [f"ord:{i}" for i in range(10)]


async def test_a_hand_built_message_decodes(broker: PublishBroker) -> None:
    """Built exactly as docs/wire-format.md says, with the broker's own client, json and
    pyarrow only."""
    topic = await broker.topic("handbuilt")
    json_payload = json.dumps(
        {
            "columns": [
                {"name": "order_id", "type": "int64", "values": [18446001, 18446002]},
                {"name": "text", "type": "string", "values": ["two teas", "one coffee"]},
            ]
        }
    ).encode("utf-8")
    json_attributes = {
        "rowbatch-format-version": "1",
        "content-type": "application/json",
        "rowbatch-chunk-id": "orders-db:18446",
        "rowbatch-table": "orders",
        "rowbatch-row-count": "2",
        "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
    }
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
    arrow_attributes = {
        "rowbatch-format-version": "1",
        "content-type": ARROW_TYPE,
        "rowbatch-chunk-id": "f3b1c9e2-8a3e-4c55-9d1e-0a6c2b7e5d10",
        "rowbatch-table": "embeddings",
        "rowbatch-row-count": "2",
        "rowbatch-produced-at": "2024-05-01T12:34:57.000Z",
    }
    await broker.publish_raw(
        topic,
        [(json_payload, json_attributes), (sink.getvalue().to_pybytes(), arrow_attributes)],
    )

    messages = await broker.read(topic, count=2)
    assert len(messages) == 2
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
