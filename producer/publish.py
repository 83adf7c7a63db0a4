"""Publishing chunks: a :class:`Publisher` protocol, Pub/Sub and Kafka implementations, and the
helpers the CLI builds on (:func:`publish_rows`, :class:`PublishWindow`).

Both publishers

- check at :meth:`~Publisher.start` that the broker answers (within ``connect_timeout_s``, else
  :class:`BrokerUnavailable` naming the address) and that the topic exists (else
  :class:`TopicNotFound` naming the topic);
- retry transient errors with tenacity (bounded by :class:`RetryPolicy`: attempts and seconds)
  and raise permanent ones as :class:`PublishFailed` naming the topic and the chunk id;
- re-send a chunk with the same payload and chunk id on retry, so the consumer, which keys its
  results by chunk id, writes each row once even when a retry duplicates a message;
- report :attr:`~Publisher.max_chunk_bytes`, the largest :attr:`EncodedChunk.size` that fits one
  message, which :func:`publish_rows` hands to :func:`~wire.chunks.split_rows`.

Usage::

    async with KafkaPublisher("localhost:9092", "rows") as pub:
        await publish_rows(pub, "orders", {"id": ids, "text": texts}, "arrow", "orders-db:1")
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import Any, Final, Literal, Protocol, Self

import grpc
from aiokafka import AIOKafkaProducer, codec
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    UnknownTopicOrPartitionError,
)
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1 import types as pubsub_types
from google.cloud.pubsub_v1.publisher import exceptions as pubsub_exceptions
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from wire.chunks import (
    KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
    PUBSUB_MAX_MESSAGE_BYTES,
    EncodedChunk,
    split_rows,
)
from wire.codec_arrow import Compression
from wire.columns import ColumnData, ColumnType, TableSchema
from wire.headers import H_CHUNK_ID, H_ORDERING_KEY, H_ROW_COUNT, Encoding, attributes_size

log = logging.getLogger(__name__)


Sleep = Callable[[float], Awaitable[None]]
KafkaCompression = Literal["zstd", "lz4", "gzip", "snappy"]

# Kafka: what a record adds to key + value + header names/values (record batch header 61 bytes,
# per-record varints and attributes 21, header varints), with room to spare.
_KAFKA_FRAMING_BYTES: Final = 512
# The largest key we send: an ordering key (1024 UTF-8 bytes) or a chunk id (256 + ".<part>").
_KAFKA_MAX_KEY_BYTES: Final = 1024
# Pub/Sub: the PublishRequest (topic name, message framing, the ordering key field) around the
# data and attributes; the server limit (10,000,000 bytes) applies to the whole request.
_PUBSUB_FRAMING_BYTES: Final = 512
_PUBSUB_ORDERING_KEY_BYTES: Final = 1024
# As the client sets on the channels it makes itself: no gRPC cap below Pub/Sub's own limits.
_GRPC_UNLIMITED: Final = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]
_TOPIC_PATH_RE: Final = re.compile(r"projects/(?P<project>[^/]+)/topics/(?P<topic>[^/]+)")


# --- errors -----------------------------------------------------------------------------------


class PublishError(Exception):
    """Base class of publishing errors; the message names the topic (and the chunk, the broker
    address) so it can be shown to a person as is."""

    def __init__(self, message: str, *, topic: str | None = None, address: str | None = None):
        super().__init__(message)
        self.message = message
        self.topic = topic
        self.address = address


class TopicNotFound(PublishError):
    """The topic does not exist (create it first; rowbatch never creates topics)."""


class BrokerUnavailable(PublishError):
    """The broker did not answer within the connect timeout, or stayed unreachable through all
    retries."""


class PublishFailed(PublishError):
    """The broker refused a chunk for a reason retrying cannot fix (or retries ran out)."""

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        address: str | None = None,
        chunk_id: str | None = None,
    ):
        super().__init__(message, topic=topic, address=address)
        self.chunk_id = chunk_id


class MessageTooLarge(PublishFailed):
    """A message over the publisher's size limit (split it with :func:`publish_rows`)."""


