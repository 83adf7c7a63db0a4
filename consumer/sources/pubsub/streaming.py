"""Google Cloud Pub/Sub behind the ``Source`` protocol, on google-cloud-pubsub's streaming pull.

How the client library works, and what this adapter relies on (google-cloud-pubsub 2.44,
``google/cloud/pubsub_v1/subscriber/_protocol/``):

* ``SubscriberClient.subscribe`` opens one bidirectional StreamingPull RPC. A background
  thread reads responses; every received message is first *lease-managed* (added to the
  ``Leaser``), then handed to our callback on the client's thread pool. Our callback only
  converts the message into a ``Delivery``, puts it in a local buffer under a lock and wakes
  the event loop with ``loop.call_soon_threadsafe``: it never blocks.
* **Lease extension.** The ``Leaser`` thread sends ModifyAckDeadline for *every* leased ack id
  (received and not yet acked/nacked) every ``uniform(0.01, 0.9 * deadline)`` seconds. The
  deadline starts at 10 s, then follows the 99th percentile of observed ack latency, bounded by
  ``FlowControl.min/max_duration_per_lease_extension`` (10..600 s). The subscription's own
  ``ack_deadline_seconds`` is not what keeps a held message: the client overrides it on
  receipt and keeps extending it. A message's lease is kept for at most
  ``FlowControl.max_lease_duration``, counted from when it was handed to our callback; after
  that the leaser *drops* it (stops extending, does not nack) and Pub/Sub redelivers it once
  the last extension runs out. Hence ``max_lease_duration_s`` must exceed the worst time a
  message can spend in this process (buffered while paused + batching + inference with
  backoff + writing). Buffered deliveries older than that are nacked instead of being
  yielded (their lease is gone and a redelivery is on its way).
* **Flow control.** ``FlowControl(max_messages, max_bytes)`` counts messages handed to our
  callback and not yet acked/nacked. When that load reaches 1.0 the streaming pull manager
  pauses its response reader (``BackgroundConsumer.pause``: no more ``recv`` on the stream, so
  gRPC/HTTP2 flow control backs up to the server) and resumes below 0.8. The same limits go to
  the server in the first StreamingPullRequest (``max_outstanding_messages/bytes``), so the
  server itself stops sending once that many messages are outstanding. Messages that arrive in
  a response beyond the limit are kept "on hold" inside the client: leased, not given to us,
  not counted, released as we ack.
* **Pausing.** The client has no public pause. ``BackgroundConsumer.pause`` is private and the
  manager resumes it on its own whenever an ack/nack brings the load under 0.8, so it cannot
  hold a pause of ours. ``StreamingPullFuture.cancel`` really stops the stream but also stops
  the leaser and the dispatcher (acks after that are never sent), i.e. it drops every lease.
  So ``pause()`` here stops *yielding*: deliveries keep arriving into the local buffer, still
  leased, until buffered + in-flight reach ``max_messages``/``max_bytes``; at that point the
  client stops reading the stream and the server stops sending (both flow-control limits
  saturate), so consumption stops at the broker while every held message stays leased.
  ``resume()`` yields the buffer first; acks then lower the load and the client resumes the
  stream itself.
* **Acks and nacks** (``Message.ack/nack``) only put a request on the client's queue; a
  dispatcher thread sends them (unary Acknowledge / ModifyAckDeadline 0) in batches. They are
  best effort unless the subscription has exactly-once delivery; result rows are idempotent
  on ``(source_message_id, row_index)``, so a lost ack costs a duplicate write, not a row.
* **Shutdown.** Cancelling the stream stops the reader, waits for running callbacks (we pass
  ``await_callbacks_on_shutdown=True``), nacks messages still on hold, lets the dispatcher send
  the acks/nacks already queued, and stops the leaser. ``close()`` nacks our unsettled
  deliveries only *after* that, with the plain ModifyAckDeadline(0) RPC on their ack ids:
  nacking through ``Message.nack`` while the stream is open makes Pub/Sub hand them straight
  back to the closing stream, and whatever is in transit when it closes only comes back after
  its ack deadline (up to 600 s).
* **Delivery attempts.** ``Message.delivery_attempt`` is only filled in when the subscription
  has a dead-letter policy; otherwise it is ``None`` (``Delivery.delivery_attempt == 0``) and
  ``max_delivery_attempts`` cannot trigger.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from consumer.sources.base import DeadLetterReason, Delivery, DeliveryIterator, package_version
from consumer.sources.pubsub.shared import (
    DLQ_MESSAGE_MAX_BYTES,
    UNLIMITED_MESSAGES,
    DeadLetterFailed,
    PubSubConfigError,
    PubSubSourceError,
    PubSubUnreachable,
    check_subscription,
    dead_letter_attributes,
    default_publisher,
    default_subscriber,
    publish_dead_letter,
    warn_no_dead_letter_topic,
)
from consumer.sources.pubsub.shared import SUBSCRIPTION_RE as _SUBSCRIPTION_RE
from consumer.sources.pubsub.shared import TOPIC_RE as _TOPIC_RE
from wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
)

_LOG = logging.getLogger(__name__)

_LEASE_EXTENSION_RANGE = (10.0, 600.0)
"""What Pub/Sub accepts for one lease extension (``FlowControl`` docs)."""
_SHUTDOWN_TIMEOUT_S = 60.0
_HALF_CLOSE_WAIT_S = 2.0
"""How long ``close`` waits for the server to end the streaming pull after half-closing it,
before cancelling it."""
_NACK_CHUNK = 500
"""Ack ids per ModifyAckDeadline request (the request size limit is 512 KB)."""

# google.cloud.pubsub_v1 ships no type information: its objects are Any to mypy.
PubSubMessage = Any
"""``google.cloud.pubsub_v1.subscriber.message.Message``."""


class PubSubStreamError(PubSubSourceError):
    """The streaming pull stopped on an error it does not recover from (e.g. the subscription
    was deleted, or permission was revoked)."""


@dataclass(frozen=True)
class PubSubSourceConfig:
    subscription: str
    """Full path: ``projects/P/subscriptions/S``."""
    dead_letter_topic: str | None
    """Full path ``projects/P/topics/T`` poison messages are published to, with the reason.
    ``None`` is allowed only when the subscription has its own dead-letter policy (checked by
    ``PubSubSource.check``): ``dead_letter`` then nacks and Pub/Sub moves the message after
    the policy's max attempts, *without* the reason attributes."""
    max_messages: int = 1000
    """Flow control: most messages received and not yet acked/nacked (buffered + in flight)."""
    max_bytes: int = 64 * 1024 * 1024
    """Flow control: most message bytes received and not yet acked/nacked."""
    max_lease_duration_s: float = 3600.0
    """How long the client keeps extending a held message's ack deadline, counted from
    receipt. Must exceed the worst batch time plus backoff (plus any pause)."""
    min_lease_extension_s: float = 0.0
    """Shortest single ack-deadline extension (10..600 s); 0 = client default (10 s, or 60 s
    with exactly-once delivery)."""
    max_lease_extension_s: float = 0.0
    """Longest single ack-deadline extension (10..600 s); bounds how long a crashed
    consumer's messages wait before redelivery. 0 = client default (up to 600 s, following
    the 99th percentile of ack latency)."""
    max_delivery_attempts: int | None = None
    """``exceeded_attempts`` is true beyond this many deliveries. Only counted by Pub/Sub when
    the subscription has a dead-letter policy; keep it below that policy's own maximum so the
    consumer dead-letters with a reason before Pub/Sub moves the message without one."""
    consumer_version: str = field(default_factory=package_version)
    """Written to ``rowbatch-dlq-consumer-version``."""
    dead_letter_timeout_s: float = 30.0
    """How long ``dead_letter`` waits for the publish confirmation."""
    check_timeout_s: float = 10.0
    """How long ``check`` keeps retrying an unreachable server."""

    def __post_init__(self) -> None:
        if not _SUBSCRIPTION_RE.match(self.subscription):
            raise PubSubConfigError(
                f"subscription must be a full path 'projects/P/subscriptions/S', "
                f"not {self.subscription!r}"
            )
        if self.dead_letter_topic is not None and not _TOPIC_RE.match(self.dead_letter_topic):
            raise PubSubConfigError(
                f"dead_letter_topic must be a full path 'projects/P/topics/T', "
                f"not {self.dead_letter_topic!r}"
            )
        if self.max_messages < 1:
            raise PubSubConfigError(f"max_messages must be >= 1, not {self.max_messages}")
        if self.max_bytes < 1:
            raise PubSubConfigError(f"max_bytes must be >= 1, not {self.max_bytes}")
        if self.max_lease_duration_s <= 0:
            raise PubSubConfigError(
                f"max_lease_duration_s must be > 0, not {self.max_lease_duration_s}"
            )
        low, high = _LEASE_EXTENSION_RANGE
        for name in ("min_lease_extension_s", "max_lease_extension_s"):
            value = getattr(self, name)
            if value != 0 and not low <= value <= high:
                raise PubSubConfigError(
                    f"{name} must be 0 (client default) or within {low:g}..{high:g} s, not {value}"
                )
        if self.max_delivery_attempts is not None and self.max_delivery_attempts < 1:
            raise PubSubConfigError(
                f"max_delivery_attempts must be >= 1 or None, not {self.max_delivery_attempts}"
            )
        for name in ("dead_letter_timeout_s", "check_timeout_s"):
            if getattr(self, name) <= 0:
                raise PubSubConfigError(f"{name} must be > 0, not {getattr(self, name)}")

    def flow_control(self) -> pubsub_v1.types.FlowControl:
        return pubsub_v1.types.FlowControl(
            max_bytes=self.max_bytes,
            max_messages=self.max_messages,
            max_lease_duration=self.max_lease_duration_s,
            # The client sends these in a protobuf int field: whole seconds only.
            min_duration_per_lease_extension=round(self.min_lease_extension_s),
            max_duration_per_lease_extension=round(self.max_lease_extension_s),
        )


