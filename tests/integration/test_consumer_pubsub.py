"""The consumer end to end on the real Pub/Sub emulator, Triton, and each sink."""

from __future__ import annotations

import asyncio
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

from harness.chaos import ChaosControl
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.reference_models import embed, score
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
    # Full batches: 256 (the preferred size, what rowbatch sends), or two requests of 256
    # merged by Triton's dynamic batcher when they arrive together (max_batch_size 512).
    full = sum(rows for size, rows in executed.items() if size >= 256 and size % 256 == 0)
    assert full >= 0.95 * total, f"rows per Triton batch size: {executed}"


# --- poison, outage, slow batches (the chaos model: TEXT -> EMBEDDING, faults on demand) ----


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
async def test_poison_messages_are_dead_lettered_with_reasons_and_the_rest_written_once(
    topics: Topics, chaos: TritonEndpoint, tmp_path: Path
) -> None:
    ChaosControl(reject_marker="POISON-ROW").write(chaos.chaos_control)
    good = [text_chunk(n, 10) for n in range(196)]
    marked = text_chunk(500, 10, marker_row=7)
    wrong_type = encode_chunk(
        "docs", {"id": np.arange(3, dtype=np.int64), "text": np.arange(3, dtype=np.int64)},
        "json", "wrong-type",
    )  # fmt: skip
    sent = topics.publish(good[:100])
    bad_ids = {
        topics.publish([marked])[0]: "rejected-by-model",
        topics.publish([wrong_type])[0]: "schema-mismatch",
        topics.publish_raw(b"\x00garbage{", dict(good[0].attributes)): "undecodable",
        topics.publish_raw(good[1].payload, {"content-type": "application/json"}): "undecodable",
    }
    sent += topics.publish(good[100:])
    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    async with consumer_running(config(topics, chaos, "chaos", sink)) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry
        await wait_until(lambda: settled(registry) == 200, 120, "200 settled", run.task)
        await run.stop_and_wait()
        assert dead_lettered(registry) == {
            "rejected-by-model": 1, "schema-mismatch": 1, "undecodable": 2
        }  # fmt: skip
    dead = topics.dead_letters(expect=4)
    assert len(dead) == 4, [m.attributes["rowbatch-dlq-message-id"] for m in dead]
    assert {m.attributes["rowbatch-dlq-message-id"]: m.attributes["rowbatch-dlq-reason"]
            for m in dead} == bad_ids  # fmt: skip
    for m in dead:
        assert m.attributes["rowbatch-dlq-source"] == topics.subscription
        assert m.attributes["rowbatch-dlq-message"]
        if m.attributes["rowbatch-dlq-reason"] == "rejected-by-model":
            assert m.data == marked.payload
            assert m.attributes["rowbatch-chunk-id"] == "t500"
    rows = read_embeddings(tmp_path / "r.sqlite", "emb")
    assert len(sent) == 196
    assert set(rows) == {(f"t{n}", r) for n in range(196) for r in range(10)}
    for (chunk, r), (row_id, blob) in list(rows.items())[:50]:
        n = int(chunk[1:])
        assert row_id == n * 1000 + r
        want = embed(f"message {n} row {r} ✓")
        assert np.array_equal(np.frombuffer(blob, "<f4"), want)


@pytest.mark.timeout(300)
async def test_server_outage_pauses_consumption_and_loses_nothing(
    topics: Topics, chaos: TritonEndpoint, tmp_path: Path
) -> None:
    ChaosControl(delay_s=0.05).write(chaos.chaos_control)
    chunks = [text_chunk(n, 100) for n in range(200)]  # 20,000 rows
    topics.publish(chunks)
    budget = 32 * 1024 * 1024
    sink = {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"}
    cfg = config(topics, chaos, "chaos", sink, budget_bytes=budget)
    async with consumer_running(cfg) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry

        def written() -> float:
            return registry.get_sample_value("rowbatch_rows_written_total") or 0.0

        await wait_until(lambda: written() > 0, 60, "first rows written", run.task)
        outage_s = 20.0
        ChaosControl(unavailable_until=time.time() + outage_s, delay_s=0.05).write(
            chaos.chaos_control
        )
        started = time.monotonic()
        peak_inflight = 0.0
        paused_seen = False
        while settled(registry) < len(chunks):
            assert not run.task.done(), "consumer stopped"
            paused_seen |= registry.get_sample_value("rowbatch_paused", {"why": "backoff"}) == 1
            peak_inflight = max(
                peak_inflight, registry.get_sample_value("rowbatch_inflight_bytes") or 0.0
            )
            assert time.monotonic() - started < 180, "not finished 180 s after the outage began"
            await asyncio.sleep(0.1)
        await run.stop_and_wait()
        assert paused_seen, "consumption never paused during the outage"
        assert time.monotonic() - started >= outage_s * 0.9
        assert (registry.get_sample_value("rowbatch_backoff_periods_total") or 0) >= 1
        assert dead_lettered(registry) == {}
        assert peak_inflight <= budget
    rows = read_embeddings(tmp_path / "r.sqlite", "emb")
    assert len(rows) == 20_000


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
