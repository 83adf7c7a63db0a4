"""Publishing to a real Kafka broker with the CLI, read back with aiokafka's own consumer: a
100,000-row file arrives exactly (CSV as JSON, Parquet as Arrow), big chunks are split to the
topic's limit, errors are one clear line, and a message built by hand as the wire-format doc
says (raw aiokafka, no rowbatch code) decodes with rowbatch."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, codec

from harness.kafka import KafkaEndpoint, create_topic
from harness.proc import free_port
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.errors import WireError
from tests.integration.publish_helpers import (
    ROWS,
    SCHEMA,
    CliRun,
    assert_rows_equal,
    decoded_rows,
    make_table,
    run_cli,
    write_file,
)

_WAIT_S = 60.0
ARROW_TYPE = "application/vnd.apache.arrow.stream"


def _topic(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _attributes(headers: Any) -> dict[str, str]:
    """Kafka headers as the doc maps them: names as they are, values UTF-8."""
    return {key: value.decode("utf-8") for key, value in headers}


def _broker(endpoint: KafkaEndpoint) -> list[str]:
    return ["--broker", "kafka", "--bootstrap", endpoint.bootstrap_servers]


async def _cli(*argv: str) -> CliRun:
    return await asyncio.to_thread(run_cli, argv)


async def _consume(
    endpoint: KafkaEndpoint, topic: str, *, rows: int | None = None, count: int | None = None
) -> list[Any]:
    """Every record of ``topic`` (until ``rows`` rows or ``count`` records have come), read by
    a fresh consumer group from the start; checks nothing more is there."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=endpoint.bootstrap_servers,
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
        async with asyncio.timeout(_WAIT_S):
            while (rows is not None and seen_rows < rows) or (
                count is not None and len(records) < count
            ):
                batches = await consumer.getmany(timeout_ms=500)
                for batch in batches.values():
                    for record in batch:
                        records.append(record)
                        row_count = _attributes(record.headers).get("rowbatch-row-count", "0")
                        seen_rows += int(row_count) if row_count.isdigit() else 0
        end = await consumer.end_offsets(list(consumer.assignment()))
        assert sum(end.values()) == len(records), "more records than expected"
        return records
    finally:
        await consumer.stop()


@pytest.mark.parametrize(
    ("suffix", "encoding"),
    [(".csv", "json"), (".parquet", "arrow")],
    ids=["csv-json", "parquet-arrow"],
)
async def test_publish_a_100k_row_file_and_read_every_row_back(
    kafka: KafkaEndpoint, tmp_path: Path, suffix: str, encoding: str
) -> None:
    topic = _topic("rows")
    await create_topic(kafka, topic, 6)
    table = make_table(text_nulls=suffix == ".parquet")
    path = write_file(table, tmp_path / f"orders{suffix}")
    run = await _cli(
        "publish",
        *_broker(kafka),
        "--topic",
        topic,
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
    )
    assert run.code == 0, run.err
    assert run.out.startswith(f"published: {ROWS:,} rows, 100 chunks, ")
    print(f"\nkafka {suffix[1:]} {encoding}: {run.out.strip()}")

    records = await _consume(kafka, topic, rows=ROWS)
    assert len(records) == 100
    messages = [(r.value, _attributes(r.headers)) for r in records]
    columns, nulls, chunk_ids = decoded_rows(messages)
    assert_rows_equal(table, columns, nulls)
    assert sorted(chunk_ids) == sorted(f"{run.id_prefix}:{i}" for i in range(100))
    # The record key is the chunk id; chunks spread over the partitions.
    assert all(r.key.decode() == _attributes(r.headers)["rowbatch-chunk-id"] for r in records)
    assert len({r.partition for r in records}) > 1
    content_type = (
        "application/json" if encoding == "json" else "application/vnd.apache.arrow.stream"
    )
    assert {_attributes(r.headers)["content-type"] for r in records} == {content_type}


