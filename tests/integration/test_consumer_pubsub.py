"""The consumer end to end on the real Pub/Sub emulator and Triton, what only Pub/Sub has:
batches slower than the subscription's ack deadline cause no redelivery (the leases are
extended). What both brokers share (a backlog into each sink, poison, a server outage) is in
test_consumer.py; the helpers here are shared with other integration tests."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow.dataset as ds
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client import CollectorRegistry

from harness.chaos import ChaosControl
from harness.pubsub import PubSubEndpoint
from harness.reference_models import score
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until


def config(
    topics: Topics, triton: TritonEndpoint, model: str, sink: dict[str, Any], **extra: Any
) -> ConsumerConfig:
    bindings = {
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
    return ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "subscription": topics.subscription,
                "dead_letter_topic": topics.dlq_topic,
                "max_lease_extension_s": 10,
            },
            "model": {"url": triton.grpc_url, "name": model, "max_wait_ms": 50},
            "binding": bindings[model],
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
            **extra,
        }
    )


def scorer_chunks(total: int, seed: int) -> tuple[list[EncodedChunk], dict[int, tuple[Any, Any]]]:
    """Chunks of mixed sizes, alternately JSON and Arrow; rows' ids are 0..total-1."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(total, 16)).astype(np.float32)
    counts = rng.integers(0, 1000, size=total).astype(np.int64)
    scores, labels = score(features, counts.reshape(-1, 1))
    expected = {i: (scores[i, 0], labels[i, 0]) for i in range(total)}
    chunks, start, n = [], 0, 0
    while start < total:
        size = min(total - start, int(rng.integers(1, 3000)))
        sl = slice(start, start + size)
        cols = {
            "id": np.arange(start, start + size, dtype=np.int64),
            "features": features[sl],
            "count": counts[sl],
        }
        chunks.append(encode_chunk("events", cols, "json" if n % 2 else "arrow", f"c{seed}-{n}"))
        start, n = start + size, n + 1
    return chunks, expected


def triton_batch_rows(triton: TritonEndpoint, model: str) -> dict[int, int]:
    """Rows Triton executed per batch size so far (from Triton's own statistics)."""
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    out: dict[int, int] = {}
    for entry in stats["model_stats"][0].get("batch_stats", []):
        size = int(entry["batch_size"])
        out[size] = size * int(entry["compute_infer"]["count"])
    return out


def read_results(kind: str, where: Any, table: str) -> dict[int, tuple[float, int]]:
    if kind == "sqlite":
        with sqlite3.connect(where) as conn:
            rows = conn.execute(f"SELECT id, score, label FROM {table}").fetchall()
    elif kind == "postgres":
        with psycopg.connect(where) as conn:
            rows = conn.execute(f"SELECT id, score, label FROM {table}").fetchall()
    else:
        data = ds.dataset(where, format="parquet", partitioning="hive").to_table(
            columns=["id", "score", "label"]
        )
        rows = list(
            zip(*(data.column(c).to_pylist() for c in ("id", "score", "label")), strict=True)
        )
    result = {int(i): (float(s), int(lab)) for i, s, lab in rows}
    assert len(result) == len(rows), "duplicate ids in the result table"
    return result


def dead_lettered(registry: CollectorRegistry) -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "rowbatch_messages_dead_lettered_total" and sample.value
    }


def settled(registry: CollectorRegistry) -> float:
    acked = registry.get_sample_value("rowbatch_messages_acked_total") or 0.0
    return acked + sum(dead_lettered(registry).values())


# --- slow batches (the chaos model: TEXT -> EMBEDDING, faults on demand) --------------------


@pytest.fixture
def chaos(triton: TritonEndpoint) -> Iterator[TritonEndpoint]:
    ChaosControl().write(triton.chaos_control)
    yield triton
    ChaosControl().write(triton.chaos_control)


def text_chunk(n: int, rows: int, *, marker_row: int | None = None) -> EncodedChunk:
    texts = [f"message {n} row {r} ✓" for r in range(rows)]
    if marker_row is not None:
        texts[marker_row] += " POISON-ROW"
    ids = np.arange(n * 1000, n * 1000 + rows, dtype=np.int64)
    return encode_chunk("docs", {"id": ids, "text": texts}, "arrow" if n % 2 else "json", f"t{n}")


def read_embeddings(path: Path, table: str) -> dict[tuple[str, int], tuple[int, bytes]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT chunk_id, row_index, id, embedding FROM {table}").fetchall()
    out = {(c, int(r)): (int(i), bytes(e)) for c, r, i, e in rows}
    assert len(out) == len(rows)
    return out


@pytest.mark.timeout(300)
async def test_batches_slower_than_the_ack_deadline_cause_no_redelivery(
    pubsub: PubSubEndpoint, chaos: TritonEndpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    topics = Topics.create(pubsub, ack_deadline_s=10)
    try:
        ChaosControl(delay_s=25.0).write(chaos.chaos_control)
        chunks = [text_chunk(n, 20) for n in range(6)]  # 120 rows: one batch, one 25 s call
        topics.publish(chunks)
        sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
        cfg = config(topics, chaos, "chaos", sink)
        async with consumer_running(cfg) as run:
            await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
            registry = run.running[0].metrics.registry
            await wait_until(lambda: settled(registry) == len(chunks), 120, "acks", run.task)
            await run.stop_and_wait()
            assert registry.get_sample_value("rowbatch_messages_received_total") == len(chunks)
            assert registry.get_sample_value("rowbatch_rows_written_total") == 120
        assert len(read_embeddings(tmp_path / "r.sqlite", "emb")) == 120
    finally:
        topics.close()
