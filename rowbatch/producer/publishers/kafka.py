"""Publishing to an Apache Kafka topic with ``aiokafka``: :class:`KafkaPublisher` and the check
that a record-batch compression's library is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from aiokafka import AIOKafkaProducer, codec
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    UnknownTopicOrPartitionError,
)

from rowbatch.producer.publishers.base import StartClose
from rowbatch.producer.publishers.errors import (
    BrokerUnavailable,
    MessageTooLarge,
    PublishError,
    TopicNotFound,
    describe,
    refused,
    short,
    unanswered,
)
from rowbatch.producer.publishers.messages import Message, chunk_id_of, message_size
from rowbatch.producer.publishers.retry import PublishRetry, make_retrying
from rowbatch.producer.publishers.tracing import send_span
from rowbatch.timing import Sleep
from rowbatch.tracing import TRACE_CONTEXT_BYTES
from rowbatch.tracing import active as tracing_active
from rowbatch.wire.chunks.split import KAFKA_DEFAULT_MAX_MESSAGE_BYTES
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_ORDERING_KEY

KafkaCompression = Literal["zstd", "lz4", "gzip", "snappy"]

# Kafka: what a record adds to key + value + header names/values (record batch header 61 bytes,
# per-record varints and attributes 21, header varints), with room to spare.
_KAFKA_FRAMING_BYTES: Final = 512
# The largest key we send: an ordering key (1024 UTF-8 bytes) or a chunk id (256 + ".<part>").
_KAFKA_MAX_KEY_BYTES: Final = 1024


def _kafka_transient(exc: BaseException) -> bool:
    if isinstance(exc, KafkaTimeoutError | TimeoutError):
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


def check_kafka_compression(compression: str | None) -> None:
    """Raises a ValueError naming what to install when the codec's library is missing."""
    if compression is None:
        return
    available = {
        "gzip": codec.has_gzip,
        "snappy": codec.has_snappy,
        "lz4": codec.has_lz4,
        "zstd": codec.has_zstd,
    }
    if compression not in available:
        raise ValueError(
            f"Kafka compression must be one of {sorted(available)} or none, not {compression!r}"
        )
    if not available[compression]():
        raise ValueError(
            f"Kafka compression {compression!r} needs the cramjam package: "
            f"pip install 'aiokafka[{compression}]'"
        )


@dataclass(frozen=True)
class KafkaPublisherSettings:
    """How a :class:`KafkaPublisher` publishes. ``max_message_bytes``: the topic's
    ``max.message.bytes`` (and the producer's ``max_request_size``); 1 MiB by default, as
    Kafka's. ``compression``: the producer's record-batch compression (``zstd``/``lz4``/
    ``snappy`` need ``cramjam``). ``linger_ms``, ``request_timeout_ms`` and ``client_id``: the
    producer's. ``connect_timeout_s``: for the start and the topic check. ``retry``: of
    transient errors."""

    max_message_bytes: int = KAFKA_DEFAULT_MAX_MESSAGE_BYTES
    compression: KafkaCompression | None = None
    linger_ms: int = 5
    request_timeout_ms: int = 30_000
    connect_timeout_s: float = 10.0
    retry: PublishRetry = field(default_factory=PublishRetry)
    client_id: str = "rowbatch-producer"


_SETTINGS_FIELDS: Final = frozenset(f.name for f in fields(KafkaPublisherSettings))