@pytest.mark.parametrize(
    "compression",
    [
        "none",
        "gzip",
        pytest.param(
            "zstd",
            marks=pytest.mark.skipif(
                not codec.has_zstd(), reason="zstd needs cramjam: aiokafka[zstd]"
            ),
        ),
    ],
)
async def test_chunks_over_the_topic_limit_are_split(
    kafka: KafkaEndpoint, tmp_path: Path, compression: str
) -> None:
    topic = _topic("split")
    limit = 50_000
    await create_topic(kafka, topic, 3, configs={"max.message.bytes": str(limit)})
    table = make_table(20_000)
    path = write_file(table, tmp_path / "split.parquet")
    run = await _cli(
        "publish",
        *_broker(kafka),
        "--topic",
        topic,
        "--file",
        str(path),
        "--chunk-rows",
        "5000",
        "--max-message-bytes",
        str(limit),
        "--id-prefix",
        "split-test",
        "--compression",
        compression,
    )
    assert run.code == 0, run.err
    records = await _consume(kafka, topic, rows=20_000)
    ids = [_attributes(r.headers)["rowbatch-chunk-id"] for r in records]
    parts = Counter(i.rsplit(".", 1)[0] for i in ids)
    assert set(parts) == {f"split-test:{c}" for c in range(4)}
    assert all(n > 1 for n in parts.values())
    for base, n in parts.items():
        assert sorted(i for i in ids if i.startswith(base + ".")) == sorted(
            f"{base}.{k}" for k in range(n)
        )
    assert all(len(r.value) < limit for r in records)
    columns, nulls, _ = decoded_rows((r.value, _attributes(r.headers)) for r in records)
    assert_rows_equal(table, columns, nulls)


