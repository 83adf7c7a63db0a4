"""One behaviour suite, run against every source (the ``Source`` Protocol of
``rowbatch/consumer/sources/base.py``): Pub/Sub unary pull and Pub/Sub streaming pull on the real
emulator, and Kafka on the real broker. Each source is built the way the service builds it,
by ``make_source`` from the ``[source]`` settings.

What every source promises here: each published message is delivered, with its fields
filled (id, payload, the producer's chunk attributes/headers, publish time, a counted first
attempt); a settled message (acked or dead-lettered) is never delivered again, not even to a
fresh source on the same subscription/group; ``nack`` redelivers it with the attempt counted
(the nacked delivery cannot be acked any more), and ``exceeded_attempts`` says when a delivery
is past ``max_delivery_attempts``; ``dead_letter`` publishes the original plus the
``rowbatch-dlq-*`` reason attributes/headers; ``pause`` stops deliveries and ``resume``
restarts them; ``close`` gives back what is unsettled so a new source gets it promptly;
``check`` names a missing subscription, topic or dead-letter topic, and the address of a broker
that does not answer.

Pub/Sub counts delivery attempts only on a subscription with a dead-letter policy, so the
Pub/Sub subscriptions here have one (5 attempts; no test gets past 3); Kafka counts locally.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pytest

from harness.kafka import KafkaEndpoint
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from rowbatch.consumer.service.build_io import make_source
from rowbatch.consumer.service.config import SourceSettings
from rowbatch.consumer.sources.base import Source, SourceConfigError, SourceUnreachable
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka.errors import KafkaConfigError, KafkaUnreachable
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.errors import PubSubConfigError, PubSubUnreachable
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
    ReasonClass,
)
from tests.integration.consumer_helpers import Topics
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, produce, read_all
from tests.integration.publish_helpers import REQUIRED_HEADERS
from tests.integration.pubsub_helpers import use_emulator

WAIT_S = 30.0
"""Upper bound for anything that should happen (a delivery, a redelivery)."""
QUIET_S = 1.5
"""How long "nothing arrives" is watched where absence is the contract (pause)."""
PROMPT_S = 5.0
"""A message given back at close reaches a new source within this: well below what it would
take without the give-back (a 60 s lease on Pub/Sub, the 10 s session timeout on Kafka)."""

DeadLetter = tuple[bytes, dict[str, str]]
"""A message read back from the dead-letter topic: payload and attributes (Kafka headers
decoded as UTF-8)."""


class Broker(Protocol):
    """One kind of source on a fresh topic (with its subscription/group and dead-letter
    topic): its settings, and the broker-side helpers the tests need."""

    long_leases: dict[str, Any]
    """Setting overrides under which a message held (leased) but neither acked nor nacked
    stays away from other consumers far longer than ``PROMPT_S``."""
    lost_ack_shows_s: float
    """How long after an ack a message whose ack never reached the broker would be delivered
    again: how long "settled messages do not come back" must be watched."""
    config_error: type[SourceConfigError]
    """What ``check`` raises for a subscription/topic that does not exist."""

    @property
    def given_back_within_s(self) -> float:
        """How soon after ``close`` a fresh consumer gets what the closed one left unsettled."""
        ...

    @property
    def source_name(self) -> str:
        """``Delivery.source`` of what is delivered here (the topic has one partition)."""
        ...

    def settings(self, **overrides: Any) -> SourceSettings: ...

    async def publish(self, chunks: Sequence[EncodedChunk]) -> list[str]:
        """Publishes; returns the ids the source will report (``Delivery.message_id``)."""
        ...

    async def dead_letters(self, expect: int) -> list[DeadLetter]:
        """Everything in the dead-letter topic (the exact count: waits for ``expect``, then
        for a quiet spell, where the broker cannot say how many there are)."""
        ...

    def missing(self) -> list[tuple[SourceSettings, str]]:
        """Settings naming a subscription/topic, then a dead-letter topic, that do not exist,
        each with what ``check``'s error must say (naming it)."""
        ...

    def close(self) -> None: ...


