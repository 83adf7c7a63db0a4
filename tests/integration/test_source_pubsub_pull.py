"""``PubSubPullSource`` (unary pull, ``source.mode = "pull"``) on Google's real Pub/Sub
emulator, beyond what every source promises (``test_source_contract.py``: delivery, nack,
dead letters, pause, close, the start-up check): every message once at volume, leases
outlasting the ack deadline, what close leaves held, flow control, ordering keys, a deleted
subscription; then the whole consumer in pull mode (20,000 rows through Triton into SQLite,
every row once)."""

from __future__ import annotations

import asyncio
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.pubsub import PubSubEndpoint
from harness.reference_models import score
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.sources.pubsub.errors import PubSubConfigError, PubSubPullError
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until
from tests.integration.pubsub_helpers import (
    WAIT_S,
    Collector,
    PubSubBench,
    next_delivery,
    numbered,
    publish,
    pubsub_bench,
    pull,
    until,
)

Bench = PubSubBench[PubSubPullSource]


@pytest.fixture
async def bench(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Bench]:
    async with pubsub_bench(pubsub, monkeypatch, PubSubPullSource) as b:
        yield b


async def test_every_message_is_delivered_and_acked_once(bench: Bench) -> None:
    t = bench.topics()
    source = bench.source(t, max_messages=300)
    await source.check()
    sent = {f"row-{i}".encode() * (1 + i % 7): {"seq": str(i)} for i in range(3000)}
    before = time.time()
    ids = await publish(t, list(sent.items()))
    collector = Collector(source, ack=True)
    await collector.wait_for(len(sent))
    # Acked: nothing comes back, not even after the subscription's ack deadline (10 s).
    await asyncio.sleep(12)
    await source.flush()
    await collector.stop()

    got = collector.items
    assert len(got) == len(sent)
    assert sorted(d.message_id for d in got) == sorted(ids)
    assert {d.payload: dict(d.attributes) for d in got} == sent
    for delivery in got:
        assert delivery.source == t.subscription
        assert delivery.delivery_attempt == 0
        assert before - 5 <= delivery.publish_time <= time.time() + 5
        assert delivery.size >= len(delivery.payload)
    assert collector.max_outstanding <= 300
    assert source.outstanding == 0 and source.unconfirmed == 0
    await source.close()
    assert await pull(t, t.subscription, 1, 2.0) == []


async def test_a_message_held_past_the_ack_deadline_is_not_redelivered(bench: Bench) -> None:
    t = bench.topics(ack_deadline_s=10)
    # Each extension is 10 s as well, so every missed one would show as a redelivery.
    source = bench.source(t, max_lease_extension_s=10)
    await source.check()
    collector = Collector(source)
    [message_id] = await publish(t, [(b"slow", {})])
    await collector.wait_for(1)
    # Holding the message unacked for 25 s (2.5 ack deadlines) is the point of this test.
    await asyncio.sleep(25)
    assert [d.message_id for d in collector.items] == [message_id]
    assert source.extension_calls >= 3
    await source.ack(collector.items[0])
    await collector.stop()


async def test_lease_is_dropped_after_max_lease_duration(bench: Bench) -> None:
    """The control for the test above."""
    t = bench.topics(ack_deadline_s=10)
    source = bench.source(t, max_lease_extension_s=10, max_lease_duration_s=2)
    collector = Collector(source)
    [message_id] = await publish(t, [(b"too-slow", {})])
    await collector.wait_for(2, within_s=40)
    assert [d.message_id for d in collector.items[:2]] == [message_id, message_id]
    await source.ack(collector.items[1])
    await collector.stop()


async def test_close_counts_what_was_received_and_forgets_it(bench: Bench) -> None:
    """What the contract suite's close test does not see: everything pulled counts as
    outstanding, handed out or not, and after ``close`` nothing is held any more."""
    t = bench.topics(ack_deadline_s=60)
    source = bench.source(t, max_lease_extension_s=60)
    await publish(t, numbered("c", 6))
    iterator = source.deliveries()
    handed_out = [await next_delivery(iterator) for _ in range(3)]
    await until(lambda: source.outstanding == 6, "all 6 messages received")
    await source.ack(handed_out[0])
    await source.close()
    with pytest.raises(ValueError, match="not held"):
        await source.ack(handed_out[1])


async def test_flow_control_holds_at_max_messages(bench: Bench) -> None:
    t = bench.topics()
    source = bench.source(t, max_messages=10)
    collector = Collector(source)
    ids = await publish(t, numbered("m", 40))
    for wave in range(1, 5):
        await collector.wait_for(10 * wave)
        await asyncio.sleep(0.5)  # an 11th would show up in this window
        assert len(collector.items) == 10 * wave
        assert source.outstanding == 10
        for delivery in collector.items[-10:]:
            await source.ack(delivery)
    assert collector.max_outstanding == 10
    assert sorted(d.message_id for d in collector.items) == sorted(ids)
    await collector.stop()