async def test_a_topic_limit_below_the_publisher_limit_is_a_clear_error(
    kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    topic = _topic("small")
    await create_topic(kafka, topic, 1, configs={"max.message.bytes": "20000"})
    path = write_file(make_table(2000), tmp_path / "small.parquet")
    run = await _cli(
        "publish", *_broker(kafka), "--topic", topic, "--file", str(path), "--retries", "1"
    )
    assert run.code == 1
    assert run.err.count("\n") == 1, run.err
    assert f"Kafka topic {topic!r}" in run.err and "max.message.bytes" in run.err


async def test_missing_topic_and_unreachable_broker_are_one_line(
    kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    path = write_file(make_table(10), tmp_path / "few.csv")
    missing = _topic("missing")
    run = await _cli("publish", *_broker(kafka), "--topic", missing, "--file", str(path))
    assert run.code == 1 and run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert f"Kafka topic {missing!r} does not exist on {kafka.bootstrap_servers}" in run.err

    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    run = await _cli(
        "publish",
        "--broker",
        "kafka",
        "--bootstrap",
        address,
        "--topic",
        "rows",
        "--file",
        str(path),
        "--connect-timeout",
        "5",
    )
    assert time.monotonic() - started < 15
    assert run.code == 1
    assert run.err.count("\n") == 1, run.err
    assert f"cannot reach Kafka at {address}" in run.err and "'rows'" in run.err


async def test_ordering_key_is_the_record_key(kafka: KafkaEndpoint, tmp_path: Path) -> None:
    topic = _topic("ordered")
    await create_topic(kafka, topic, 6)
    path = write_file(make_table(5000), tmp_path / "o.parquet")
    run = await _cli(
        "publish",
        *_broker(kafka),
        "--topic",
        topic,
        "--file",
        str(path),
        "--chunk-rows",
        "500",
        "--ordering-key",
        "customer-42",
        "--id-prefix",
        "ord",
    )
    assert run.code == 0, run.err
    records = await _consume(kafka, topic, rows=5000)
    assert {r.key for r in records} == {b"customer-42"}
    assert len({r.partition for r in records}) == 1
    ids = [_attributes(r.headers)["rowbatch-chunk-id"] for r in records]
    assert ids == [f"ord:{i}" for i in range(10)]  # in order within the partition
    assert {_attributes(r.headers)["rowbatch-ordering-key"] for r in records} == {"customer-42"}


async def test_a_hand_built_message_decodes(kafka: KafkaEndpoint) -> None:
    """Built exactly as docs/wire-format.md says, with aiokafka, json and pyarrow only."""
    topic = _topic("handbuilt")
    await create_topic(kafka, topic, 1)
    json_payload = json.dumps(
        {
            "columns": [
                {"name": "order_id", "type": "int64", "values": [18446001, 18446002]},
                {"name": "text", "type": "string", "values": ["two teas", "one coffee"]},
            ]
        }
    ).encode("utf-8")
    json_headers = [
        ("rowbatch-format-version", b"1"),
        ("content-type", b"application/json"),
        ("rowbatch-chunk-id", b"orders-db:18446"),
        ("rowbatch-table", b"orders"),
        ("rowbatch-row-count", b"2"),
        ("rowbatch-produced-at", b"2024-05-01T12:34:56.789Z"),
    ]
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
    arrow_payload = sink.getvalue().to_pybytes()
    arrow_headers = [
        ("rowbatch-format-version", b"1"),
        ("content-type", b"application/vnd.apache.arrow.stream"),
        ("rowbatch-chunk-id", b"f3b1c9e2-8a3e-4c55-9d1e-0a6c2b7e5d10"),
        ("rowbatch-table", b"embeddings"),
        ("rowbatch-row-count", b"2"),
        ("rowbatch-produced-at", b"2024-05-01T12:34:57.000Z"),
    ]
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, json_payload, headers=json_headers)
        await producer.send_and_wait(topic, arrow_payload, headers=arrow_headers)
    finally:
        await producer.stop()

    first, second = await _consume(kafka, topic, count=2)
    orders = decode_chunk(first.value, _attributes(first.headers))
    assert orders.chunk_id == "orders-db:18446" and orders.table == "orders"
    assert orders.columns["order_id"].tolist() == [18446001, 18446002]
    assert orders.columns["text"].tolist() == ["two teas", "one coffee"]
    embeddings = decode_chunk(second.value, _attributes(second.headers))
    assert embeddings.columns["id"].tolist() == [1, 2]
    np.testing.assert_array_equal(
        embeddings.columns["embedding"], np.array([[0.1, 0.2], [0.3, 0.4]], np.float32)
    )


async def test_loadgen_malformed_set_matches_its_manifest(
    kafka: KafkaEndpoint, tmp_path: Path
) -> None:
    topic = _topic("load")
    await create_topic(kafka, topic, 6)
    manifest_path = tmp_path / "sent.json"
    run = await _cli(
        "loadgen",
        *_broker(kafka),
        "--topic",
        topic,
        "--rows",
        "20000",
        "--chunk-rows",
        "500",
        "--malformed",
        "0.1",
        "--malformed-kinds",
        "bad-encoding,wrong-type,missing-header,row-count,reject-marker",
        "--reject-marker",
        "POISON",
        "--manifest",
        str(manifest_path),
    )
    assert run.code == 0, run.err
    manifest = json.loads(manifest_path.read_text())
    malformed = manifest["malformed"]
    assert len(malformed) == 4
    records = await _consume(kafka, topic, count=manifest["messages"])
    expected_schema = {name: ColumnType.parse(t) for name, t in manifest["schema"].items()}
    failed: dict[str, str] = {}
    marked: set[str] = set()
    valid_rows = 0
    for record in records:
        attributes = _attributes(record.headers)
        try:
            chunk = decode_chunk(record.value, attributes, schema=expected_schema)
        except WireError as exc:
            failed[attributes["rowbatch-chunk-id"]] = exc.reason
            continue
        if any("POISON" in t for t in chunk.columns["text"]):
            marked.add(chunk.chunk_id)
        else:
            valid_rows += chunk.row_count
    assert failed == {
        cid: m["reason"] for cid, m in malformed.items() if m["kind"] != "reject-marker"
    }
    assert marked == {cid for cid, m in malformed.items() if m["kind"] == "reject-marker"}
    assert valid_rows == manifest["valid_rows"]
