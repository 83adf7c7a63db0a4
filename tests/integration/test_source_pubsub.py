"""``PubSubSource`` on Google's real Pub/Sub emulator: delivery, ack/nack, dead letters, lease
extension, flow control, pause, close and the start-up check.

Emulator quirk (cloud-pubsub-emulator 0.8.20): when a client cancels a streaming pull, the
emulator fails in ``onRstStreamRead`` (``NoSuchMethodError`` from its bundled gRPC, visible in
``.stack/test-run/logs/pubsub.log``) and keeps the dead stream registered. New and redelivered
messages keep going to that dead stream first and come back only after its ack deadline, so a
second streaming source on the same subscription cannot be used to check what the first one
left behind. Synchronous Pull is not affected: the checks after ``close()`` use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pstypes
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from rowbatch.consumer.sources.base import DeadLetterReason, Delivery, ReasonClass, Source
from rowbatch.consumer.sources.pubsub.dead_letters import DLQ_MESSAGE_MAX_BYTES
from rowbatch.consumer.sources.pubsub.errors import (
    PubSubConfigError,
    PubSubStreamError,
    PubSubUnreachable,
)
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
)

_WAIT_S = 30.0
_VERSION = "test-9.9.9"

Clients = tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]


@dataclass(frozen=True)
class Names:
    topic: str
    subscription: str
    dlq_topic: str
    dlq_subscription: str


@pytest.fixture
def clients(pubsub: PubSubEndpoint) -> Iterator[Clients]:
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
) -> Names:
    """A topic and subscription, plus a dead-letter topic with a subscription to read it. With
    ``policy_attempts`` the subscription gets a dead-letter policy (so attempts are counted)."""
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
        )
    )
    return names


SourceFactory = Callable[..., PubSubSource]


@pytest.fixture
async def make_source(
    pubsub: PubSubEndpoint, clients: Clients
) -> AsyncIterator[Callable[..., PubSubSource]]:
    """Builds sources on the endpoint's clients; closes them all at the end."""
    made: list[PubSubSource] = []

    def make(names: Names, **overrides: Any) -> PubSubSource:
        settings: dict[str, Any] = {
            "subscription": names.subscription,
            "dead_letter_topic": names.dlq_topic,
            **overrides,
        }
        source = PubSubSource(
            PubSubSettings(**settings),
            consumer_version=_VERSION,
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
    publisher: pubsub_v1.PublisherClient, topic: str, messages: list[tuple[bytes, dict[str, str]]]
) -> list[str]:
    """One Publish RPC (the plain GAPIC call: attributes are not keyword arguments here)."""
    api = GapicPublisherClient(transport=publisher.transport)
    request = pstypes.PublishRequest(
        topic=topic,
        messages=[pstypes.PubsubMessage(data=data, attributes=attrs) for data, attrs in messages],
    )
    response = await asyncio.to_thread(api.publish, request=request, timeout=_WAIT_S)
    return list(response.message_ids)


async def _next(iterator: AsyncIterator[Delivery], within_s: float = _WAIT_S) -> Delivery:
    return await asyncio.wait_for(anext(iterator), within_s)