@dataclass
class PubSubBroker:
    endpoint: PubSubEndpoint
    topics: Topics
    mode: str
    long_leases: dict[str, Any] = field(default_factory=lambda: {"max_lease_extension_s": 60})
    lost_ack_shows_s: float = 12.0
    """The held message's lease (10 s, ``max_lease_extension_s``) lapses, plus a margin."""
    config_error: type[SourceConfigError] = PubSubConfigError

    @property
    def given_back_within_s(self) -> float:
        """Streaming: ``PROMPT_S`` (the nacks). Pull: a Pull still waiting on an empty
        subscription at close is cancelled after ``close_pull_wait_s``; the server may hand
        it the nacked messages before it sees the cancellation, and those come back only
        after the subscription's ack deadline (10 s here; see ``close_pull_wait_s``)."""
        return PROMPT_S if self.mode == "streaming" else 10.0 + PROMPT_S

    @classmethod
    def create(cls, endpoint: PubSubEndpoint, mode: str) -> PubSubBroker:
        topics = Topics.create(endpoint, ack_deadline_s=10, policy_max_attempts=5)
        return cls(endpoint, topics, mode)

    def settings(self, **overrides: Any) -> SourceSettings:
        values: dict[str, Any] = {
            "subscription": self.topics.subscription,
            "dead_letter_topic": self.topics.dlq_topic,
            "mode": self.mode,
            "max_lease_extension_s": 10,
            **overrides,
        }
        return PubSubSettings(**values)

    @property
    def source_name(self) -> str:
        return self.topics.subscription

    async def publish(self, chunks: Sequence[EncodedChunk]) -> list[str]:
        return await asyncio.to_thread(self.topics.publish, chunks)

    async def dead_letters(self, expect: int) -> list[DeadLetter]:
        got = await asyncio.to_thread(self.topics.dead_letters, expect, WAIT_S)
        return [(bytes(m.data), dict(m.attributes)) for m in got]

    def missing(self) -> list[tuple[SourceSettings, str]]:
        project = self.endpoint.project
        unique = uuid.uuid4().hex[:8]
        subscription = f"projects/{project}/subscriptions/absent-{unique}"
        dlq_topic = f"projects/{project}/topics/absent-{unique}"
        return [
            (
                self.settings(subscription=subscription),
                f"subscription {subscription} does not exist",
            ),
            (
                self.settings(dead_letter_topic=dlq_topic),
                f"dead-letter topic {dlq_topic} does not exist",
            ),
        ]

    def close(self) -> None:
        self.topics.close()


@dataclass
class KafkaBroker:
    topics: KafkaTopics
    long_leases: dict[str, Any] = field(default_factory=dict)
    """A closed member that did not leave the group keeps its partition until its 10 s
    session times out (the default ``session_timeout_ms``)."""
    lost_ack_shows_s: float = 0.0
    """Nothing to wait for: close commits, so a fresh member starts past what was acked."""
    config_error: type[SourceConfigError] = KafkaConfigError
    given_back_within_s: float = PROMPT_S

    def settings(self, **overrides: Any) -> SourceSettings:
        t = self.topics
        values: dict[str, Any] = {
            "bootstrap_servers": t.bootstrap,
            "topic": t.topic,
            "group_id": t.group,
            "dead_letter_topic": t.dlq,
            "commit_interval_s": 0.2,
            "redelivery_backoff_s": 0.2,
            "revoke_grace_s": 1.0,
            "heartbeat_interval_ms": 500,
            **overrides,
        }
        return KafkaSettings(**values)

    @property
    def source_name(self) -> str:
        return f"{self.topics.topic}/0"

    async def publish(self, chunks: Sequence[EncodedChunk]) -> list[str]:
        t = self.topics
        sent = await produce(t.endpoint, t.topic, [chunk_record(c) for c in chunks])
        return [f"{m.topic}/{m.partition}/{m.offset}" for m in sent]

    async def dead_letters(self, expect: int) -> list[DeadLetter]:
        records = await read_all(self.topics.endpoint, self.topics.dlq, timeout_s=WAIT_S)
        return [(r.value, {k: v.decode() for k, v in r.headers}) for r in records]

    def missing(self) -> list[tuple[SourceSettings, str]]:
        absent = f"absent-{uuid.uuid4().hex[:8]}"
        dlq = f"{absent}.dlq"
        return [
            (self.settings(topic=absent), f"topic {absent!r} does not exist"),
            (self.settings(dead_letter_topic=dlq), f"topic {dlq!r} does not exist"),
        ]

    def close(self) -> None:
        pass


@dataclass
class Sources:
    """Builds sources on one broker through the service's ``make_source``; closes them all
    at the end of the test."""

    broker: Broker
    made: list[Source] = field(default_factory=list)

    def make(self, settings: SourceSettings | None = None, **overrides: Any) -> Source:
        source = make_source(settings or self.broker.settings(**overrides))
        self.made.append(source)
        return source


@pytest.fixture(params=["pubsub-pull", "pubsub-streaming", "kafka"])
async def sources(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Sources]:
    broker: Broker
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        broker = KafkaBroker(await KafkaTopics.create(kafka, partitions=1))
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
        use_emulator(pubsub, monkeypatch)  # the sources build their clients from it
        mode = request.param.removeprefix("pubsub-")
        broker = await asyncio.to_thread(PubSubBroker.create, pubsub, mode)
    made = Sources(broker)
    try:
        yield made
    finally:
        for source in made.made:
            await source.close()
        broker.close()


_ROWS = itertools.count(0, 3)
"""First ``id`` of each chunk: unique across the session."""


