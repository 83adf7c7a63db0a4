"""The consumer end to end on the real Pub/Sub emulator, Triton, and each sink."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow.dataset as ds
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client import CollectorRegistry

from consumer.config import ConsumerConfig
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.reference_models import score
from harness.triton import TritonEndpoint
from producer.wire import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until


@pytest.fixture
def topics(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[Topics]:
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    t = Topics.create(pubsub)
    yield t
    t.close()


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
        size = int(min(total - start, rng.integers(1, 3000)))
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


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["sqlite", "postgres", "parquet"])
async def test_100k_rows_mixed_chunks_into_each_sink(
    kind: str,
    topics: Topics,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
) -> None:
    total = 100_000
    table = f"scores_{kind}_{int(time.time() * 1000) % 10**8}"
    sink: dict[str, Any] = {
        "sqlite": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": table},
        "postgres": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
        "parquet": {"kind": "parquet", "url": str(tmp_path / "ds"), "table": table},
    }[kind]
    where = {"sqlite": tmp_path / "r.sqlite", "postgres": postgres.dsn, "parquet": tmp_path / "ds"}[
        kind
    ]
    chunks, expected = scorer_chunks(total, seed=len(kind))
    topics.publish(chunks)
    before = triton_batch_rows(triton, "scorer")
    async with consumer_running(config(topics, triton, "scorer", sink)) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry

        await wait_until(
            lambda: settled(registry) == len(chunks), 300, f"{len(chunks)} settled", run.task
        )
        await run.stop_and_wait()
        assert dead_lettered(registry) == {}
        assert registry.get_sample_value("rowbatch_rows_written_total") == total
    got = read_results(kind, where, table)
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
    assert executed.get(256, 0) >= 0.95 * total, f"rows per Triton batch size: {executed}"