async def test_pause_stops_pulling(bench: Bench) -> None:
    """Pause and resume themselves are in the contract suite; here: no more is pulled while
    paused (the outstanding count stays within ``max_messages`` and does not grow)."""
    t = bench.topics()
    source = bench.source(t, max_messages=5)
    iterator = source.deliveries()
    await publish(t, numbered("p", 20))
    await source.ack(await next_delivery(iterator))
    source.pause()
    waiting = asyncio.ensure_future(anext(iterator))
    await asyncio.sleep(1.0)
    assert source.outstanding <= 5
    held = source.outstanding
    await asyncio.sleep(0.5)
    assert source.outstanding == held  # nothing more pulled while paused
    source.resume()
    await source.ack(await asyncio.wait_for(waiting, WAIT_S))


async def test_ordering_keys_are_delivered_in_order_one_at_a_time(bench: Bench) -> None:
    t = bench.topics(ordering=True)
    source = bench.source(t)
    await source.check()
    ids = await publish(t, numbered("k", 5), ordering_key="k")
    iterator = source.deliveries()
    first = await next_delivery(iterator)
    assert (first.message_id, first.ordering_key) == (ids[0], "k")
    waiting = asyncio.ensure_future(anext(iterator))
    await asyncio.sleep(0.5)
    assert not waiting.done()  # the key's next message waits until this one is settled
    await source.ack(first)
    second = await asyncio.wait_for(waiting, WAIT_S)
    assert second.message_id == ids[1]
    await source.nack(second)  # it and those held behind it go back, and come back in order
    seen: list[str] = []
    while len(seen) < 4:
        delivery = await next_delivery(iterator)
        seen.append(delivery.message_id)
        await source.ack(delivery)
    assert seen == ids[1:]


async def test_check_and_a_deleted_subscription(bench: Bench, pubsub: PubSubEndpoint) -> None:
    t = bench.topics()
    missing = f"projects/{pubsub.project}/subscriptions/absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PubSubConfigError, match=f"subscription {missing} does not exist"):
        await bench.source(t, subscription=missing).check()
    source = bench.source(t)
    iterator = source.deliveries()
    await publish(t, [(b"a", {})])
    await source.ack(await next_delivery(iterator))
    await source.flush()  # confirmed before the subscription goes
    t.subscriber.delete_subscription(request={"subscription": t.subscription})
    # Pulls in flight (long polls) end within their 10 s deadline; the next one fails.
    with pytest.raises(PubSubPullError, match=f"pull on {t.subscription}.*404"):
        await next_delivery(iterator, 60)


# --- the consumer in pull mode ----------------------------------------------------------------


def _chunks(total_one_row: int, total_mixed: int, seed: int) -> tuple[list[EncodedChunk], Any]:
    """``total_one_row`` 1-row chunks, then ``total_mixed`` rows in chunks of 1..500 rows,
    alternately JSON and Arrow; ids 0..n-1; returns the chunks and the expected scores."""
    total = total_one_row + total_mixed
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(total, 16)).astype(np.float32)
    counts = rng.integers(0, 1000, size=total).astype(np.int64)
    scores, labels = score(features, counts.reshape(-1, 1))
    chunks: list[EncodedChunk] = []
    start = 0
    while start < total:
        size = 1 if start < total_one_row else min(total - start, int(rng.integers(1, 500)))
        sl = slice(start, start + size)
        cols = {
            "id": np.arange(start, start + size, dtype=np.int64),
            "features": features[sl],
            "count": counts[sl],
        }
        n = len(chunks)
        chunks.append(encode_chunk("events", cols, "json" if n % 2 else "arrow", f"p{seed}-{n}"))
        start += size
    return chunks, (scores, labels)


@pytest.mark.timeout(600)
async def test_consumer_in_pull_mode_writes_every_row_once(
    topics: Topics, triton: TritonEndpoint, tmp_path: Path
) -> None:
    chunks, (scores, labels) = _chunks(10_000, 10_000, seed=7)
    topics.publish(chunks)
    cfg = ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "mode": "pull",
                "subscription": topics.subscription,
                "dead_letter_topic": topics.dlq_topic,
                "max_lease_extension_s": 10,
            },
            "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 50},
            "binding": {
                "inputs": {"features": "FEATURES", "count": "COUNT"},
                "outputs": {"SCORE": "score", "LABEL": "label"},
                "passthrough": {"id": "int64"},
            },
            "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"},
            "server": {"port": 0},
            "log_format": "text",
        }
    )
    async with consumer_running(cfg) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry

        def acked() -> float:
            return registry.get_sample_value("rowbatch_messages_acked_total") or 0.0

        await wait_until(lambda: acked() >= len(chunks), 400, "every chunk acked", run.task)
        await asyncio.sleep(2)  # a redelivery would be received (and counted) here
        await run.stop_and_wait()
        assert registry.get_sample_value("rowbatch_messages_received_total") == len(chunks)
        assert registry.get_sample_value("rowbatch_rows_written_total") == 20_000
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        rows = conn.execute("SELECT id, score, label FROM scores").fetchall()
    assert len(rows) == 20_000
    assert sorted(int(r[0]) for r in rows) == list(range(20_000))
    got = np.array([r[1] for r in sorted(rows)], dtype=np.float64)
    np.testing.assert_allclose(got, scores[:, 0].astype(np.float64), rtol=1e-6)
    assert [int(r[2]) for r in sorted(rows)][:100] == [int(x) for x in labels[:100, 0]]