# --- the protocol -----------------------------------------------------------------------------


class Message(Protocol):
    """What a publisher sends: :class:`~wire.chunks.EncodedChunk`, or a :class:`RawMessage`
    (any payload and attributes, e.g. the load generator's deliberately malformed ones)."""

    @property
    def payload(self) -> bytes: ...

    @property
    def attributes(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class RawMessage:
    """A message built by hand: no validation at all."""

    payload: bytes
    attributes: Mapping[str, str]


class Publisher(Protocol):
    """Publishes messages to one topic. ``publish`` returns once the broker has acknowledged
    the message, with its id (Pub/Sub message id, Kafka ``topic/partition/offset``); call it
    from several tasks at once to keep many messages in flight (see :class:`PublishWindow`)."""

    @property
    def broker(self) -> str:
        """``"pubsub"`` or ``"kafka"`` (for messages)."""
        ...

    @property
    def topic(self) -> str: ...

    @property
    def address(self) -> str:
        """Where the broker is, for messages (``127.0.0.1:9092``, ``pubsub.googleapis.com``)."""
        ...

    @property
    def max_chunk_bytes(self) -> int:
        """The largest :attr:`EncodedChunk.size` (payload + attribute keys and values) that
        fits one message."""
        ...

    async def start(self) -> None:
        """Connects and checks the topic exists: :class:`BrokerUnavailable`,
        :class:`TopicNotFound`."""
        ...

    async def publish(self, message: Message, *, key: str | None = None) -> str:
        """Publishes one message; ``key`` is the ordering key (Pub/Sub) / record key (Kafka),
        by default the message's ``rowbatch-ordering-key`` header."""
        ...

    async def flush(self) -> None:
        """Waits until everything handed to :meth:`publish` so far is acknowledged or failed."""
        ...

    async def close(self) -> None:
        """Flushes and releases the client (idempotent)."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of transient errors: at most ``attempts`` tries within ``max_seconds``, with
    exponential backoff and jitter between ``initial_backoff_s`` and ``max_backoff_s``."""

    attempts: int = 5
    max_seconds: float = 120.0
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {self.attempts}")


@dataclass(frozen=True)
class PublishedChunk:
    """One acknowledged message."""

    chunk_id: str
    rows: int
    bytes: int
    message_id: str


def chunk_id_of(message: Message) -> str:
    return message.attributes.get(H_CHUNK_ID) or "(no chunk id)"


def message_size(message: Message) -> int:
    return len(message.payload) + attributes_size(message.attributes)


def _retrying(
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool],
    sleep: Sleep,
    describe: Callable[[], str],
    before_retry: Callable[[BaseException], None] | None = None,
) -> AsyncRetrying:
    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None and before_retry is not None:
            before_retry(exc)
        log.warning(
            "%s: attempt %d failed (%s: %s); retrying",
            describe(),
            state.attempt_number,
            type(exc).__name__,
            exc,
        )

    return AsyncRetrying(
        stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.max_seconds),
        wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s)
        + wait_random(0, policy.initial_backoff_s),
        retry=retry_if_exception(transient),
        reraise=True,
        sleep=sleep,
        before_sleep=log_retry,
    )


# --- Pub/Sub ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PubSubBatchSettings:
    """The client's batching (``google.cloud.pubsub_v1.types.BatchSettings``)."""

    max_bytes: int = 5_000_000
    max_latency_s: float = 0.01
    max_messages: int = 100


@dataclass(frozen=True)
class PubSubFlowControl:
    """Publisher flow control: ``publish`` waits (LimitExceededBehavior.BLOCK, in a worker
    thread, never on the event loop) while this much is outstanding."""

    max_messages: int = 1000
    max_bytes: int = 100_000_000