async def _until(condition: Callable[[], bool], what: str, within_s: float = _WAIT_S) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class Collector:
    """Consumes ``deliveries()`` in the background, recording every delivery and the most
    deliveries outstanding (received, unsettled) at once."""

    def __init__(self, source: PubSubSource) -> None:
        self.source = source
        self.items: list[Delivery] = []
        self.max_outstanding = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for delivery in self.source.deliveries():
            self.items.append(delivery)
            self.max_outstanding = max(self.max_outstanding, self.source.outstanding)

    async def wait_for(self, count: int, within_s: float = _WAIT_S) -> None:
        def done() -> bool:
            if self._task.done():
                self._task.result()  # surfaces the iterator's error
            return len(self.items) >= count

        await _until(done, f"{count} deliveries (have {len(self.items)})", within_s)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def _pull(
    subscriber: pubsub_v1.SubscriberClient,
    subscription: str,
    want: int,
    timeout: float = _WAIT_S,
) -> list[Any]:
    """Synchronous pull (and ack) of up to ``want`` messages within ``timeout``: an independent
    reader for checks."""
    deadline = time.monotonic() + timeout
    got: list[Any] = []
    while len(got) < want and time.monotonic() < deadline:
        try:
            response = subscriber.pull(
                request={"subscription": subscription, "max_messages": want - len(got)},
                timeout=5,
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


def _as_source(source: PubSubSource) -> Source:
    return source  # mypy checks that PubSubSource satisfies the Source protocol


async def test_round_trip_500_messages_arrive_once_with_attributes(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "rt")
    source = _as_source(make_source(names, max_messages=100))
    assert isinstance(source, PubSubSource)
    await source.check()
    sent = {f"row-{i}".encode(): {"seq": str(i), "kind": "round-trip"} for i in range(500)}
    before = time.time()
    ids = await _publish(clients[0], names.topic, list(sent.items()))

    received: dict[str, Delivery] = {}
    duplicates: list[str] = []
    iterator = source.deliveries()
    while len(received) < len(sent):
        delivery = await _next(iterator)
        if delivery.message_id in received:
            duplicates.append(delivery.message_id)
        received[delivery.message_id] = delivery
        await source.ack(delivery)

    assert not duplicates
    assert set(received) == set(ids)
    assert {d.payload: dict(d.attributes) for d in received.values()} == sent
    for delivery in received.values():
        assert delivery.source == names.subscription
        assert delivery.delivery_attempt == 0  # no dead-letter policy: Pub/Sub does not count
        assert before - 5 <= delivery.publish_time <= time.time() + 5
        assert delivery.size >= len(delivery.payload)
    assert source.outstanding == 0


async def test_nack_redelivers_and_attempts_are_counted(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "nack", policy_attempts=5)
    source = make_source(names, max_delivery_attempts=1)
    [message_id] = await _publish(clients[0], names.topic, [(b"again", {"k": "v"})])
    iterator = source.deliveries()

    first = await _next(iterator)
    assert (first.message_id, first.delivery_attempt) == (message_id, 1)
    assert not source.exceeded_attempts(first)
    await source.nack(first)
    with pytest.raises(ValueError, match="not held"):
        await source.ack(first)

    second = await _next(iterator)
    assert second is not first
    assert (second.message_id, second.payload, dict(second.attributes)) == (
        message_id,
        b"again",
        {"k": "v"},
    )
    assert second.delivery_attempt == 2
    assert source.exceeded_attempts(second)
    await source.ack(second)


async def test_dead_letter_publishes_reason_and_acks_original(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "dlq")
    source = make_source(names)
    await source.check()
    # Attribute names that clash with keyword arguments of PublisherClient.publish.
    original = {"kind": "poison", "data": "clash", "timeout": "clash", "topic": "t"}
    [message_id] = await _publish(clients[0], names.topic, [(b"\x00not-json", original)])
    delivery = await _next(source.deliveries())
    ack_id = source._unsettled[delivery].message.ack_id  # private: to probe the ack below
    long_message = "column 'ß' is bad; " * 200  # > 1024 bytes, multi-byte characters
    before = datetime.now(UTC)

    await source.dead_letter(delivery, DeadLetterReason(ReasonClass.UNDECODABLE, long_message))
    assert source.outstanding == 0

    [dead] = await asyncio.to_thread(_pull, clients[1], names.dlq_subscription, 1)
    # ... and only once: nothing more comes within a quiet second and a half
    assert await asyncio.to_thread(_pull, clients[1], names.dlq_subscription, 1, 1.5) == []
    assert dead.data == b"\x00not-json"
    attrs = dict(dead.attributes)
    assert {k: attrs[k] for k in original} == original
    assert attrs[ATTR_REASON] == "undecodable"
    assert attrs[ATTR_CODE] == "wire_error"  # the class's default fine code
    assert long_message.startswith(attrs[ATTR_MESSAGE])
    assert 1000 < len(attrs[ATTR_MESSAGE].encode()) <= DLQ_MESSAGE_MAX_BYTES
    assert attrs[ATTR_SOURCE] == names.subscription
    assert attrs[ATTR_MESSAGE_ID] == message_id
    assert attrs[ATTR_DELIVERY_ATTEMPT] == "0"
    assert attrs[ATTR_CONSUMER_VERSION] == _VERSION
    assert attrs[ATTR_TIME].endswith("Z")
    stamped = datetime.fromisoformat(attrs[ATTR_TIME])
    assert before.timestamp() - 1 <= stamped.timestamp() <= time.time() + 1

    # The original was acked. close() flushes the client's queued acks; then a nack of the
    # original's ack id is a no-op, whereas a message that was merely held would come straight
    # back (a synchronous pull sees it at once: see the close() test).
    await source.close()
    with contextlib.suppress(gexc.GoogleAPICallError):
        clients[1].modify_ack_deadline(
            request={
                "subscription": names.subscription,
                "ack_ids": [ack_id],
                "ack_deadline_seconds": 0,
            }
        )
    assert await asyncio.to_thread(_pull, clients[1], names.subscription, 1, 2.0) == []


async def test_dead_letter_without_topic_nacks_for_the_subscription_policy(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    without_policy = _create(pubsub, clients, "nodlq")
    with pytest.raises(PubSubConfigError, match="no dead-letter policy"):
        await make_source(without_policy, dead_letter_topic=None).check()

    names = _create(pubsub, clients, "policy", policy_attempts=5)
    source = make_source(names, dead_letter_topic=None)
    await source.check()
    await _publish(clients[0], names.topic, [(b"poison", {})])
    iterator = source.deliveries()
    first = await _next(iterator)
    await source.dead_letter(first, DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "no column"))
    second = await _next(iterator)  # nacked: Pub/Sub redelivers until its policy moves it
    assert (second.message_id, second.delivery_attempt) == (first.message_id, 2)
    await source.ack(second)


async def test_leases_are_extended_while_a_message_is_held(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "lease", ack_deadline_s=10)
    # Each extension is 10 s too, so without the client's leaser the message would be
    # redelivered about 10 s after receipt.
    source = make_source(names, max_lease_extension_s=10)
    collector = Collector(source)
    [message_id] = await _publish(clients[0], names.topic, [(b"slow", {})])
    await collector.wait_for(1)

    # Holding the message unacked for 25 s (2.5 ack deadlines) is the point of this test; the
    # collector keeps reading deliveries meanwhile, so a redelivery would be recorded.
    await asyncio.sleep(25)

    assert [d.message_id for d in collector.items] == [message_id]
    await source.ack(collector.items[0])
    await collector.stop()


async def test_lease_is_dropped_after_max_lease_duration(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    """The control for the test above: once ``max_lease_duration_s`` has passed the client
    stops extending, and Pub/Sub redelivers the message to the same stream."""
    names = _create(pubsub, clients, "expire", ack_deadline_s=10)
    source = make_source(names, max_lease_extension_s=10, max_lease_duration_s=2)
    collector = Collector(source)
    [message_id] = await _publish(clients[0], names.topic, [(b"too-slow", {})])
    await collector.wait_for(2, within_s=60)
    assert [d.message_id for d in collector.items[:2]] == [message_id, message_id]
    await source.ack(collector.items[1])
    await collector.stop()


async def test_flow_control_bounds_outstanding_deliveries(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "flow")
    source = make_source(names, max_messages=10)
    collector = Collector(source)
    ids = await _publish(clients[0], names.topic, [(f"m{i}".encode(), {}) for i in range(40)])

    for wave in range(1, 5):
        await collector.wait_for(10 * wave)
        # A short window in which an 11th outstanding delivery would show up if flow control
        # let it through.
        await asyncio.sleep(0.5)
        assert len(collector.items) == 10 * wave
        assert source.outstanding == 10
        for delivery in collector.items[-10:]:
            await source.ack(delivery)

    assert collector.max_outstanding == 10
    assert {d.message_id for d in collector.items} == set(ids)
    await collector.stop()


async def test_pause_stops_yielding_and_flow_control_stops_the_stream(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "pause")
    source = make_source(names, max_messages=5)
    ids = await _publish(clients[0], names.topic, [(f"p{i}".encode(), {}) for i in range(20)])
    iterator = source.deliveries()
    first = await _next(iterator)
    await source.ack(first)

    source.pause()
    assert source.paused
    waiting = asyncio.ensure_future(anext(iterator))
    await _until(lambda: source.buffered == 5, "the buffer to fill up to max_messages")
    # A window in which more would arrive if flow control did not stop the stream.
    await asyncio.sleep(1.0)
    assert not waiting.done()
    assert (source.buffered, source.outstanding) == (5, 5)

    source.resume()
    assert not source.paused
    seen = [first.message_id]
    delivery = await asyncio.wait_for(waiting, _WAIT_S)
    while True:
        seen.append(delivery.message_id)
        await source.ack(delivery)
        if len(seen) == len(ids):
            break
        delivery = await _next(iterator)
    assert sorted(seen) == sorted(ids)


async def test_buffered_delivery_past_its_lease_is_replaced_by_a_fresh_one(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "stale", policy_attempts=5)
    source = make_source(names, max_lease_duration_s=1)
    [message_id] = await _publish(clients[0], names.topic, [(b"stale", {})])
    source.pause()
    iterator = source.deliveries()
    waiting = asyncio.ensure_future(anext(iterator))
    await _until(lambda: source.buffered == 1, "the message to be buffered")
    # Kept in the buffer past max_lease_duration_s (1 s): the client stops extending its lease.
    await asyncio.sleep(1.5)
    source.resume()
    fresh = await asyncio.wait_for(waiting, _WAIT_S)
    assert (fresh.message_id, fresh.delivery_attempt) == (message_id, 2)
    await source.ack(fresh)


async def test_deleted_subscription_ends_deliveries_with_an_error(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "gone")
    source = make_source(names)
    iterator = source.deliveries()
    await _publish(clients[0], names.topic, [(b"a", {})])
    await source.ack(await _next(iterator))
    clients[1].delete_subscription(request={"subscription": names.subscription})
    with pytest.raises(PubSubStreamError, match=f"streaming pull on {names.subscription}"):
        await _next(iterator)


async def test_close_nacks_unsettled_for_prompt_redelivery(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "close")
    # 60 s leases: messages not nacked on close would stay away for about a minute.
    source = make_source(names, max_lease_extension_s=60)
    ids = await _publish(clients[0], names.topic, [(f"c{i}".encode(), {}) for i in range(6)])
    iterator = source.deliveries()
    handed_out = [await _next(iterator) for _ in range(3)]
    await _until(lambda: source.outstanding == 6, "all 6 messages received")
    assert source.buffered == 3

    await source.close()
    with pytest.raises(StopAsyncIteration):
        await _next(iterator)
    with pytest.raises(ValueError, match="not held"):
        await source.ack(handed_out[0])

    # Read back with a synchronous pull: the emulator keeps routing new streaming deliveries
    # to a cancelled stream (see the module docstring), so a new source would not see them.
    started = time.monotonic()
    redelivered = await asyncio.to_thread(_pull, clients[1], names.subscription, 6)
    assert sorted(m.message_id for m in redelivered) == sorted(ids)
    assert time.monotonic() - started < 20


async def test_check_names_missing_subscription(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "chk")
    missing = f"projects/{pubsub.project}/subscriptions/absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PubSubConfigError, match=f"subscription {missing} does not exist"):
        await make_source(names, subscription=missing).check()


async def test_check_names_missing_dead_letter_topic(
    clients: Clients, make_source: SourceFactory, pubsub: PubSubEndpoint
) -> None:
    names = _create(pubsub, clients, "chkdlq")
    missing = f"projects/{pubsub.project}/topics/absent-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PubSubConfigError, match=f"dead-letter topic {missing} does not exist"):
        await make_source(names, dead_letter_topic=missing).check()


async def test_check_names_unreachable_host(pubsub: PubSubEndpoint) -> None:
    nowhere = PubSubEndpoint(host=f"127.0.0.1:{free_port()}", project="rowbatch", kind="emulator")
    publisher, subscriber = nowhere.publisher(), nowhere.subscriber()
    source = PubSubSource(
        PubSubSettings(
            subscription="projects/rowbatch/subscriptions/any",
            dead_letter_topic="projects/rowbatch/topics/any-dlq",
            check_timeout_s=1.0,
        ),
        publisher=publisher,
        subscriber=subscriber,
        host=nowhere.host,
    )
    try:
        with pytest.raises(PubSubUnreachable, match=f"Pub/Sub at {nowhere.host} did not answer"):
            await source.check()
    finally:
        await source.close()
        publisher.transport.close()
        subscriber.close()