class KafkaPublisher(StartClose):
    """Publishes to an Apache Kafka topic with ``aiokafka``: an idempotent producer with
    ``acks=all``; each chunk is one record whose headers are the chunk headers and whose key is
    the ordering key, else the chunk id (so a re-sent chunk lands on the same partition).

    ``settings``: the message limit, compression, producer tuning, retries and timeouts
    (:class:`KafkaPublisherSettings`). Extra keyword arguments go to ``AIOKafkaProducer``
    (security: ``security_protocol``, ``sasl_mechanism``, ``ssl_context``...).
    ``producer_factory`` replaces ``AIOKafkaProducer`` (tests).
    """

    broker = "kafka"

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        settings: KafkaPublisherSettings | None = None,
        sleep: Sleep = asyncio.sleep,
        producer_factory: Callable[..., Any] | None = None,
        **client_options: Any,
    ) -> None:
        misplaced = sorted(set(client_options) & _SETTINGS_FIELDS)
        if misplaced:  # they would reach AIOKafkaProducer, beside the values set from settings
            raise TypeError(
                f"KafkaPublisher: {', '.join(misplaced)} belong in "
                "settings=KafkaPublisherSettings(...)"
            )
        settings = settings or KafkaPublisherSettings()
        max_message_bytes, compression = settings.max_message_bytes, settings.compression
        if max_message_bytes <= 2 * (_KAFKA_FRAMING_BYTES + _KAFKA_MAX_KEY_BYTES):
            raise ValueError(f"max_message_bytes is too small: {max_message_bytes}")
        if not topic:
            raise ValueError("Kafka topic must not be empty")
        check_kafka_compression(compression)
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._max_message_bytes = max_message_bytes
        self._compression = compression
        self._linger_ms = settings.linger_ms
        self._request_timeout_ms = settings.request_timeout_ms
        self._connect_timeout_s = settings.connect_timeout_s
        self._retry = settings.retry
        self._client_id = settings.client_id
        self._sleep = sleep
        self._factory = producer_factory
        self._client_options = client_options
        self._producer: Any = None
        self._closed = False

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def address(self) -> str:
        return self._bootstrap

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    @property
    def max_chunk_bytes(self) -> int:
        return (
            self._max_message_bytes
            - _KAFKA_FRAMING_BYTES
            - _KAFKA_MAX_KEY_BYTES
            - TRACE_CONTEXT_BYTES
        )

    def _make_producer(self) -> Any:
        factory = self._factory if self._factory is not None else AIOKafkaProducer
        return factory(
            bootstrap_servers=self._bootstrap,
            client_id=self._client_id,
            acks="all",
            enable_idempotence=True,
            compression_type=self._compression,
            max_request_size=self._max_message_bytes,
            # One batch must stay under the topic's limit too (it applies per batch).
            max_batch_size=self._max_message_bytes - _KAFKA_FRAMING_BYTES,
            linger_ms=self._linger_ms,
            request_timeout_ms=self._request_timeout_ms,
            **self._client_options,
        )

    async def start(self) -> None:
        if self._closed:
            raise RuntimeError("KafkaPublisher: start() after close()")
        if self._producer is None:
            self._producer = self._make_producer()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                await self._producer.start()
                metadata = await self._producer.client.fetch_all_metadata()
        except (KafkaError, OSError, TimeoutError) as exc:
            reason = (
                f"no answer within {self._connect_timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else describe(exc)
            )
            raise BrokerUnavailable(
                f"cannot reach Kafka at {self._bootstrap} ({reason}) to publish to topic "
                f"{self._topic!r}",
                topic=self._topic,
                address=self._bootstrap,
            ) from exc
        partitions = metadata.partitions_for_topic(self._topic)
        if not partitions:
            known = sorted(t for t in metadata.topics() if not t.startswith("__"))
            shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
            raise TopicNotFound(
                f"Kafka topic {self._topic!r} does not exist on {self._bootstrap} "
                f"(topics there: {shown or 'none'}); create it first, e.g. kafka-topics.sh "
                f"--create --topic {self._topic} --bootstrap-server {self._bootstrap}",
                topic=self._topic,
                address=self._bootstrap,
            )

    async def flush(self) -> None:
        if self._producer is not None and not self._closed:
            await self._producer.flush()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._producer is not None:
            await self._producer.stop()

    async def publish(self, message: Message, *, key: str | None = None) -> str:
        if self._producer is None or self._closed:
            raise RuntimeError("KafkaPublisher: publish() before start() or after close()")
        attrs = message.attributes
        chunk_id = chunk_id_of(message)
        record_key = key if key is not None else attrs.get(H_ORDERING_KEY) or attrs.get(H_CHUNK_ID)
        size = message_size(message)
        if size > self.max_chunk_bytes:
            raise MessageTooLarge(
                f"chunk {chunk_id!r} is {size} bytes (payload + headers), over the "
                f"{self.max_chunk_bytes}-byte limit for Kafka topic {self._topic!r} "
                f"(max_message_bytes {self._max_message_bytes} less record framing); split it "
                "(rowbatch.producer.publish_rows / rowbatch.wire.split_rows)",
                topic=self._topic,
                address=self._bootstrap,
                chunk_id=chunk_id,
            )
        key_bytes = record_key.encode("utf-8") if record_key else None
        payload = bytes(message.payload)
        if not tracing_active():
            return await self._send(payload, key_bytes, attrs, chunk_id)
        traced = dict(attrs)
        with send_span("kafka", self._topic, traced) as span:
            result = await self._send(payload, key_bytes, traced, chunk_id)
            span.set_attribute("messaging.message.id", result)
            return result

    async def _send(
        self, payload: bytes, key_bytes: bytes | None, attrs: Mapping[str, str], chunk_id: str
    ) -> str:
        headers = [(k, v.encode("utf-8")) for k, v in attrs.items()]
        retrying = make_retrying(
            self._retry,
            _kafka_transient,
            self._sleep,
            lambda: f"publishing chunk {chunk_id!r} to Kafka topic {self._topic}",
        )
        try:
            result: str = await retrying(self._attempt, payload, key_bytes, headers)
        except Exception as exc:
            raise self._translate(exc, chunk_id) from exc
        return result

    async def _attempt(
        self, payload: bytes, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> str:
        delivery = await self._producer.send(self._topic, value=payload, key=key, headers=headers)
        meta = await delivery
        return f"{meta.topic}/{meta.partition}/{meta.offset}"

    def _translate(self, exc: Exception, chunk_id: str) -> PublishError:
        if isinstance(exc, PublishError):
            return exc
        where = f"Kafka topic {self._topic!r} at {self._bootstrap}"
        if isinstance(exc, UnknownTopicOrPartitionError):
            return TopicNotFound(
                f"{where} does not exist (publishing chunk {chunk_id!r})",
                topic=self._topic,
                address=self._bootstrap,
            )
        if isinstance(exc, MessageSizeTooLargeError):
            return MessageTooLarge(
                f"{where} refused chunk {chunk_id!r} as too large ({short(exc)}); the topic's "
                f"max.message.bytes is probably below max_message_bytes "
                f"({self._max_message_bytes}): lower it (--max-message-bytes) to the topic's",
                topic=self._topic,
                address=self._bootstrap,
                chunk_id=chunk_id,
            )
        if isinstance(exc, KafkaConnectionError | KafkaTimeoutError | TimeoutError):
            return unanswered(
                where,
                chunk_id,
                exc,
                verb="acknowledge",
                retry=self._retry,
                topic=self._topic,
                address=self._bootstrap,
            )
        return refused(where, chunk_id, exc, topic=self._topic, address=self._bootstrap)


__all__ = [
    "KafkaCompression",
    "KafkaPublisher",
    "KafkaPublisherSettings",
    "check_kafka_compression",
]