def chunks(n: int) -> list[EncodedChunk]:
    """``n`` small chunks as the producer encodes them, alternately Arrow and JSON, each with
    its chunk headers (table, chunk id, row count, format version...)."""
    out = []
    for i in range(n):
        start = next(_ROWS)
        columns = {
            "id": np.arange(start, start + 3, dtype=np.int64),
            "text": [f"row {start} ✓", "", "a,b"],
        }
        out.append(encode_chunk("events", columns, "json" if i % 2 else "arrow"))
    return out


async def take(
    iterator: AsyncIterator[Delivery], n: int, within_s: float = WAIT_S
) -> list[Delivery]:
    got: list[Delivery] = []
    try:
        async with asyncio.timeout(within_s):
            while len(got) < n:
                got.append(await anext(iterator))
    except TimeoutError:
        raise AssertionError(f"{len(got)} of {n} deliveries within {within_s:g} s") from None
    return got


async def nothing_within(iterator: AsyncIterator[Delivery], seconds: float) -> None:
    """No delivery for ``seconds`` (a bounded check where absence is the contract)."""
    if seconds <= 0:
        return
    try:
        extra = await asyncio.wait_for(anext(iterator), seconds)
    except TimeoutError:
        return
    raise AssertionError(
        f"unexpected delivery {extra.message_id} (attempt {extra.delivery_attempt})"
    )


async def test_every_message_is_delivered_once_with_its_fields(sources: Sources) -> None:
    source = sources.make()
    await source.check()
    sent = chunks(8)
    before = time.time()
    ids = await sources.broker.publish(sent)
    after = time.time()
    iterator = source.deliveries()
    got = await take(iterator, len(sent))
    for delivery in got:
        await source.ack(delivery)
    await nothing_within(iterator, QUIET_S)

    assert sorted(d.message_id for d in got) == sorted(ids)  # each once
    by_id = dict(zip(ids, sent, strict=True))
    for delivery in got:
        chunk = by_id[delivery.message_id]
        assert delivery.payload == chunk.payload
        assert isinstance(delivery.payload, bytes)
        assert dict(delivery.attributes) == chunk.attributes
        assert set(delivery.attributes) >= REQUIRED_HEADERS
        assert before - 5 <= delivery.publish_time <= after + 5
        assert delivery.delivery_attempt == 1
        assert delivery.source == sources.broker.source_name
        assert delivery.size >= len(delivery.payload)


async def test_settled_messages_are_not_delivered_again(sources: Sources) -> None:
    """Acked and dead-lettered messages stay settled: a fresh source on the same
    subscription/group gets only what is published afterwards."""
    source = sources.make()
    await sources.broker.publish(chunks(3))
    acked, dead, acked_too = await take(source.deliveries(), 3)
    await source.ack(acked)
    await source.dead_letter(dead, DeadLetterReason(ReasonClass.UNDECODABLE, "not a chunk"))
    await source.ack(acked_too)
    settled_at = time.monotonic()
    await source.close()

    fresh = sources.make()
    iterator = fresh.deliveries()
    [marker_id] = await sources.broker.publish(chunks(1))
    [first] = await take(iterator, 1)
    assert first.message_id == marker_id, "a settled message came back"
    await fresh.ack(first)
    # Watched until a lost ack would have shown (the lease of a message held but never
    # acked on the broker lapses), and at least a short quiet spell.
    watch = max(QUIET_S, settled_at + sources.broker.lost_ack_shows_s - time.monotonic())
    await nothing_within(iterator, watch)


@runtime_checkable
class CountsAttempts(Protocol):
    """Not in ``Source``, but every source has it (the intake could ask it)."""

    def exceeded_attempts(self, delivery: Delivery) -> bool: ...


async def test_nack_redelivers_with_the_attempt_counted(sources: Sources) -> None:
    source = sources.make(max_delivery_attempts=2, **sources.broker.long_leases)
    assert isinstance(source, CountsAttempts)
    [sent] = chunks(1)
    [message_id] = await sources.broker.publish([sent])
    iterator = source.deliveries()
    [first] = await take(iterator, 1)
    assert (first.message_id, first.delivery_attempt) == (message_id, 1)
    assert not source.exceeded_attempts(first)
    await source.nack(first)
    with pytest.raises(ValueError, match="not held"):
        await source.ack(first)  # settled by the nack
    [second] = await take(iterator, 1, within_s=PROMPT_S)  # given back, not lapsed
    assert second is not first
    assert (second.message_id, second.payload, dict(second.attributes)) == (
        message_id,
        sent.payload,
        sent.attributes,
    )
    assert second.delivery_attempt == 2
    assert not source.exceeded_attempts(second)  # at max_delivery_attempts, not past it
    await source.nack(second)
    [third] = await take(iterator, 1, within_s=PROMPT_S)
    assert (third.message_id, third.delivery_attempt) == (message_id, 3)
    assert source.exceeded_attempts(third)
    await source.ack(third)
    await nothing_within(iterator, QUIET_S)


