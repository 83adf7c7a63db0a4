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
* **Shutdown** (``streaming_shutdown.py``): the stream is stopped first, and only then are the
  unsettled deliveries nacked, with the plain ModifyAckDeadline(0) RPC: nacked while the
  stream is open, they would be handed straight back to the closing stream.
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
from dataclasses import dataclass
from typing import Any

from google.cloud import pubsub_v1

from rowbatch.consumer.sources.base import DeliveryIterator, package_version
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.clients import (
    client_address,
    default_publisher,
    default_subscriber,
)
from rowbatch.consumer.sources.pubsub.dead_letters import DeadLetters
from rowbatch.consumer.sources.pubsub.errors import PubSubStreamError, not_held, warn_lease_lapsed
from rowbatch.consumer.sources.pubsub.library_calls import LibraryCalls
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.source_base import PubSubSourceBase
from rowbatch.consumer.sources.pubsub.streaming_shutdown import (
    nack_after_close,
    stop_streaming_pull,
)
from rowbatch.pubsub_env import project_of

_LOG = logging.getLogger(__name__)

# google.cloud.pubsub_v1 ships no type information: its objects are Any to mypy.
PubSubMessage = Any
"""``google.cloud.pubsub_v1.subscriber.message.Message``."""


@dataclass
class _Held:
    message: PubSubMessage
    received_at: float
    """``time.monotonic()`` when the client handed it to us (its lease clock starts then)."""


class PubSubSource(PubSubSourceBase):
    """``Source`` over one Pub/Sub subscription (streaming pull).

    Clients are built from the environment when not given (``PUBSUB_EMULATOR_HOST`` selects
    the emulator); clients passed in are not closed by ``close``. ``pause``/``resume`` and
    iteration belong to the event loop's thread.
    """

    config: PubSubSettings
    _subscriber: pubsub_v1.SubscriberClient
    _calls: LibraryCalls

    def __init__(
        self,
        config: PubSubSettings,
        *,
        consumer_version: str | None = None,
        subscriber: pubsub_v1.SubscriberClient | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
        host: str | None = None,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
    ) -> None:
        self.config = config
        self.consumer_version = consumer_version or package_version()
        self._on_dead_letter = on_dead_letter
        """Called after a dead letter the source sent on its own initiative is confirmed (the
        same hook as ``KafkaSource``'s). This source sends none today: every dead letter
        comes from the pipeline's ``dead_letter`` call, which the pipeline counts itself."""
        self._owns_subscriber = subscriber is None
        self._subscriber = (
            subscriber
            if subscriber is not None
            else default_subscriber(project_of(config.subscription))
        )
        topic = config.dead_letter_topic
        owns_publisher = publisher is None and topic is not None
        if owns_publisher:
            publisher = default_publisher(project_of(topic))
        self._calls = LibraryCalls(self._subscriber, publisher, owns_publisher=owns_publisher)
        self._dead_letters = DeadLetters(
            self._calls,
            topic=topic,
            consumer_version=self.consumer_version,
            timeout_s=config.dead_letter_timeout_s,
        )
        self.host = host if host is not None else client_address(self._subscriber)

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
                raise not_held(delivery)
        await self._dead_letters.forward(
            delivery, reason, nack=self.nack, ack_if_held=self._ack_if_held
        )

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
        the stream is down, as one ModifyAckDeadline(0) RPC per 500 ack ids, each awaited
        (see ``streaming_shutdown.py`` for why, and how the stream is stopped)."""
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
            await stop_streaming_pull(self._streaming, self._sub)
        with self._lock:
            unsettled.extend(self._late)
            self._late.clear()
        if unsettled:
            ack_ids = [str(m.ack_id) for m in unsettled]
            await asyncio.to_thread(nack_after_close, self._subscriber, self._sub, ack_ids)
        await self._calls.close()
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

    async def check(self) -> None:
        """Start-up check: the server answers, the subscription exists, the dead-letter topic
        exists (or, without one, the subscription has a dead-letter policy). Raises
        ``PubSubUnreachable`` or ``PubSubConfigError`` naming what is wrong."""
        await self._check_subscription()

    # -- internals ---------------------------------------------------------------------------

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
            warn_lease_lapsed(_LOG, delivery, self.config.max_lease_duration_s)
            held.message.nack()
        return result

    def _settle(self, delivery: Delivery) -> PubSubMessage:
        with self._lock:
            held = self._unsettled.pop(delivery, None)
        if held is None:
            raise not_held(delivery)
        return held.message

    def _ack_if_held(self, delivery: Delivery) -> bool:
        with self._lock:
            held = self._unsettled.pop(delivery, None)
        if held is None:
            return False
        held.message.ack()
        return True