def pubsub_topic_path(topic: str, project: str | None = None) -> str:
    """``projects/P/topics/T`` from a full path, or from a short name and a project (default:
    ``$PUBSUB_PROJECT_ID`` / ``$GOOGLE_CLOUD_PROJECT``)."""
    if _TOPIC_PATH_RE.fullmatch(topic):
        return topic
    if "/" in topic:
        raise ValueError(f"Pub/Sub topic {topic!r}: expected a name or projects/P/topics/T")
    project = (
        project or os.environ.get("PUBSUB_PROJECT_ID") or os.environ.get("GOOGLE_CLOUD_PROJECT")
    )
    if not project:
        raise ValueError(
            f"Pub/Sub topic {topic!r}: no project; pass --project (or a full "
            "projects/P/topics/T path, or set PUBSUB_PROJECT_ID)"
        )
    return f"projects/{project}/topics/{topic}"


def _pubsub_transient(exc: BaseException) -> bool:
    # A paused ordering key (an earlier message with the key failed) is resumed before the
    # retry; the other kinds are the transient gRPC codes.
    return isinstance(
        exc,
        pubsub_exceptions.PublishToPausedOrderingKeyException
        | gexc.ServiceUnavailable
        | gexc.DeadlineExceeded
        | gexc.InternalServerError
        | gexc.Aborted
        | gexc.ResourceExhausted
        | gexc.Unknown
        | gexc.Cancelled
        | gexc.RetryError
        | TimeoutError,
    )


def _pubsub_unreachable(exc: BaseException) -> bool:
    return isinstance(
        exc, gexc.ServiceUnavailable | gexc.DeadlineExceeded | gexc.RetryError | TimeoutError
    )