async def test_dead_letter_publishes_the_original_with_the_reason(sources: Sources) -> None:
    source = sources.make()
    [sent] = chunks(1)
    await sources.broker.publish([sent])
    iterator = source.deliveries()
    [first] = await take(iterator, 1)
    await source.nack(first)
    [delivery] = await take(iterator, 1)
    reason = DeadLetterReason(
        ReasonClass.SCHEMA_MISMATCH, "column 'text' is string, want float32", code="type_x"
    )
    before = time.time()
    await source.dead_letter(delivery, reason)

    [(payload, attributes)] = await sources.broker.dead_letters(1)
    assert payload == sent.payload
    assert {k: attributes[k] for k in sent.attributes} == sent.attributes
    assert attributes[ATTR_REASON] == "schema-mismatch"
    assert attributes[ATTR_CODE] == "type_x"
    assert attributes[ATTR_MESSAGE] == "column 'text' is string, want float32"
    assert attributes[ATTR_SOURCE] == delivery.source
    assert attributes[ATTR_MESSAGE_ID] == delivery.message_id
    assert attributes[ATTR_DELIVERY_ATTEMPT] == "2"
    assert attributes[ATTR_CONSUMER_VERSION]
    assert attributes[ATTR_TIME].endswith("Z")
    stamped = datetime.fromisoformat(attributes[ATTR_TIME]).timestamp()
    assert before - 5 <= stamped <= time.time() + 5
    await nothing_within(iterator, QUIET_S)  # settled: not redelivered to this source either


async def test_pause_stops_deliveries_and_resume_restarts_them(sources: Sources) -> None:
    source = sources.make()
    iterator = source.deliveries()
    await sources.broker.publish(chunks(1))
    [first] = await take(iterator, 1)
    await source.ack(first)

    source.pause()
    ids = await sources.broker.publish(chunks(3))
    waiting = asyncio.ensure_future(anext(iterator))
    try:
        await asyncio.wait({waiting}, timeout=QUIET_S)
        assert not waiting.done(), "delivered while paused"
    except BaseException:
        waiting.cancel()
        raise
    source.resume()
    got = [await asyncio.wait_for(waiting, WAIT_S), *await take(iterator, 2)]
    assert sorted(d.message_id for d in got) == sorted(ids)
    for delivery in got:
        await source.ack(delivery)


async def test_close_gives_unsettled_messages_to_a_new_source_promptly(
    sources: Sources,
) -> None:
    source = sources.make(**sources.broker.long_leases)
    ids = await sources.broker.publish(chunks(6))
    iterator = source.deliveries()
    handed_out = await take(iterator, 3)
    await source.ack(handed_out[0])
    await source.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(iterator), WAIT_S)

    closed_at = time.monotonic()
    fresh = sources.make()
    within_s = sources.broker.given_back_within_s
    got = await take(fresh.deliveries(), 5, within_s=within_s)
    assert time.monotonic() - closed_at < within_s
    assert sorted(d.message_id for d in got) == sorted(set(ids) - {handed_out[0].message_id})
    for delivery in got:
        await fresh.ack(delivery)


async def test_check_names_what_is_missing(sources: Sources) -> None:
    await sources.make().check()
    for settings, says in sources.broker.missing():
        with pytest.raises(sources.broker.config_error, match=re.escape(says)):
            await sources.make(settings).check()


@pytest.mark.parametrize("kind", ["pubsub-pull", "pubsub-streaming", "kafka"])
async def test_check_names_the_address_of_a_broker_that_does_not_answer(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No broker needed: nothing listens at the address (Pub/Sub: ``PUBSUB_EMULATOR_HOST``,
    where the sources find the emulator)."""
    address = f"127.0.0.1:{free_port()}"
    settings: SourceSettings
    error: type[SourceUnreachable]
    if kind == "kafka":
        settings = KafkaSettings(
            bootstrap_servers=address, topic="t", group_id="g", check_timeout_s=3.0
        )
        error, says = KafkaUnreachable, f"cannot reach Kafka at {address}"
    else:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", address)
        settings = PubSubSettings.model_validate(
            {
                "subscription": "projects/rowbatch/subscriptions/any",
                "dead_letter_topic": "projects/rowbatch/topics/any-dlq",
                "mode": kind.removeprefix("pubsub-"),
                "check_timeout_s": 1.0,
            }
        )
        error, says = PubSubUnreachable, f"Pub/Sub at {address} did not answer"
    source = make_source(settings)
    started = time.monotonic()
    try:
        with pytest.raises(error, match=re.escape(says)):
            await source.check()
    finally:
        await source.close()
    assert time.monotonic() - started < 15
