"""Fakes for the publishing side: a :class:`FakePublisher` behind the ``Publisher`` protocol,
and stand-ins for the google-cloud-pubsub and aiokafka clients, plus a helper that decodes and
reassembles published messages."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowbatch.producer.publishers.errors import PublishFailed, TopicNotFound
from rowbatch.producer.publishers.messages import Message, chunk_id_of
from rowbatch.wire.chunks.decode import decode_chunk


@dataclass
class Sent:
    payload: bytes
    attributes: dict[str, str]
    key: str | None


class FakePublisher:
    """Records every message; ``fail_at`` makes the n-th publish (0-based) fail permanently;
    ``start_error`` makes start() raise; ``delay_s`` makes each publish take that long."""

    broker = "fake"

    def __init__(
        self,
        topic: str = "fake-topic",
        *,
        max_chunk_bytes: int = 10_000_000,
        fail_at: int | None = None,
        start_error: Exception | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.topic = topic
        self.address = "fake:0"
        self.max_chunk_bytes = max_chunk_bytes
        self.fail_at = fail_at
        self.start_error = start_error
        self.delay_s = delay_s
        self.sent: list[Sent] = []
        self.started = False
        self.closed = False
        self.flushed = 0
        self.in_flight = 0
        self.max_seen_in_flight = 0
        self._calls = 0

    async def start(self) -> None:
        if self.start_error is not None:
            raise self.start_error
        self.started = True

    async def publish(self, message: Message, *, key: str | None = None) -> str:
        assert self.started and not self.closed
        n = self._calls
        self._calls += 1
        self.in_flight += 1
        self.max_seen_in_flight = max(self.max_seen_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            else:
                await asyncio.sleep(0)
            if self.fail_at is not None and n >= self.fail_at:
                raise PublishFailed(
                    f"fake topic {self.topic!r} refused chunk {chunk_id_of(message)!r}",
                    topic=self.topic,
                )
            self.sent.append(Sent(bytes(message.payload), dict(message.attributes), key))
            return f"msg-{n}"
        finally:
            self.in_flight -= 1

    async def flush(self) -> None:
        self.flushed += 1

    async def close(self) -> None:
        self.closed = True


def reassemble(
    messages: Iterable[tuple[bytes, Mapping[str, str]]], key: str = "id"
) -> dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]:
    """Decodes every message and returns, per column, (values, null mask) in ``key`` order."""
    parts: dict[str, list[np.ndarray[Any, Any]]] = {}
    masks: dict[str, list[np.ndarray[Any, Any]]] = {}
    for payload, attributes in messages:
        chunk = decode_chunk(payload, attributes)
        for name, values in chunk.columns.items():
            parts.setdefault(name, []).append(np.asarray(values))
            mask = chunk.null_masks.get(name)
            masks.setdefault(name, []).append(
                np.zeros(chunk.row_count, dtype=np.bool_) if mask is None else np.asarray(mask)
            )
    if not parts:
        return {}
    order = np.argsort(np.concatenate(parts[key]), kind="stable")
    return {
        name: (np.concatenate(parts[name])[order], np.concatenate(masks[name])[order])
        for name in parts
    }


# --- google-cloud-pubsub stand-in -------------------------------------------------------------


@dataclass
class PubSubCall:
    topic: str
    data: bytes
    ordering_key: str
    retry: object
    timeout: object
    attrs: dict[str, str]


@dataclass
class FakePubSubClient:
    """Answers ``publish`` with ``outcomes`` in order (an exception fails that attempt, a
    string is the message id; when they run out, ids are made up); ``get_topic_errors`` are
    raised by ``get_topic`` in order, then it answers. ``block`` makes publish wait (as flow
    control would) until it is set."""

    outcomes: list[object] = field(default_factory=list)
    get_topic_errors: list[Exception] = field(default_factory=list)
    get_topic_forever: Exception | None = None
    block: threading.Event | None = None
    calls: list[PubSubCall] = field(default_factory=list)
    resumed: list[tuple[str, str]] = field(default_factory=list)
    get_topic_calls: int = 0
    stopped: bool = False
    api_endpoint: str = "fake-pubsub:443"
    on_publish: Callable[[], None] | None = None

    def publish(
        self,
        topic: str,
        data: bytes,
        ordering_key: str = "",
        retry: object = None,
        timeout: object = None,
        **attrs: str,
    ) -> concurrent.futures.Future[str]:
        if self.block is not None:
            assert self.block.wait(10), "the test never released the blocked publish"
        self.calls.append(PubSubCall(topic, data, ordering_key, retry, timeout, dict(attrs)))
        future: concurrent.futures.Future[str] = concurrent.futures.Future()
        outcome: object = self.outcomes.pop(0) if self.outcomes else f"id-{len(self.calls)}"
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(str(outcome))
        return future

    def get_topic(self, request: Mapping[str, str], retry: object, timeout: float) -> object:
        self.get_topic_calls += 1
        if self.get_topic_errors:
            raise self.get_topic_errors.pop(0)
        if self.get_topic_forever is not None:
            raise self.get_topic_forever
        return {"name": request["topic"]}

    def resume_publish(self, topic: str, ordering_key: str) -> None:
        self.resumed.append((topic, ordering_key))

    def stop(self) -> None:
        self.stopped = True


# --- aiokafka stand-in ------------------------------------------------------------------------


@dataclass
class RecordMetadata:
    topic: str
    partition: int
    offset: int


class FakeClusterMetadata:
    def __init__(self, topics: Mapping[str, int]) -> None:
        self._topics = dict(topics)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self._topics.get(topic)
        return None if n is None else set(range(n))

    def topics(self) -> set[str]:
        return set(self._topics)


class FakeKafkaClient:
    def __init__(self, owner: FakeKafkaProducer) -> None:
        self._owner = owner

    async def fetch_all_metadata(self) -> FakeClusterMetadata:
        return FakeClusterMetadata(self._owner.topics)


@dataclass
class KafkaRecord:
    topic: str
    value: bytes
    key: bytes | None
    headers: list[tuple[str, bytes]]


class FakeKafkaProducer:
    """``send_outcomes``: per send, an exception (raised by the delivery future) or None."""

    instances: list[FakeKafkaProducer]

    def __init__(self, **config: Any) -> None:
        self.config = config
        self.topics: dict[str, int] = {"rows": 3}
        self.start_error: BaseException | None = None
        self.start_hangs = False
        self.send_outcomes: list[BaseException | None] = []
        self.records: list[KafkaRecord] = []
        self.attempts = 0
        self.started = False
        self.stopped = False
        self.flushed = 0
        self.client = FakeKafkaClient(self)

    async def start(self) -> None:
        if self.start_hangs:
            await asyncio.sleep(3600)
        if self.start_error is not None:
            raise self.start_error
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def flush(self) -> None:
        self.flushed += 1

    async def send(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes]] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        self.attempts += 1
        future: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        outcome = self.send_outcomes.pop(0) if self.send_outcomes else None
        if outcome is not None:
            future.set_exception(outcome)
            return future
        assert value is not None
        self.records.append(KafkaRecord(topic, value, key, list(headers or [])))
        future.set_result(RecordMetadata(topic, len(self.records) % 3, len(self.records) - 1))
        return future


def kafka_factory(prepare: Callable[[FakeKafkaProducer], None] | None = None) -> Any:
    """A ``producer_factory`` that records the producers it makes on ``factory.made``."""
    made: list[FakeKafkaProducer] = []

    def factory(**config: Any) -> FakeKafkaProducer:
        producer = FakeKafkaProducer(**config)
        if prepare is not None:
            prepare(producer)
        made.append(producer)
        return producer

    factory.made = made  # type: ignore[attr-defined]
    return factory


__all__ = [
    "FakeKafkaProducer",
    "FakePubSubClient",
    "FakePublisher",
    "Sent",
    "TopicNotFound",
    "kafka_factory",
    "reassemble",
]