class _StartClose:
    """``async with publisher:`` calls ``start`` (closing again if it fails) and ``close``."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class PubSubPublisher(_StartClose):
    """Publishes to a Google Cloud Pub/Sub topic with ``google-cloud-pubsub``.

    ``client``: a ``PublisherClient`` to use (the caller keeps ownership and its settings);
    otherwise one is made with ``batch`` and ``flow_control``, talking to ``emulator_host``
    when given (else wherever ``$PUBSUB_EMULATOR_HOST`` or the default credentials point).
    ``ordering``: enable ordering keys (needed to publish with ``key``). The client's blocking
    calls (publish under flow control, get_topic, stop) run in worker threads; its futures are
    bridged into asyncio.
    """

    broker = "pubsub"

    def __init__(
        self,
        topic: str,
        *,
        project: str | None = None,
        client: Any = None,
        emulator_host: str | None = None,
        batch: PubSubBatchSettings | None = None,
        flow_control: PubSubFlowControl | None = None,
        ordering: bool = False,
        max_message_bytes: int = PUBSUB_MAX_MESSAGE_BYTES,
        retry: RetryPolicy | None = None,
        connect_timeout_s: float = 10.0,
        rpc_timeout_s: float = 60.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        if not 0 < max_message_bytes <= PUBSUB_MAX_MESSAGE_BYTES:
            raise ValueError(
                f"max_message_bytes must be in 1..{PUBSUB_MAX_MESSAGE_BYTES} (Pub/Sub's limit), "
                f"not {max_message_bytes}"
            )
        self._topic = pubsub_topic_path(topic, project)
        self._client = client
        self._owns_client = client is None
        self._emulator_host = emulator_host
        self._batch = batch or PubSubBatchSettings()
        self._flow = flow_control or PubSubFlowControl()
        self._ordering = ordering
        self._max_message_bytes = max_message_bytes
        self._retry = retry or RetryPolicy()
        self._connect_timeout_s = connect_timeout_s
        self._rpc_timeout_s = rpc_timeout_s
        self._sleep = sleep
        # One thread: publish calls reach the client in the order they were made (ordering
        # keys) and a call blocked by flow control holds back the ones behind it.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pubsub-publish")
        self._pending: set[asyncio.Future[Any]] = set()
        self._closed = False
        if self._flow.max_bytes < self.max_message_bytes:
            raise ValueError(
                f"flow control max_bytes ({self._flow.max_bytes}) must be at least the "
                f"message limit ({self.max_message_bytes}), or a large message would block "
                "forever"
            )

    # -- properties

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def address(self) -> str:
        if self._emulator_host:
            return self._emulator_host
        env_host = os.environ.get("PUBSUB_EMULATOR_HOST")
        if self._owns_client and env_host:
            return env_host
        endpoint = getattr(self._client, "api_endpoint", None)
        return str(endpoint) if isinstance(endpoint, str) else "pubsub.googleapis.com"

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    @property
    def max_chunk_bytes(self) -> int:
        framing = _PUBSUB_FRAMING_BYTES + len(self._topic) + _PUBSUB_ORDERING_KEY_BYTES
        if self._max_message_bytes < PUBSUB_MAX_MESSAGE_BYTES - framing:
            return self._max_message_bytes  # a lower limit chosen by the caller
        return PUBSUB_MAX_MESSAGE_BYTES - framing

    # -- lifecycle

    def _make_client(self) -> Any:
        kwargs: dict[str, Any] = {
            "batch_settings": pubsub_types.BatchSettings(
                max_bytes=self._batch.max_bytes,
                max_latency=self._batch.max_latency_s,
                max_messages=self._batch.max_messages,
            ),
            "publisher_options": pubsub_types.PublisherOptions(
                enable_message_ordering=self._ordering,
                flow_control=pubsub_types.PublishFlowControl(
                    message_limit=self._flow.max_messages,
                    byte_limit=self._flow.max_bytes,
                    limit_exceeded_behavior=pubsub_types.LimitExceededBehavior.BLOCK,
                ),
            ),
        }
        if self._emulator_host:
            channel = grpc.insecure_channel(self._emulator_host, options=_GRPC_UNLIMITED)
            kwargs["transport"] = PublisherGrpcTransport(channel=channel)
        return pubsub_v1.PublisherClient(**kwargs)

    async def start(self) -> None:
        if self._closed:
            raise RuntimeError("PubSubPublisher: start() after close()")
        if self._client is None:
            self._client = await asyncio.to_thread(self._make_client)
        await self._check_topic()

    async def _check_topic(self) -> None:
        client = self._client
        per_call = max(min(self._connect_timeout_s, 5.0), 0.1)

        def get_topic() -> Any:
            return client.get_topic(request={"topic": self._topic}, retry=None, timeout=per_call)

        retrying = AsyncRetrying(
            stop=stop_after_delay(self._connect_timeout_s),
            wait=wait_exponential(multiplier=0.1, max=1.0) + wait_random(0, 0.1),
            retry=retry_if_exception(_pubsub_transient),
            reraise=True,
            sleep=self._sleep,
        )
        try:
            await retrying(asyncio.to_thread, get_topic)
        except gexc.NotFound as exc:
            raise TopicNotFound(
                f"Pub/Sub topic {self._topic!r} does not exist (at {self.address}); create "
                "it first, e.g. gcloud pubsub topics create "
                f"{self._topic.rsplit('/', 1)[-1]} --project {self._topic.split('/')[1]}",
                topic=self._topic,
                address=self.address,
            ) from exc
        except gexc.PermissionDenied:
            # roles/pubsub.publisher may publish without seeing the topic's metadata; a
            # missing topic then shows at the first publish (NotFound -> TopicNotFound).
            log.info("not allowed to get topic %s; skipping the existence check", self._topic)
        except Exception as exc:
            if _pubsub_transient(exc):
                raise BrokerUnavailable(
                    f"cannot reach Pub/Sub at {self.address}: no answer within "
                    f"{self._connect_timeout_s:g} s while checking topic {self._topic!r} "
                    f"({_describe(exc)})",
                    topic=self._topic,
                    address=self.address,
                ) from exc
            raise PublishFailed(
                f"checking Pub/Sub topic {self._topic!r} at {self.address} failed: "
                f"{_describe(exc)}",
                topic=self._topic,
                address=self.address,
            ) from exc

    async def flush(self) -> None:
        while self._pending:
            await asyncio.gather(*list(self._pending), return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
            if self._client is not None and self._owns_client:
                await asyncio.to_thread(self._stop_client, self._client)
        finally:
            self._executor.shutdown(wait=False)

    @staticmethod
    def _stop_client(client: Any) -> None:
        with contextlib.suppress(RuntimeError):  # already stopped
            client.stop()
        client.transport.close()

    # -- publishing

    async def publish(self, message: Message, *, key: str | None = None) -> str:
        if self._client is None or self._closed:
            raise RuntimeError("PubSubPublisher: publish() before start() or after close()")
        attrs = dict(message.attributes)
        chunk_id = chunk_id_of(message)
        ordering_key = key if key is not None else attrs.get(H_ORDERING_KEY, "")
        if ordering_key and not self._ordering and self._owns_client:
            raise ValueError(
                f"chunk {chunk_id!r} has ordering key {ordering_key!r}, but this publisher "
                "was made without ordering=True"
            )
        size = message_size(message)
        if size > self.max_chunk_bytes:
            raise MessageTooLarge(
                f"chunk {chunk_id!r} is {size} bytes (payload + attributes), over the "
                f"{self.max_chunk_bytes}-byte limit for Pub/Sub topic {self._topic!r}; split "
                "it (producer.publish.publish_rows / wire.chunks.split_rows)",
                topic=self._topic,
                address=self.address,
                chunk_id=chunk_id,
            )
        payload = bytes(message.payload)

        def resume(_: BaseException) -> None:
            if ordering_key:
                self._client.resume_publish(self._topic, ordering_key)

        retrying = _retrying(
            self._retry,
            _pubsub_transient,
            self._sleep,
            lambda: f"publishing chunk {chunk_id!r} to {self._topic}",
            before_retry=resume,
        )
        try:
            message_id: str = await retrying(self._attempt, payload, attrs, ordering_key)
        except Exception as exc:
            raise self._translate(exc, chunk_id) from exc
        return message_id

    async def _attempt(self, payload: bytes, attrs: dict[str, str], ordering_key: str) -> str:
        loop = asyncio.get_running_loop()
        future = await loop.run_in_executor(
            self._executor, self._submit, payload, attrs, ordering_key
        )
        waiter = asyncio.wrap_future(future)
        self._pending.add(waiter)
        try:
            return str(await waiter)
        finally:
            self._pending.discard(waiter)

    def _submit(self, payload: bytes, attrs: dict[str, str], ordering_key: str) -> Any:
        # retry=None: retries are ours (tenacity), so they are bounded and counted once.
        return self._client.publish(
            self._topic,
            payload,
            ordering_key=ordering_key,
            retry=None,
            timeout=self._rpc_timeout_s,
            **attrs,
        )

    def _translate(self, exc: Exception, chunk_id: str) -> PublishError:
        if isinstance(exc, PublishError):
            return exc
        where = f"Pub/Sub topic {self._topic!r} at {self.address}"
        if isinstance(exc, gexc.NotFound):
            return TopicNotFound(
                f"{where} does not exist (publishing chunk {chunk_id!r}): {_short(exc)}",
                topic=self._topic,
                address=self.address,
            )
        if _pubsub_unreachable(exc):
            return BrokerUnavailable(
                f"{where} did not accept chunk {chunk_id!r} after {self._retry.attempts} "
                f"attempt(s) (at most {self._retry.max_seconds:g} s): "
                f"{_describe(exc)}",
                topic=self._topic,
                address=self.address,
            )
        return PublishFailed(
            f"{where} refused chunk {chunk_id!r}: {_describe(exc)}",
            topic=self._topic,
            address=self.address,
            chunk_id=chunk_id,
        )


# --- Kafka ------------------------------------------------------------------------------------


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


class KafkaPublisher(_StartClose):
    """Publishes to an Apache Kafka topic with ``aiokafka``: an idempotent producer with
    ``acks=all``; each chunk is one record whose headers are the chunk headers and whose key is
    the ordering key, else the chunk id (so a re-sent chunk lands on the same partition).

    ``max_message_bytes``: the topic's ``max.message.bytes`` (and the producer's
    ``max_request_size``); 1 MiB by default, as Kafka's. ``compression``: the producer's
    record-batch compression (``zstd``/``lz4``/``snappy`` need ``cramjam``). Extra keyword
    arguments go to ``AIOKafkaProducer`` (security: ``security_protocol``,
    ``sasl_mechanism``, ``ssl_context``...). ``producer_factory`` replaces ``AIOKafkaProducer``
    (tests).
    """

    broker = "kafka"

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        max_message_bytes: int = KAFKA_DEFAULT_MAX_MESSAGE_BYTES,
        compression: KafkaCompression | None = None,
        linger_ms: int = 5,
        request_timeout_ms: int = 30_000,
        connect_timeout_s: float = 10.0,
        retry: RetryPolicy | None = None,
        client_id: str = "rowbatch-producer",
        sleep: Sleep = asyncio.sleep,
        producer_factory: Callable[..., Any] | None = None,
        **client_options: Any,
    ) -> None:
        if max_message_bytes <= 2 * (_KAFKA_FRAMING_BYTES + _KAFKA_MAX_KEY_BYTES):
            raise ValueError(f"max_message_bytes is too small: {max_message_bytes}")
        if not topic:
            raise ValueError("Kafka topic must not be empty")
        check_kafka_compression(compression)
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self._max_message_bytes = max_message_bytes
        self._compression = compression
        self._linger_ms = linger_ms
        self._request_timeout_ms = request_timeout_ms
        self._connect_timeout_s = connect_timeout_s
        self._retry = retry or RetryPolicy()
        self._client_id = client_id
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
        return self._max_message_bytes - _KAFKA_FRAMING_BYTES - _KAFKA_MAX_KEY_BYTES

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
                else _describe(exc)
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
                "(producer.publish.publish_rows / wire.chunks.split_rows)",
                topic=self._topic,
                address=self._bootstrap,
                chunk_id=chunk_id,
            )
        headers = [(k, v.encode("utf-8")) for k, v in attrs.items()]
        key_bytes = record_key.encode("utf-8") if record_key else None
        payload = bytes(message.payload)
        retrying = _retrying(
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
                f"{where} refused chunk {chunk_id!r} as too large ({_short(exc)}); the topic's "
                f"max.message.bytes is probably below max_message_bytes "
                f"({self._max_message_bytes}): lower it (--max-message-bytes) to the topic's",
                topic=self._topic,
                address=self._bootstrap,
                chunk_id=chunk_id,
            )
        if isinstance(exc, KafkaConnectionError | KafkaTimeoutError | TimeoutError):
            return BrokerUnavailable(
                f"{where} did not acknowledge chunk {chunk_id!r} after {self._retry.attempts} "
                f"attempt(s) (at most {self._retry.max_seconds:g} s): "
                f"{_describe(exc)}",
                topic=self._topic,
                address=self._bootstrap,
            )
        return PublishFailed(
            f"{where} refused chunk {chunk_id!r}: {_describe(exc)}",
            topic=self._topic,
            address=self._bootstrap,
            chunk_id=chunk_id,
        )


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(exc: BaseException) -> str:
    """``Type: message`` without repeating the type when the message starts with it."""
    name = type(exc).__name__
    text = _short(exc)
    return text if text.startswith(name) else f"{name}: {text}"


# --- helpers ----------------------------------------------------------------------------------


def split_for(
    publisher: Publisher,
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str,
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    ordering_key: str | None = None,
    compression: Compression | None = None,
    produced_at: datetime | None = None,
) -> list[EncodedChunk]:
    """:func:`~wire.chunks.split_rows` with the publisher's message limit (CPU-bound: call it
    in a worker thread from async code)."""
    return split_rows(
        table,
        columns,
        encoding,
        chunk_id,
        max_bytes=publisher.max_chunk_bytes,
        schema=schema,
        ordering_key=ordering_key,
        compression=compression,
        produced_at=produced_at,
    )


async def publish_rows(
    publisher: Publisher,
    table: str,
    columns: Mapping[str, ColumnData],
    encoding: Encoding | str,
    chunk_id: str,
    *,
    schema: TableSchema | Mapping[str, ColumnType] | None = None,
    ordering_key: str | None = None,
    compression: Compression | None = None,
    produced_at: datetime | None = None,
) -> list[PublishedChunk]:
    """Encodes the rows as one chunk, or as parts ``<chunk_id>.0``, ``.1``... when one message
    cannot hold them, and publishes them (concurrently; in order per ordering key)."""
    chunks = await asyncio.to_thread(
        split_for,
        publisher,
        table,
        columns,
        encoding,
        chunk_id,
        schema=schema,
        ordering_key=ordering_key,
        compression=compression,
        produced_at=produced_at,
    )
    ids = await asyncio.gather(*(publisher.publish(c, key=ordering_key) for c in chunks))
    return [
        PublishedChunk(c.headers.chunk_id, c.headers.row_count, c.size, message_id)
        for c, message_id in zip(chunks, ids, strict=True)
    ]


def rows_of(message: Message) -> int:
    """The row count a message claims (0 when its header is missing or not a number)."""
    raw = message.attributes.get(H_ROW_COUNT, "")
    return int(raw) if raw.isdigit() else 0


class PublishWindow:
    """Keeps up to ``max_in_flight`` messages (and ``max_bytes`` of them) being published at
    once. :meth:`submit` waits for room and raises the first failure of an earlier message;
    :meth:`drain` waits for all. ``on_done`` is called for every acknowledged message.
    Messages are handed to the publisher in submit order (a retried one may land later)."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        max_in_flight: int = 64,
        max_bytes: int = 128 * 1024 * 1024,
        on_done: Callable[[PublishedChunk], None] | None = None,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {max_in_flight}")
        self._publisher = publisher
        self._max_in_flight = max_in_flight
        self._max_bytes = max_bytes
        self._on_done = on_done
        self._tasks: set[asyncio.Task[PublishedChunk]] = set()
        self._bytes = 0
        self._changed = asyncio.Event()
        self._error: BaseException | None = None

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    async def submit(
        self, message: Message, *, key: str | None = None, rows: int | None = None
    ) -> None:
        """Publishes ``message`` in the background once there is room. ``rows``: its rows
        for the report (default: its ``rowbatch-row-count`` header)."""
        size = message_size(message)
        while self._tasks and (
            len(self._tasks) >= self._max_in_flight or self._bytes + size > self._max_bytes
        ):
            self._check()
            self._changed.clear()
            await self._changed.wait()
        self._check()
        self._bytes += size
        count = rows_of(message) if rows is None else rows
        task = asyncio.create_task(self._publish(message, key, size, count))
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    async def _publish(
        self, message: Message, key: str | None, size: int, rows: int
    ) -> PublishedChunk:
        try:
            message_id = await self._publisher.publish(message, key=key)
        finally:
            self._bytes -= size
        return PublishedChunk(chunk_id_of(message), rows, size, message_id)

    def _finished(self, task: asyncio.Task[PublishedChunk]) -> None:
        self._tasks.discard(task)
        self._changed.set()
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            if self._error is None:
                self._error = exc
            return
        done = task.result()
        if self._on_done is not None:
            self._on_done(done)

    async def drain(self) -> None:
        """Waits for every submitted message; raises the first failure."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))
        self._check()

    async def cancel(self) -> None:
        """Cancels what is still in flight (after a failure)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


__all__ = [
    "BrokerUnavailable",
    "KafkaPublisher",
    "Message",
    "MessageTooLarge",
    "PubSubBatchSettings",
    "PubSubFlowControl",
    "PubSubPublisher",
    "PublishError",
    "PublishFailed",
    "PublishWindow",
    "PublishedChunk",
    "Publisher",
    "RawMessage",
    "RetryPolicy",
    "TopicNotFound",
    "publish_rows",
    "pubsub_topic_path",
    "split_for",
]
