"""Publishing to a Google Cloud Pub/Sub topic with ``google-cloud-pubsub``: the client's batching
and flow-control settings, topic paths, and :class:`PubSubPublisher`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
from google.api_core import exceptions as gexc
from google.auth.exceptions import DefaultCredentialsError
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1 import types as pubsub_types
from google.cloud.pubsub_v1.publisher import exceptions as pubsub_exceptions
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

from rowbatch.producer.publishers.base import StartClose
from rowbatch.producer.publishers.errors import (
    BrokerUnavailable,
    MessageTooLarge,
    PublisherConfigError,
    PublishError,
    PublishFailed,
    TopicNotFound,
    describe,
    refused,
    short,
    unanswered,
)
from rowbatch.producer.publishers.messages import Message, chunk_id_of, message_size
from rowbatch.producer.publishers.retry import PublishRetry, make_retrying
from rowbatch.producer.publishers.tracing import send_span
from rowbatch.pubsub_env import (
    CredentialsLookup,
    credentials_message,
    emulator_host,
    google_default_credentials,
    missing_credentials,
    project_of,
    pubsub_address,
)
from rowbatch.timing import Sleep
from rowbatch.tracing import TRACE_CONTEXT_BYTES
from rowbatch.tracing import active as tracing_active
from rowbatch.wire.chunks.split import PUBSUB_MAX_MESSAGE_BYTES
from rowbatch.wire.headers.fields import H_ORDERING_KEY

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class PubSubPublisherSettings:
    """How a :class:`PubSubPublisher` publishes. ``ordering``: enable ordering keys (needed to
    publish with ``key``). ``max_message_bytes``: a message limit below Pub/Sub's own.
    ``retry``: of transient errors. ``connect_timeout_s``: for the start-up check of the topic;
    ``rpc_timeout_s``: for each publish call. ``batch`` and ``flow_control``: the client's,
    when the publisher makes it."""

    ordering: bool = False
    max_message_bytes: int = PUBSUB_MAX_MESSAGE_BYTES
    retry: PublishRetry = field(default_factory=PublishRetry)
    connect_timeout_s: float = 10.0
    rpc_timeout_s: float = 60.0
    batch: PubSubBatchSettings = PubSubBatchSettings()
    flow_control: PubSubFlowControl = PubSubFlowControl()


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


class PubSubPublisher(StartClose):
    """Publishes to a Google Cloud Pub/Sub topic with ``google-cloud-pubsub``.

    ``client``: a ``PublisherClient`` to use (the caller keeps ownership and its settings);
    otherwise one is made with the ``settings``' ``batch`` and ``flow_control``, talking to
    ``emulator_host`` when given (else wherever ``$PUBSUB_EMULATOR_HOST`` or the default
    credentials point). Without an emulator and without Google credentials ``start`` raises
    ``PublisherConfigError`` naming what to set; ``credentials`` looks them up (tests).
    ``settings``: ordering keys, limits, retries and timeouts
    (:class:`PubSubPublisherSettings`). The client's blocking calls (publish under flow
    control, get_topic, stop) run in worker threads; its futures are bridged into asyncio.
    """

    broker = "pubsub"

    def __init__(
        self,
        topic: str,
        *,
        project: str | None = None,
        client: Any = None,
        emulator_host: str | None = None,
        settings: PubSubPublisherSettings | None = None,
        sleep: Sleep = asyncio.sleep,
        credentials: CredentialsLookup = google_default_credentials,
    ) -> None:
        settings = settings or PubSubPublisherSettings()
        max_message_bytes = settings.max_message_bytes
        if not 0 < max_message_bytes <= PUBSUB_MAX_MESSAGE_BYTES:
            raise ValueError(
                f"max_message_bytes must be in 1..{PUBSUB_MAX_MESSAGE_BYTES} (Pub/Sub's limit), "
                f"not {max_message_bytes}"
            )
        self._topic = pubsub_topic_path(topic, project)
        self._client = client
        self._owns_client = client is None
        self._emulator_host = emulator_host
        self._batch = settings.batch
        self._flow = settings.flow_control
        self._ordering = settings.ordering
        self._max_message_bytes = max_message_bytes
        self._retry = settings.retry
        self._connect_timeout_s = settings.connect_timeout_s
        self._rpc_timeout_s = settings.rpc_timeout_s
        self._sleep = sleep
        self._credentials = credentials
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
        env_host = emulator_host()
        if self._owns_client and env_host:
            return env_host
        endpoint = getattr(self._client, "api_endpoint", None)
        return str(endpoint) if isinstance(endpoint, str) else pubsub_address()

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    @property
    def max_chunk_bytes(self) -> int:
        framing = (
            _PUBSUB_FRAMING_BYTES
            + len(self._topic)
            + _PUBSUB_ORDERING_KEY_BYTES
            + TRACE_CONTEXT_BYTES
        )
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
        # Up front, so a missing key file is one line of ours, not google-auth's traceback.
        project = project_of(self._topic)
        problem = missing_credentials(project, lookup=self._credentials)
        if problem is None:
            try:
                return pubsub_v1.PublisherClient(**kwargs)
            except DefaultCredentialsError as exc:
                problem = credentials_message(project, exc)
        raise PublisherConfigError(problem, topic=self._topic, address=self.address)

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
                    f"({describe(exc)})",
                    topic=self._topic,
                    address=self.address,
                ) from exc
            raise PublishFailed(
                f"checking Pub/Sub topic {self._topic!r} at {self.address} failed: {describe(exc)}",
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
                "it (rowbatch.producer.publish_rows / rowbatch.wire.split_rows)",
                topic=self._topic,
                address=self.address,
                chunk_id=chunk_id,
            )
        payload = bytes(message.payload)
        if not tracing_active():
            return await self._send(payload, attrs, ordering_key, chunk_id)
        with send_span("pubsub", self._topic, attrs) as span:
            message_id = await self._send(payload, attrs, ordering_key, chunk_id)
            span.set_attribute("messaging.message.id", message_id)
            return message_id

    async def _send(
        self, payload: bytes, attrs: dict[str, str], ordering_key: str, chunk_id: str
    ) -> str:
        def resume(_: BaseException) -> None:
            if ordering_key:
                self._client.resume_publish(self._topic, ordering_key)

        retrying = make_retrying(
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
                f"{where} does not exist (publishing chunk {chunk_id!r}): {short(exc)}",
                topic=self._topic,
                address=self.address,
            )
        if _pubsub_unreachable(exc):
            return unanswered(
                where,
                chunk_id,
                exc,
                verb="accept",
                retry=self._retry,
                topic=self._topic,
                address=self.address,
            )
        return refused(where, chunk_id, exc, topic=self._topic, address=self.address)


__all__ = [
    "PubSubBatchSettings",
    "PubSubFlowControl",
    "PubSubPublisher",
    "PubSubPublisherSettings",
    "pubsub_topic_path",
]
