"""``PubSubPullSource`` (unary pull, ``source.mode = "pull"``) on Google's real Pub/Sub
emulator: every message once, leases outlasting the ack deadline, nack and close giving
messages back at once, dead letters with counted attempts, flow control, ordering keys, the
start-up check; then the whole consumer in pull mode (20,000 rows through Triton into
SQLite, every row once)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pstypes
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from harness.pubsub import PubSubEndpoint
from harness.reference_models import score
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.sources.base import DeadLetterReason, Delivery, ReasonClass, Source
from rowbatch.consumer.sources.pubsub.errors import PubSubConfigError, PubSubPullError
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.wire.chunks import EncodedChunk, encode_chunk
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
)
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until

_WAIT_S = 30.0
Clients = tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]


@dataclass(frozen=True)
class Names:
    topic: str
    subscription: str
    dlq_topic: str
    dlq_subscription: str


@pytest.fixture
def clients(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> Iterator[Clients]:
    # The source builds its grpc.aio client from PUBSUB_EMULATOR_HOST.
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    publisher, subscriber = pubsub.publisher(), pubsub.subscriber()
    yield publisher, subscriber
    publisher.transport.close()
    subscriber.close()


def _create(
    pubsub: PubSubEndpoint,
    clients: Clients,
    stem: str,
    *,
    ack_deadline_s: int = 10,
    policy_attempts: int | None = None,
    ordering: bool = False,
) -> Names:
    publisher, subscriber = clients
    unique = f"{stem}-{uuid.uuid4().hex[:8]}"
    project = f"projects/{pubsub.project}"
    names = Names(
        topic=f"{project}/topics/{unique}",
        subscription=f"{project}/subscriptions/{unique}",
        dlq_topic=f"{project}/topics/{unique}-dlq",
        dlq_subscription=f"{project}/subscriptions/{unique}-dlq",
    )
    publisher.create_topic(name=names.topic)
    publisher.create_topic(name=names.dlq_topic)
    subscriber.create_subscription(name=names.dlq_subscription, topic=names.dlq_topic)
    policy = None
    if policy_attempts is not None:
        policy = pstypes.DeadLetterPolicy(
            dead_letter_topic=names.dlq_topic, max_delivery_attempts=policy_attempts
        )
    subscriber.create_subscription(
        request=pstypes.Subscription(
            name=names.subscription,
            topic=names.topic,
            ack_deadline_seconds=ack_deadline_s,
            dead_letter_policy=policy,
            enable_message_ordering=ordering,
        )
    )
    return names


SourceFactory = Callable[..., PubSubPullSource]


@pytest.fixture
async def make_source(
    pubsub: PubSubEndpoint, clients: Clients
) -> AsyncIterator[Callable[..., PubSubPullSource]]:
    made: list[PubSubPullSource] = []

    def make(names: Names, **overrides: Any) -> PubSubPullSource:
        settings: dict[str, Any] = {
            "subscription": names.subscription,
            "dead_letter_topic": names.dlq_topic,
            **overrides,
        }
        source = PubSubPullSource(
            PubSubSettings(**settings),
            consumer_version="test-9.9.9",
            publisher=clients[0],
            subscriber=clients[1],
            host=pubsub.host,
        )
        made.append(source)
        return source

    yield make
    for source in made:
        await source.close()


async def _publish(
    publisher: pubsub_v1.PublisherClient,
    topic: str,
    messages: list[tuple[bytes, dict[str, str]]],
    ordering_key: str = "",
) -> list[str]:
    api = GapicPublisherClient(transport=publisher.transport)
    ids: list[str] = []
    for start in range(0, len(messages), 1000):
        request = pstypes.PublishRequest(
            topic=topic,
            messages=[
                pstypes.PubsubMessage(data=data, attributes=attrs, ordering_key=ordering_key)
                for data, attrs in messages[start : start + 1000]
            ],
        )
        response = await asyncio.to_thread(api.publish, request=request, timeout=_WAIT_S)
        ids.extend(response.message_ids)
    return ids


async def _next(iterator: AsyncIterator[Delivery], within_s: float = _WAIT_S) -> Delivery:
    return await asyncio.wait_for(anext(iterator), within_s)


async def _until(condition: Callable[[], bool], what: str, within_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Collector:
    """Consumes ``deliveries()`` in the background, recording each delivery (redeliveries
    included) and the most deliveries outstanding at once."""

    def __init__(self, source: PubSubPullSource, ack: bool = False) -> None:
        self.source = source
        self.items: list[Delivery] = []
        self.max_outstanding = 0
        self._ack = ack
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for delivery in self.source.deliveries():
            self.items.append(delivery)
            self.max_outstanding = max(self.max_outstanding, self.source.outstanding)
            if self._ack:
                await self.source.ack(delivery)

    async def wait_for(self, count: int, within_s: float = _WAIT_S) -> None:
        def done() -> bool:
            if self._task.done():
                self._task.result()
            return len(self.items) >= count

        await _until(done, f"{count} deliveries (have {len(self.items)})", within_s)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _pull(
    subscriber: pubsub_v1.SubscriberClient, subscription: str, want: int, timeout: float
) -> list[Any]:
    """Synchronous pull (and ack) of up to ``want`` messages within ``timeout``."""
    deadline = time.monotonic() + timeout
    got: list[Any] = []
    while len(got) < want and time.monotonic() < deadline:
        try:
            response = subscriber.pull(
                request={"subscription": subscription, "max_messages": want - len(got)},
                timeout=2,
            )
        except gexc.DeadlineExceeded:
            continue
        if not response.received_messages:
            time.sleep(0.1)
            continue
        subscriber.acknowledge(
            request={
                "subscription": subscription,
                "ack_ids": [m.ack_id for m in response.received_messages],
            }
        )
        got.extend(m.message for m in response.received_messages)
    return got


def _as_source(source: PubSubPullSource) -> Source:
    return source  # mypy checks that PubSubPullSource satisfies the Source protocol


async def test_every_message_is_delivered_and_acked_once(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-rt")
    source = make_source(names, max_messages=300)
    await _as_source(source).check()
    sent = {f"row-{i}".encode() * (1 + i % 7): {"seq": str(i)} for i in range(3000)}
    before = time.time()
    ids = await _publish(clients[0], names.topic, list(sent.items()))
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
        assert delivery.source == names.subscription
        assert delivery.delivery_attempt == 0
        assert before - 5 <= delivery.publish_time <= time.time() + 5
        assert delivery.size >= len(delivery.payload)
    assert collector.max_outstanding <= 300
    assert source.outstanding == 0 and source.unconfirmed == 0
    await source.close()
    assert await asyncio.to_thread(_pull, clients[1], names.subscription, 1, 2.0) == []


async def test_a_message_held_past_the_ack_deadline_is_not_redelivered(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-lease", ack_deadline_s=10)
    # Each extension is 10 s as well, so every missed one would show as a redelivery.
    source = make_source(names, max_lease_extension_s=10)
    await source.check()
    collector = Collector(source)
    [message_id] = await _publish(clients[0], names.topic, [(b"slow", {})])
    await collector.wait_for(1)
    # Holding the message unacked for 25 s (2.5 ack deadlines) is the point of this test.
    await asyncio.sleep(25)
    assert [d.message_id for d in collector.items] == [message_id]
    assert source.extension_calls >= 3
    await source.ack(collector.items[0])
    await collector.stop()


async def test_lease_is_dropped_after_max_lease_duration(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    """The control for the test above."""
    names = _create(pubsub, clients, "pull-expire", ack_deadline_s=10)
    source = make_source(names, max_lease_extension_s=10, max_lease_duration_s=2)
    collector = Collector(source)
    [message_id] = await _publish(clients[0], names.topic, [(b"too-slow", {})])
    await collector.wait_for(2, within_s=40)
    assert [d.message_id for d in collector.items[:2]] == [message_id, message_id]
    await source.ack(collector.items[1])
    await collector.stop()


async def test_nack_redelivers_promptly_and_attempts_are_counted(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-nack", ack_deadline_s=60, policy_attempts=5)
    source = make_source(names, max_delivery_attempts=1)
    [message_id] = await _publish(clients[0], names.topic, [(b"again", {"k": "v"})])
    iterator = source.deliveries()
    first = await _next(iterator)
    assert (first.message_id, first.delivery_attempt) == (message_id, 1)
    assert not source.exceeded_attempts(first)
    started = time.monotonic()
    await source.nack(first)
    second = await _next(iterator)
    assert time.monotonic() - started < 5  # not the 60 s ack deadline
    assert (second.message_id, second.payload, dict(second.attributes)) == (
        message_id,
        b"again",
        {"k": "v"},
    )
    assert second.delivery_attempt == 2
    assert source.exceeded_attempts(second)
    await source.ack(second)


async def test_close_gives_unsettled_messages_promptly_to_a_new_source(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-close", ack_deadline_s=60)
    source = make_source(names, max_lease_extension_s=60)
    ids = await _publish(clients[0], names.topic, [(f"c{i}".encode(), {}) for i in range(6)])
    iterator = source.deliveries()
    handed_out = [await _next(iterator) for _ in range(3)]
    await _until(lambda: source.outstanding == 6, "all 6 messages received")
    await source.ack(handed_out[0])

    await source.close()
    with pytest.raises(StopAsyncIteration):
        await _next(iterator)
    with pytest.raises(ValueError, match="not held"):
        await source.ack(handed_out[1])

    started = time.monotonic()
    successor = make_source(names)
    collector = Collector(successor, ack=True)
    await collector.wait_for(5, within_s=20)
    assert time.monotonic() - started < 10  # not the 60 s ack deadline
    assert sorted(d.message_id for d in collector.items) == sorted(ids[1:])
    await collector.stop()


async def test_dead_letter_carries_the_counted_attempt_and_acks_the_original(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-dlq", policy_attempts=10)
    source = make_source(names, max_delivery_attempts=2)
    await source.check()
    [message_id] = await _publish(clients[0], names.topic, [(b"\x00poison", {"data": "x"})])
    iterator = source.deliveries()
    attempts = []
    delivery = await _next(iterator)
    while not source.exceeded_attempts(delivery):
        attempts.append(delivery.delivery_attempt)
        await source.nack(delivery)
        delivery = await _next(iterator)
    attempts.append(delivery.delivery_attempt)
    assert attempts == [1, 2, 3]
    await source.dead_letter(
        delivery, DeadLetterReason(ReasonClass.TOO_MANY_ATTEMPTS, "delivered 3 times")
    )
    [dead] = await asyncio.to_thread(_pull, clients[1], names.dlq_subscription, 1, _WAIT_S)
    # ... and only once: nothing more comes within a quiet second and a half
    assert await asyncio.to_thread(_pull, clients[1], names.dlq_subscription, 1, 1.5) == []
    assert dead.data == b"\x00poison"
    attrs = dict(dead.attributes)
    assert attrs["data"] == "x"
    assert attrs[ATTR_REASON] == "too-many-attempts"
    assert attrs[ATTR_CODE] == "too_many_attempts"
    assert attrs[ATTR_MESSAGE_ID] == message_id
    assert attrs[ATTR_DELIVERY_ATTEMPT] == "3"
    await source.close()  # the ack is confirmed by now
    assert await asyncio.to_thread(_pull, clients[1], names.subscription, 1, 2.0) == []


async def test_flow_control_holds_at_max_messages(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-flow")
    source = make_source(names, max_messages=10)
    collector = Collector(source)
    ids = await _publish(clients[0], names.topic, [(f"m{i}".encode(), {}) for i in range(40)])
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


async def test_pause_stops_pulling(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-pause")
    source = make_source(names, max_messages=5)
    iterator = source.deliveries()
    ids = await _publish(clients[0], names.topic, [(f"p{i}".encode(), {}) for i in range(20)])
    first = await _next(iterator)
    await source.ack(first)
    source.pause()
    waiting = asyncio.ensure_future(anext(iterator))
    await asyncio.sleep(1.0)
    assert not waiting.done()
    assert source.outstanding <= 5
    held = source.outstanding
    await asyncio.sleep(0.5)
    assert source.outstanding == held  # nothing more pulled while paused
    source.resume()
    seen = [first.message_id]
    delivery = await asyncio.wait_for(waiting, _WAIT_S)
    while True:
        seen.append(delivery.message_id)
        await source.ack(delivery)
        if len(seen) == len(ids):
            break
        delivery = await _next(iterator)
    assert sorted(seen) == sorted(ids)


async def test_ordering_keys_are_delivered_in_order_one_at_a_time(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-order", ordering=True)
    source = make_source(names)
    await source.check()
    ids = await _publish(
        clients[0], names.topic, [(f"k{i}".encode(), {}) for i in range(5)], ordering_key="k"
    )
    iterator = source.deliveries()
    first = await _next(iterator)
    assert (first.message_id, first.ordering_key) == (ids[0], "k")
    waiting = asyncio.ensure_future(anext(iterator))
    await asyncio.sleep(0.5)
    assert not waiting.done()  # the key's next message waits until this one is settled
    await source.ack(first)
    second = await asyncio.wait_for(waiting, _WAIT_S)
    assert second.message_id == ids[1]
    await source.nack(second)  # it and those held behind it go back, and come back in order
    seen: list[str] = []
    while len(seen) < 4:
        delivery = await _next(iterator)
        seen.append(delivery.message_id)
        await source.ack(delivery)
    assert seen == ids[1:]


async def test_check_and_a_deleted_subscription(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pull-gone")
    missing = f"projects/{pubsub.project}/subscriptions/absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PubSubConfigError, match=f"subscription {missing} does not exist"):
        await make_source(names, subscription=missing).check()
    source = make_source(names)
    iterator = source.deliveries()
    await _publish(clients[0], names.topic, [(b"a", {})])
    await source.ack(await _next(iterator))
    await source.flush()  # confirmed before the subscription goes
    clients[1].delete_subscription(request={"subscription": names.subscription})
    # Pulls in flight (long polls) end within their 10 s deadline; the next one fails.
    with pytest.raises(PubSubPullError, match=f"pull on {names.subscription}.*404"):
        await _next(iterator, 60)


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