@dataclass
class _Held:
    message: PubSubMessage
    received_at: float
    """``time.monotonic()`` when the client handed it to us (its lease clock starts then)."""


class PubSubSource:
    """``Source`` over one Pub/Sub subscription (streaming pull).

    Clients are built from the environment when not given (``PUBSUB_EMULATOR_HOST`` selects
    the emulator); clients passed in are not closed by ``close``. ``pause``/``resume`` and
    iteration belong to the event loop's thread.
    """

    def __init__(
        self,
        config: PubSubSourceConfig,
        *,
        subscriber: pubsub_v1.SubscriberClient | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
        host: str | None = None,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
    ) -> None:
        self.config = config
        self._on_dead_letter = on_dead_letter
        """Called after a dead letter the source sent on its own initiative is confirmed (the
        same hook as ``KafkaSource``'s). This source sends none today: every dead letter
        comes from the pipeline's ``dead_letter`` call, which the pipeline counts itself."""
        self._owns_subscriber = subscriber is None
        self._subscriber = subscriber if subscriber is not None else default_subscriber()
        self._owns_publisher = publisher is None and config.dead_letter_topic is not None
        if publisher is None and config.dead_letter_topic is not None:
            publisher = default_publisher()
        self._publisher = publisher
        # Dead letters go through the plain GAPIC Publish RPC on the publisher's channel: the
        # high-level ``publish(topic, data, **attrs)`` takes attributes as keyword arguments,
        # so a poison message with an attribute named e.g. "data" or "timeout" could not be
        # forwarded; and batching buys nothing for rare, individually confirmed messages.
        self._dlq_api: GapicPublisherClient | None = (
            GapicPublisherClient(transport=publisher.transport) if publisher is not None else None
        )
        self.host: str = host if host is not None else str(self._subscriber.target)
        """Where the service is, for error messages."""

        self._lock = threading.Lock()
        # Guarded by _lock (touched by the client's callback threads):
        self._buffer: deque[Delivery] = deque()
        self._unsettled: dict[Delivery, _Held] = {}
        self._closing = False
        self._late: list[PubSubMessage] = []
        """Arrived while closing: nacked by close()."""
        # Event loop thread only:
        self._nacks: list[PubSubMessage] = []
        """Nacked by ``nack`` and not yet handed to the client (see ``nack``)."""
        self._nack_flush: asyncio.Handle | None = None
        self._stream_error: BaseException | None = None

        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()
        self._streaming: Any = None  # StreamingPullFuture once started
        self._paused = False
        self._closed = False

    # -- Source protocol ---------------------------------------------------------------------

    def deliveries(self) -> DeliveryIterator:
        """Deliveries until ``close`` (then the iteration ends). The streaming pull starts on
        the first ``__anext__``. Raises ``PubSubStreamError`` if the stream dies."""
        return DeliveryIterator(self._next_delivery)

    async def ack(self, delivery: Delivery) -> None:
        self._settle(delivery).ack()

    async def nack(self, delivery: Delivery) -> None:
        """Give the message back. The nack goes to the client (``Message.nack``) on the next
        turn of the event loop, unless ``close`` starts first: the pipeline nacks whatever is
        unsettled right before it closes the source, and a nack sent while the stream is
        still open makes Pub/Sub hand the message straight back to this closing stream.
        ``close`` sends those nacks itself, once the stream is down."""
        self._nacks.append(self._settle(delivery))
        if self._nack_flush is None:
            self._nack_flush = asyncio.get_running_loop().call_soon(self._flush_nacks)

    def _flush_nacks(self) -> None:
        self._nack_flush = None
        if self._closed:
            return  # close() took them over
        nacks, self._nacks = self._nacks, []
        for message in nacks:
            message.nack()

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        """Publish the original payload and attributes plus ``rowbatch-dlq-*`` attributes to
        the dead-letter topic, wait for the confirmation, then ack. Raises ``DeadLetterFailed``
        (delivery left unsettled) when the publish is not confirmed in time.

        Without a dead-letter topic (subscription-level policy), nacks instead: Pub/Sub moves
        the message after the policy's max delivery attempts, without the reason.

        At least once: a publish that timed out here may still land, and the redelivered
        original is then dead-lettered again. Raises ``ValueError`` if the delivery is not held
        (already settled). Pub/Sub allows 100 attributes per message: an original with more
        than 93 cannot be forwarded (``DeadLetterFailed``)."""
        with self._lock:
            if delivery not in self._unsettled:
                raise self._not_held(delivery)
        topic = self.config.dead_letter_topic
        if topic is None or self._dlq_api is None:
            warn_no_dead_letter_topic(delivery, reason)
            await self.nack(delivery)
            return
        await publish_dead_letter(
            self._dlq_api,
            topic=topic,
            delivery=delivery,
            reason=reason,
            consumer_version=self.config.consumer_version,
            timeout_s=self.config.dead_letter_timeout_s,
        )
        with self._lock:
            held = self._unsettled.pop(delivery, None)
        if held is None:  # close() nacked it meanwhile: it comes back and is dead-lettered again
            _LOG.warning(
                "message %s was dead-lettered to %s but settled meanwhile (close?): not acked",
                delivery.message_id,
                topic,
            )
            return
        held.message.ack()

    def pause(self) -> None:
        """Stop yielding deliveries. Messages keep arriving into the local buffer, leased,
        until flow control saturates; then the client stops reading and the server stops
        sending. See the module docstring."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._changed.set()

    async def close(self) -> None:
        """Stop the streaming pull and wait for it, nack every unsettled delivery (buffered or
        handed out, plus any that arrived while stopping), then close the clients this source
        created. Idempotent.

        The nacks (also those of ``nack`` calls not yet handed to the client) are sent once
        the stream is down, as one ModifyAckDeadline(0) RPC per 500 ack ids, each awaited:
        nacked while the stream is still open, Pub/Sub would hand them straight back to this
        very stream, and whatever is in transit when it closes would only come back after
        its ack deadline.

        The stream is first *half-closed* (the client ends its request stream, the server
        then ends the call) and cancelled only if the server has not ended it within
        ``_HALF_CLOSE_WAIT_S``. The official emulator (0.8.20) never notices a cancelled
        stream (its grpc-netty fails in ``onRstStreamRead``): the dead stream keeps pulling
        messages, nacked ones included, and sends them nowhere, so they came back only after
        the stream's ack deadline (60 s by default), once per round it wins."""
        if self._closed:
            return
        self._closed = True
        if self._nack_flush is not None:
            self._nack_flush.cancel()
            self._nack_flush = None
        with self._lock:
            self._closing = True
            unsettled = [held.message for held in self._unsettled.values()]
            self._unsettled.clear()
            self._buffer.clear()
        unsettled.extend(self._nacks)
        self._nacks.clear()
        self._changed.set()
        if self._streaming is not None:
            if self._half_close():
                outcome = await asyncio.to_thread(self._stream_result, _HALF_CLOSE_WAIT_S)
                _LOG.debug("streaming pull on %s after half-close: %s", self._sub, outcome)
            self._streaming.cancel()  # a no-op once the stream has ended
            # Not asyncio.wrap_future: a cancelled StreamingPullFuture reports cancelled()
            # at once, while result() waits for the shutdown to finish.
            outcome = await asyncio.to_thread(self._stream_result, _SHUTDOWN_TIMEOUT_S)
            if outcome == "timeout":
                _LOG.warning(
                    "streaming pull on %s did not stop within %g s", self._sub, _SHUTDOWN_TIMEOUT_S
                )
            else:
                _LOG.debug("streaming pull on %s ended: %s", self._sub, outcome)
        with self._lock:
            unsettled.extend(self._late)
            self._late.clear()
        if unsettled:
            await asyncio.to_thread(self._nack_now, [str(m.ack_id) for m in unsettled])
        if self._owns_publisher and self._publisher is not None:
            self._publisher.transport.close()
        if self._owns_subscriber:
            self._subscriber.close()

    # -- extras ------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def buffered(self) -> int:
        """Received and leased, not yet yielded."""
        with self._lock:
            return len(self._buffer)

    @property
    def outstanding(self) -> int:
        """Received and not yet settled (buffered + handed out): what flow control counts."""
        with self._lock:
            return len(self._unsettled)

    def exceeded_attempts(self, delivery: Delivery) -> bool:
        """True when ``max_delivery_attempts`` is set and this delivery is beyond it."""
        limit = self.config.max_delivery_attempts
        return limit is not None and delivery.delivery_attempt > limit

    def dead_letter_attributes(
        self, delivery: Delivery, reason: DeadLetterReason
    ) -> dict[str, str]:
        """The original attributes plus the ``rowbatch-dlq-*`` ones (ours win on a clash)."""
        return dead_letter_attributes(delivery, reason, self.config.consumer_version)

    async def check(self) -> None:
        """Start-up check: the server answers, the subscription exists, the dead-letter topic
        exists (or, without one, the subscription has a dead-letter policy). Raises
        ``PubSubUnreachable`` or ``PubSubConfigError`` naming what is wrong."""
        await asyncio.to_thread(self._check_sync)

    # -- internals ---------------------------------------------------------------------------

    @property
    def _sub(self) -> str:
        return self.config.subscription

    def _check_sync(self) -> None:
        check_subscription(
            self._subscriber,
            self._dlq_api,
            subscription=self._sub,
            dead_letter_topic=self.config.dead_letter_topic,
            max_delivery_attempts=self.config.max_delivery_attempts,
            host=self.host,
            timeout=self.config.check_timeout_s,
        )

    def _half_close(self) -> bool:
        """End the streaming pull's request stream, so that the server ends the call (rather
        than have it cancelled). The client library has no public way to do this: it ends
        its request generator when ``None`` is queued on the RPC's request queue (what
        ``BidiRpc.close`` does, right after cancelling). False when the library's internals
        are not what this expects (the stream is then only cancelled)."""
        manager = getattr(self._streaming, "_StreamingPullFuture__manager", None)
        rpc = getattr(manager, "_rpc", None)
        requests = getattr(rpc, "_request_queue", None)
        if requests is None or not hasattr(requests, "put"):
            _LOG.debug("cannot half-close the streaming pull on %s: cancelling it", self._sub)
            return False
        requests.put(None)
        return True

    def _stream_result(self, timeout: float) -> str:
        """Blocking; waits for the streaming pull's shutdown and says how it ended (never
        raises: its error, if any, was reported when it happened)."""
        try:
            self._streaming.result(timeout=timeout)
        except TimeoutError:
            return "timeout"
        except Exception as exc:  # noqa: BLE001 - StopIteration when the server ended it
            return f"ended ({type(exc).__name__})"
        return "ended"

    def _nack_now(self, ack_ids: list[str]) -> None:
        """Blocking; runs in a worker thread after the stream is down."""
        started = time.monotonic()
        for start in range(0, len(ack_ids), _NACK_CHUNK):
            chunk = ack_ids[start : start + _NACK_CHUNK]
            try:
                self._subscriber.modify_ack_deadline(
                    request={
                        "subscription": self._sub,
                        "ack_ids": chunk,
                        "ack_deadline_seconds": 0,
                    },
                    timeout=10.0,
                )
            except gexc.GoogleAPIError as exc:
                _LOG.warning(
                    "could not nack %d message(s) on %s (%s): they come back when their ack "
                    "deadline lapses",
                    len(chunk),
                    self._sub,
                    exc,
                )
        _LOG.info(
            "nacked %d unsettled message(s) on %s at close (ModifyAckDeadline 0, answered "
            "in %.2f s)",
            len(ack_ids),
            self._sub,
            time.monotonic() - started,
        )

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._streaming = self._subscriber.subscribe(
            self._sub,
            callback=self._on_message,
            flow_control=self.config.flow_control(),
            await_callbacks_on_shutdown=True,
        )
        self._streaming.add_done_callback(self._on_stream_done)
        _LOG.info("streaming pull started on %s (%s)", self._sub, self.host)

    def _on_message(self, message: PubSubMessage) -> None:
        """Client callback thread: record and wake the loop, never block."""
        delivery = Delivery(
            message_id=str(message.message_id),
            payload=bytes(message.data),
            attributes=dict(message.attributes),
            publish_time=float(message.publish_time.timestamp()),
            delivery_attempt=int(message.delivery_attempt or 0),
            source=self._sub,
            ordering_key=str(message.ordering_key or ""),
            size=int(message.size),
        )
        with self._lock:
            if self._closing:  # close() nacks it once the stream is down
                self._late.append(message)
                return
            wake = not self._buffer
            self._buffer.append(delivery)
            self._unsettled[delivery] = _Held(message, time.monotonic())
        if wake:
            self._wake_threadsafe()

    def _on_stream_done(self, future: Any) -> None:
        error = future.exception()
        with self._lock:
            if self._closing or error is None:
                return
            self._stream_error = error
        _LOG.error("streaming pull on %s stopped: %r", self._sub, error)
        self._wake_threadsafe()

    def _wake_threadsafe(self) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # loop closed: nothing waits any more
            loop.call_soon_threadsafe(self._changed.set)

    async def _next_delivery(self) -> Delivery:
        if self._streaming is None and not self._closed:
            self._start()
        while True:
            if self._closed:
                raise StopAsyncIteration
            with self._lock:
                error = self._stream_error
            if error is not None:
                # The client stopped its leaser and dispatcher: what is buffered can no longer
                # be acked (its leases lapse and Pub/Sub redelivers it).
                raise PubSubStreamError(
                    f"streaming pull on {self._sub} ({self.host}) stopped: {error}"
                ) from error
            if not self._paused:
                delivery = self._pop()
                if delivery is not None:
                    return delivery
            self._changed.clear()
            if self._paused or not self._has_buffered():
                await self._changed.wait()

    def _has_buffered(self) -> bool:
        with self._lock:
            return bool(self._buffer)

    def _pop(self) -> Delivery | None:
        expired: list[tuple[Delivery, _Held]] = []
        result: Delivery | None = None
        now = time.monotonic()
        with self._lock:
            while self._buffer:
                delivery = self._buffer.popleft()
                held = self._unsettled[delivery]
                if now - held.received_at >= self.config.max_lease_duration_s:
                    del self._unsettled[delivery]
                    expired.append((delivery, held))
                    continue
                result = delivery
                break
        for delivery, held in expired:
            _LOG.warning(
                "message %s waited in the buffer past max_lease_duration_s=%g: its lease was "
                "dropped, nacking it for redelivery",
                delivery.message_id,
                self.config.max_lease_duration_s,
            )
            held.message.nack()
        return result

    def _settle(self, delivery: Delivery) -> PubSubMessage:
        with self._lock:
            held = self._unsettled.pop(delivery, None)
        if held is None:
            raise self._not_held(delivery)
        return held.message

    def _not_held(self, delivery: Delivery) -> ValueError:
        return ValueError(
            f"message {delivery.message_id} is not held by this source (already settled, "
            f"nacked by close(), or delivered by another source)"
        )


__all__ = [
    # Moved to pubsub_shared (shared with the unary-pull source); still importable from here.
    "ATTR_CODE",
    "ATTR_CONSUMER_VERSION",
    "ATTR_DELIVERY_ATTEMPT",
    "ATTR_MESSAGE",
    "ATTR_MESSAGE_ID",
    "ATTR_REASON",
    "ATTR_SOURCE",
    "ATTR_TIME",
    "DLQ_MESSAGE_MAX_BYTES",
    "UNLIMITED_MESSAGES",
    "DeadLetterFailed",
    "PubSubConfigError",
    "PubSubSource",
    "PubSubSourceConfig",
    "PubSubSourceError",
    "PubSubStreamError",
    "PubSubUnreachable",
    "default_publisher",
    "default_subscriber",
]
