"""Shared by the Pub/Sub source tests on the real emulator: fresh topics and sources built on
them (all closed at the end of the test), publishing with attributes and ordering keys,
reading a subscription back with synchronous Pull, and waiting for deliveries."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import pytest
from google.api_core import exceptions as gexc
from google.pubsub_v1 import types as pstypes
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from harness.pubsub import PubSubEndpoint
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource
from tests.integration.consumer_helpers import Topics

WAIT_S = 30.0
"""Upper bound for anything that should happen (a delivery, a redelivery)."""
VERSION = "test-9.9.9"
"""The consumer version the sources here write to ``rowbatch-dlq-consumer-version``."""

Message = tuple[bytes, Mapping[str, str]]
S = TypeVar("S", PubSubSource, PubSubPullSource)


def use_emulator(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Puts the emulator's address in the environment, for clients built in this process
    (the sources build theirs from ``PUBSUB_EMULATOR_HOST``, as in production)."""
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)


@dataclass
class PubSubBench(Generic[S]):
    """Fresh topics on the emulator and sources of one kind on them: streaming sources on each
    topic's own clients, pull sources on their own channel to the emulator (from the
    environment); ``close`` closes every source, then every topic's clients."""

    endpoint: PubSubEndpoint
    kind: type[S]
    _topics: list[Topics] = field(default_factory=list)
    _sources: list[S] = field(default_factory=list)

    def topics(
        self,
        *,
        ack_deadline_s: int = 10,
        policy_attempts: int | None = None,
        ordering: bool = False,
    ) -> Topics:
        """A topic and subscription, plus a dead-letter topic with a subscription to read it.
        With ``policy_attempts`` the subscription gets a dead-letter policy (so Pub/Sub counts
        attempts)."""
        t = Topics.create(
            self.endpoint,
            ack_deadline_s=ack_deadline_s,
            policy_max_attempts=policy_attempts,
            ordering=ordering,
        )
        self._topics.append(t)
        return t

    def source(self, topics: Topics, **overrides: Any) -> S:
        """A source on ``topics``' subscription and dead-letter topic; ``overrides`` are
        further ``PubSubSettings``."""
        settings: dict[str, Any] = {
            "subscription": topics.subscription,
            "dead_letter_topic": topics.dlq_topic,
            **overrides,
        }
        clients: dict[str, Any] = {}
        if self.kind is PubSubSource:  # the pull source builds its own channel, as in production
            clients = {"publisher": topics.publisher, "subscriber": topics.subscriber}
        source = self.kind(
            PubSubSettings(**settings), consumer_version=VERSION, host=self.endpoint.host, **clients
        )
        self._sources.append(source)
        return source

    async def close(self) -> None:
        for source in self._sources:
            await source.close()
        for t in self._topics:
            t.close()


@contextlib.asynccontextmanager
async def pubsub_bench(
    pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch, kind: type[S]
) -> AsyncIterator[PubSubBench[S]]:
    """What a test module's fixture yields: a :class:`PubSubBench`, closed afterwards."""
    use_emulator(pubsub, monkeypatch)
    bench = PubSubBench(pubsub, kind)
    try:
        yield bench
    finally:
        await bench.close()


def numbered(prefix: str, n: int) -> list[Message]:
    """``n`` messages ``<prefix>0``, ``<prefix>1``, ... without attributes."""
    return [(f"{prefix}{i}".encode(), {}) for i in range(n)]


async def publish(topics: Topics, messages: Sequence[Message], ordering_key: str = "") -> list[str]:
    """Publishes with the plain GAPIC call (attributes are not keyword arguments there, so
    names such as ``data`` or ``timeout`` are fine), 1,000 messages per RPC; returns the ids."""
    api = GapicPublisherClient(transport=topics.publisher.transport)
    ids: list[str] = []
    for start in range(0, len(messages), 1000):
        request = pstypes.PublishRequest(
            topic=topics.topic,
            messages=[
                pstypes.PubsubMessage(data=data, attributes=dict(attrs), ordering_key=ordering_key)
                for data, attrs in messages[start : start + 1000]
            ],
        )
        response = await asyncio.to_thread(api.publish, request=request, timeout=WAIT_S)
        ids.extend(response.message_ids)
    return ids


async def pull(topics: Topics, subscription: str, want: int, within_s: float = WAIT_S) -> list[Any]:
    """Synchronous Pull (and ack) of up to ``want`` messages of ``subscription`` within
    ``within_s``: a reader independent of the source under test."""
    return await asyncio.to_thread(_pull, topics, subscription, want, within_s)


def _pull(topics: Topics, subscription: str, want: int, timeout: float) -> list[Any]:
    subscriber = topics.subscriber
    deadline = time.monotonic() + timeout
    got: list[Any] = []
    while len(got) < want and time.monotonic() < deadline:
        try:
            response = subscriber.pull(
                request={"subscription": subscription, "max_messages": want - len(got)},
                timeout=min(5.0, timeout),
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


async def next_delivery(iterator: AsyncIterator[Delivery], within_s: float = WAIT_S) -> Delivery:
    return await asyncio.wait_for(anext(iterator), within_s)


async def until(condition: Callable[[], bool], what: str, within_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


class CountingSource(Protocol):
    """What :class:`Collector` reads: deliveries, and how many are outstanding."""

    def deliveries(self) -> AsyncIterator[Delivery]: ...

    async def ack(self, delivery: Delivery) -> None: ...

    @property
    def outstanding(self) -> int: ...


class Collector:
    """Consumes ``deliveries()`` in the background, recording every delivery (redeliveries
    included) and the most deliveries outstanding (received, unsettled) at once; acks each
    one with ``ack=True``."""

    def __init__(self, source: CountingSource, ack: bool = False) -> None:
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

    async def wait_for(self, count: int, within_s: float = WAIT_S) -> None:
        def done() -> bool:
            if self._task.done():
                self._task.result()  # surfaces the iterator's error
            return len(self.items) >= count

        await until(done, f"{count} deliveries (have {len(self.items)})", within_s)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
