"""Publishing to a real Kafka broker with the CLI, what only Kafka has: a topic whose own
``max.message.bytes`` is below the publisher's limit is a clear error, and the load generator's
malformed messages are those its manifest lists. What both brokers share is in
test_publish.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.kafka import KafkaEndpoint
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.errors import WireError
from tests.integration.publish_helpers import (
    KafkaPublishBroker,
    kafka_publish_broker,
    make_table,
    run_cli_async,
    write_file,
)


@pytest.fixture
def broker(kafka: KafkaEndpoint) -> Iterator[KafkaPublishBroker]:
    yield from kafka_publish_broker(kafka)


async def test_a_topic_limit_below_the_publisher_limit_is_a_clear_error(
    broker: KafkaPublishBroker, tmp_path: Path
) -> None:
    topic = await broker.topic("small", max_message_bytes=20_000)
    path = write_file(make_table(2000), tmp_path / "small.parquet")
    run = await run_cli_async(
        "publish", *broker.options(), "--topic", topic, "--file", str(path), "--retries", "1"
    )
    assert run.code == 1
    assert run.err.count("\n") == 1, run.err
    assert f"Kafka topic {topic!r}" in run.err and "max.message.bytes" in run.err


async def test_loadgen_malformed_set_matches_its_manifest(
    broker: KafkaPublishBroker, tmp_path: Path
) -> None:
    topic = await broker.topic("load", partitions=6)
    manifest_path = tmp_path / "sent.json"
    run = await run_cli_async(
        *["loadgen", *broker.options(), "--topic", topic, "--rows", "20000"],
        *["--chunk-rows", "500", "--malformed", "0.1"],
        *["--malformed-kinds", "bad-encoding,wrong-type,missing-header,row-count,reject-marker"],
        *["--reject-marker", "POISON", "--manifest", str(manifest_path)],
    )
    assert run.code == 0, run.err
    manifest = json.loads(manifest_path.read_text())
    malformed = manifest["malformed"]
    assert len(malformed) == 4
    messages = await broker.read(topic, count=manifest["messages"])
    expected_schema = {name: ColumnType.parse(t) for name, t in manifest["schema"].items()}
    failed: dict[str, str] = {}
    marked: set[str] = set()
    valid_rows = 0
    for message in messages:
        try:
            chunk = decode_chunk(message.data, message.attributes, schema=expected_schema)
        except WireError as exc:
            failed[message.attributes["rowbatch-chunk-id"]] = exc.reason
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
