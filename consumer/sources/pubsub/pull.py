"""Google Cloud Pub/Sub behind the ``Source`` protocol, on *unary* Pull (``source.mode =
"pull"``), with batching, leases and flow control of its own.

Why: google-cloud-pubsub's streaming pull hands every message to a callback on a thread pool
and sends every ack through its dispatcher, ~90 us of CPU per message; that caps a consumer at
about 2,000 small messages a second. Here the cost per message is one protobuf read and a few
dict operations; the RPCs are per batch. See README "Pub/Sub pull mode" and
``python -m bench.pubsub_intake`` for the measurement.

How it works:

* **Pulling.** ``pull_concurrency`` tasks each call Pull (``SubscriberAsyncClient.pull`` on a
  grpc.aio channel, or ``SubscriberClient.pull`` in a worker thread with
  ``client="threads"``) for up to ``pull_max_messages`` messages, at most its share
  (``max_messages / pull_concurrency``) and only once room for half its share is free (so a
  full window refills in a few large pulls, not one per ack). Flow control: the messages held
  (received, not yet acked/nacked, plus those asked for by pulls in flight) stay within
  ``max_messages``; no pull starts while the bytes held reach ``max_bytes`` (one response
  may overshoot by its own size), or while ``pause()`` is in force. Pull long-polls when the
  subscription is empty; an empty answer that comes back at once is followed by a short
  growing wait (10..250 ms).
* **Acks and nacks** are local at once (flow control frees the room) and sent in batches by
  ``IdBatcher``: one Acknowledge (or ModifyAckDeadline 0 for nacks) per ``ack_max_ids`` ids
  or ``ack_delay_s`` after the first, whichever comes first. Each call is awaited; transient
  failures are retried for up to ``rpc_retry_s``, then given up and logged (the message
  comes back after its ack deadline: the sink is idempotent). Pulling stops while more than
  ``max_messages`` acks/nacks are unconfirmed.
* **Leases.** A pulled message's ack deadline is the subscription's
  (``ack_deadline_seconds``, read by ``check()``; 10 s, the minimum, if it was not called),
  counted conservatively from when the Pull was sent (or 2 s before the answer arrived, if
  the Pull waited longer for messages). At 2/3 of it, one ModifyAckDeadline
  per 1,000 ids extends every held message due within the next ``extension/6`` s to
  ``lease_extension_s`` (``max_lease_extension_s``, 60 s by default), again at 2/3, and so on
  for up to ``max_lease_duration_s`` from receipt; after that the lease is dropped (Pub/Sub
  redelivers), and a delivery still waiting to be yielded is nacked instead. A failed
  extension is retried a second later. Messages acked within 2/3 of the subscription's
  deadline cost no extension at all.
* **Ordering keys.** A message with an ordering key is yielded only after the previous one of
  the same key has been settled (as the streaming client does); nacking one also nacks the
  key's messages held behind it, which an ordered subscription redelivers in order.
* **Close** stops pulling (a pull in flight gets ``close_pull_wait_s`` to return, its
  messages are nacked with the rest, then it is cancelled), nacks every unsettled delivery,
  sends all pending acks and nacks and waits for the answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

from consumer.sources.base import DeadLetterReason, Delivery, DeliveryIterator, package_version
from consumer.sources.pubsub.leases import (
    TRANSIENT_ERRORS,
    Clock,
    IdBatcher,
    LeaseBook,
    Sleep,
    sleep_or_event,
)
from consumer.sources.pubsub.pull_rpc import (
    AsyncClientRpc,
    PullRpc,
    ReceivedMessage,
    ThreadedClientRpc,
    default_async_subscriber,
)
from consumer.sources.pubsub.shared import (
    SUBSCRIPTION_RE,
    TOPIC_RE,
    PubSubConfigError,
    PubSubSourceError,
    check_subscription,
    dead_letter_attributes,
    default_publisher,
    default_subscriber,
    publish_dead_letter,
    warn_no_dead_letter_topic,
)

_LOG = logging.getLogger(__name__)

_MIN_ACK_DEADLINE_S = 10.0
"""Pub/Sub's smallest subscription ack deadline: assumed when ``check()`` did not read it."""
_RPC_CHUNK = 1000
"""Ack ids per Acknowledge/ModifyAckDeadline request (the request size limit is 512 KB)."""
_FAST_EMPTY_S = 0.5
_IDLE_WAIT_S = (0.01, 0.25)
_BACKOFF_S = (0.1, 10.0)
_EXTENSION_RETRY_S = 1.0
_MAX_TRANSIT_S = 2.0


class PubSubPullError(PubSubSourceError):
    """Pull failed for good (the subscription was deleted, permission was revoked)."""


@dataclass(frozen=True)
class PubSubPullSourceConfig:
    subscription: str
    """Full path: ``projects/P/subscriptions/S``."""
    dead_letter_topic: str | None
    """As for the streaming source: ``None`` only with a subscription dead-letter policy."""
    max_messages: int = 1000
    """Flow control: most messages held (received, not yet acked/nacked)."""
    max_bytes: int = 64 * 1024 * 1024
    """Flow control: no pull starts while held message bytes reach this."""
    max_lease_duration_s: float = 3600.0
    """How long a held message's lease is kept, counted from receipt."""
    lease_extension_s: float = 60.0
    """Each extension sets the ack deadline this far ahead (10..600 s): also how long a
    crashed consumer's messages wait before redelivery."""
    max_delivery_attempts: int | None = None
    consumer_version: str = field(default_factory=package_version)
    dead_letter_timeout_s: float = 30.0
    check_timeout_s: float = 10.0
    pull_concurrency: int = 2
    """Pull calls in flight at once."""
    pull_max_messages: int = 1000
    """Most messages asked for by one Pull (each also bounded by the room flow control
    leaves, shared by the pulls in flight)."""
    ack_delay_s: float = 0.01
    """Longest an ack or nack waits to be batched with others."""
    ack_max_ids: int = 1000
    """Ack ids per Acknowledge/ModifyAckDeadline call (at most 1,000)."""
    rpc_retry_s: float = 60.0
    """How long a failed ack/nack call is retried before it is given up (and logged)."""
    close_pull_wait_s: float = 1.0
    """``close`` lets a Pull in flight return this long (its messages are then nacked at
    once) before cancelling it: messages of a cancelled Pull come back only after the
    subscription's ack deadline."""
    client: Literal["asyncio", "threads"] = "asyncio"
    """``asyncio``: ``SubscriberAsyncClient`` on grpc.aio; ``threads``: the blocking client in
    worker threads (see ``python -m bench.pubsub_intake`` for which costs less)."""

    def __post_init__(self) -> None:
        if not SUBSCRIPTION_RE.match(self.subscription):
            raise PubSubConfigError(
                f"subscription must be a full path 'projects/P/subscriptions/S', "
                f"not {self.subscription!r}"
            )
        if self.dead_letter_topic is not None and not TOPIC_RE.match(self.dead_letter_topic):
            raise PubSubConfigError(
                f"dead_letter_topic must be a full path 'projects/P/topics/T', "
                f"not {self.dead_letter_topic!r}"
            )
        for name in ("max_messages", "max_bytes", "pull_concurrency", "pull_max_messages"):
            if getattr(self, name) < 1:
                raise PubSubConfigError(f"{name} must be >= 1, not {getattr(self, name)}")
        if not 1 <= self.ack_max_ids <= _RPC_CHUNK:
            raise PubSubConfigError(f"ack_max_ids must be 1..{_RPC_CHUNK}, not {self.ack_max_ids}")
        if not 10 <= self.lease_extension_s <= 600:
            raise PubSubConfigError(
                f"lease_extension_s must be within 10..600 s, not {self.lease_extension_s}"
            )
        if self.max_delivery_attempts is not None and self.max_delivery_attempts < 1:
            raise PubSubConfigError(
                f"max_delivery_attempts must be >= 1 or None, not {self.max_delivery_attempts}"
            )
        for name in (
            "max_lease_duration_s",
            "dead_letter_timeout_s",
            "check_timeout_s",
            "rpc_retry_s",
        ):
            if getattr(self, name) <= 0:
                raise PubSubConfigError(f"{name} must be > 0, not {getattr(self, name)}")
        for name in ("ack_delay_s", "close_pull_wait_s"):
            if getattr(self, name) < 0:
                raise PubSubConfigError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.client not in ("asyncio", "threads"):
            raise PubSubConfigError(f"client must be 'asyncio' or 'threads', not {self.client!r}")


@dataclass(slots=True)
class _Held:
    ack_id: str
    received_at: float


class PubSubPullSource:
    """``Source`` over one Pub/Sub subscription, on unary Pull (see the module docstring).

    Clients are built from the environment when not given; clients passed in are not closed
    by ``close``. ``rpc`` replaces the Pull/Acknowledge/ModifyAckDeadline client (tests);
    ``clock`` (monotonic seconds) and ``sleep`` drive all lease and batching timing.
    Everything runs on the event loop's thread."""

    def __init__(
        self,
        config: PubSubPullSourceConfig,
        *,
        subscriber: pubsub_v1.SubscriberClient | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
        async_subscriber: SubscriberAsyncClient | None = None,
        rpc: PullRpc | None = None,
        host: str | None = None,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.config = config
        self._on_dead_letter = on_dead_letter
        """Same hook as the other sources'; this source sends no dead letter on its own."""
        self._clock = clock
        self._sleep = sleep
        self._owns_subscriber = subscriber is None and rpc is None
        self._subscriber = subscriber
        if subscriber is None and rpc is None:
            self._subscriber = default_subscriber()
        self._async_subscriber = async_subscriber
        self._rpc: PullRpc | None = rpc
        self._owns_publisher = publisher is None and config.dead_letter_topic is not None
        if self._owns_publisher:
            publisher = default_publisher()
        self._publisher = publisher
        self._dlq_api: GapicPublisherClient | None = (
            GapicPublisherClient(transport=publisher.transport) if publisher is not None else None
        )
        target = self._subscriber.target if self._subscriber is not None else "(test)"
        self.host: str = host if host is not None else str(target)

        self._receipt_deadline_s = _MIN_ACK_DEADLINE_S
        self._held: dict[Delivery, _Held] = {}
        self._held_bytes = 0
        self._reserved = 0
        """Messages asked for by pulls in flight."""
        self._buffer: deque[Delivery] = deque()
        self._keys: dict[str, deque[Delivery]] = {}
        """Ordering key -> its messages held behind the one yielded (or buffered)."""
        self._leases = LeaseBook(
            extension_s=config.lease_extension_s,
            max_duration_s=config.max_lease_duration_s,
            slack_s=config.lease_extension_s / 6,
        )
        self._acks = IdBatcher(
            "ack",
            self._send_acks,
            max_ids=config.ack_max_ids,
            max_delay_s=config.ack_delay_s,
            retry_s=config.rpc_retry_s,
            clock=clock,
            sleep=sleep,
            on_settled=self._wake_pullers,
        )
        self._nacks = IdBatcher(
            "nack",
            self._send_nacks,
            max_ids=config.ack_max_ids,
            max_delay_s=config.ack_delay_s,
            retry_s=config.rpc_retry_s,
            clock=clock,
            sleep=sleep,
            on_settled=self._wake_pullers,
        )
        self._changed = asyncio.Event()
        """Something to yield (or an error, or close)."""
        self._room = asyncio.Event()
        """Flow control may have room again (or pause/close changed)."""
        self._lease_changed = asyncio.Event()
        self._lease_plan: float | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._pullers: list[asyncio.Task[None]] = []
        self._error: BaseException | None = None
        self._started = False
        self._paused = False
        self._closing = False
        self._closed = False
        self.extension_calls = 0
        """ModifyAckDeadline calls that extended leases (for tests and the bench)."""

    # -- Source protocol ---------------------------------------------------------------------

    def deliveries(self) -> DeliveryIterator:
        """Deliveries until ``close`` (then the iteration ends). Pulling starts on the first
        ``__anext__``. Raises ``PubSubPullError`` if Pull fails for good."""
        return DeliveryIterator(self._next_delivery)

    async def ack(self, delivery: Delivery) -> None:
        """Settled here at once; the Acknowledge call follows within ``ack_delay_s``."""
        self._settle(delivery, nacked=False)

    async def nack(self, delivery: Delivery) -> None:
        """ModifyAckDeadline 0, batched like acks."""
        self._settle(delivery, nacked=True)

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        """As ``PubSubSource.dead_letter``: publish with the reason, wait for the
        confirmation, then ack; ``DeadLetterFailed`` (delivery left unsettled) if the publish
        is not confirmed. Without a dead-letter topic, nacks (the subscription's policy moves
        the message after its max attempts)."""
        if delivery not in self._held:
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
        if delivery not in self._held:  # close() nacked it meanwhile
            _LOG.warning(
                "message %s was dead-lettered to %s but settled meanwhile (close?): not acked",
                delivery.message_id,
                topic,
            )
            return
        await self.ack(delivery)

    def pause(self) -> None:
        """Stop pulling and yielding; pulls in flight still land in the buffer, and every
        held message stays leased."""
        self._paused = True

    def resume(self) -> None:
        self._paused = False
        self._room.set()
        self._changed.set()

    async def close(self) -> None:
        """Stop pulling, nack every unsettled delivery, send every pending ack and nack and
        wait for the answers, then close the clients this source created. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._room.set()
        self._changed.set()
        if self._pullers:
            _, late = await asyncio.wait(self._pullers, timeout=self.config.close_pull_wait_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*self._pullers, return_exceptions=True)
        self._closed = True
        unsettled = [held.ack_id for held in self._held.values()]
        self._held.clear()
        self._held_bytes = 0
        self._buffer.clear()
        self._keys.clear()
        self._nacks.extend(unsettled)
        if self._started:
            await asyncio.gather(self._acks.flush(), self._nacks.flush())
            if unsettled:
                _LOG.info(
                    "nacked %d unsettled message(s) on %s at close (%d nack(s) confirmed)",
                    len(unsettled),
                    self._sub,
                    self._nacks.confirmed,
                )
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._rpc is not None:
            await self._rpc.close()
        if self._owns_publisher and self._publisher is not None:
            self._publisher.transport.close()
        if self._owns_subscriber and self._subscriber is not None:
            self._subscriber.close()

    async def check(self) -> None:
        """Start-up check as for the streaming source (server, subscription, dead-letter
        topic or policy); also reads the subscription's ack deadline for lease timing."""
        if self._subscriber is None:
            return
        subscription = await asyncio.to_thread(
            check_subscription,
            self._subscriber,
            self._dlq_api,
            subscription=self._sub,
            dead_letter_topic=self.config.dead_letter_topic,
            max_delivery_attempts=self.config.max_delivery_attempts,
            host=self.host,
            timeout=self.config.check_timeout_s,
        )
        deadline = float(subscription.ack_deadline_seconds or 0)
        self._receipt_deadline_s = max(_MIN_ACK_DEADLINE_S, deadline)
        if subscription.enable_message_ordering:
            _LOG.info(
                "subscription %s has message ordering: a key's next message is delivered "
                "only once the previous one is settled",
                self._sub,
            )

    # -- extras ------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def buffered(self) -> int:
        """Received and leased, not yet yielded (waiting behind an ordering key included)."""
        return len(self._buffer) + sum(len(q) for q in self._keys.values())

    @property
    def outstanding(self) -> int:
        """Received and not yet settled: what flow control counts."""
        return len(self._held)

    @property
    def leased(self) -> int:
        """Held messages whose ack deadline is being kept."""
        return len(self._leases)

    @property
    def unconfirmed(self) -> int:
        """Acks and nacks not yet answered by the server."""
        return self._acks.pending + self._nacks.pending

    def exceeded_attempts(self, delivery: Delivery) -> bool:
        limit = self.config.max_delivery_attempts
        return limit is not None and delivery.delivery_attempt > limit

    def dead_letter_attributes(
        self, delivery: Delivery, reason: DeadLetterReason
    ) -> dict[str, str]:
        return dead_letter_attributes(delivery, reason, self.config.consumer_version)

    async def flush(self) -> None:
        """Send pending acks and nacks now and wait for the answers."""
        await asyncio.gather(self._acks.flush(), self._nacks.flush())

    async def extend_due_leases(self) -> int:
        """Extend every lease that is due (what the lease task does when it wakes); returns
        how many ack ids were extended. Messages held past ``max_lease_duration_s`` are
        dropped instead (a buffered one is nacked when it would be yielded)."""
        now = self._clock()
        cohorts, dropped = self._leases.take_due(now)
        if dropped:
            _LOG.warning(
                "%d message(s) on %s held past max_lease_duration_s=%g: their leases are no "
                "longer extended and Pub/Sub redelivers them",
                len(dropped),
                self._sub,
                self.config.max_lease_duration_s,
            )
        if not cohorts:
            return 0
        ids = [ack_id for cohort in cohorts for ack_id in cohort.ack_ids]
        late = now - min(c.expires_at for c in cohorts)
        if late > 0:
            _LOG.warning(
                "lease extension on %s is %.1f s late: redelivery possible", self._sub, late
            )
        seconds = math.ceil(self.config.lease_extension_s)
        try:
            for start in range(0, len(ids), _RPC_CHUNK):
                await self._api().modify_ack_deadline(ids[start : start + _RPC_CHUNK], seconds)
        except gexc.GoogleAPICallError as exc:
            _LOG.warning(
                "extending the leases of %d message(s) on %s failed (%s); retrying in %g s",
                len(ids),
                self._sub,
                exc,
                _EXTENSION_RETRY_S,
            )
            self._leases.postpone(cohorts, now + _EXTENSION_RETRY_S)
            return 0
        self.extension_calls += 1
        self._leases.extended(cohorts, sent_at=now)
        return len(ids)

    # -- internals ---------------------------------------------------------------------------

    @property
    def _sub(self) -> str:
        return self.config.subscription

    def _api(self) -> PullRpc:
        if self._rpc is None:
            if self.config.client == "threads":
                assert self._subscriber is not None
                self._rpc = ThreadedClientRpc(self._subscriber, self._sub)
            else:
                client = self._async_subscriber
                owned = client is None
                if client is None:
                    client = default_async_subscriber()
                self._rpc = AsyncClientRpc(client, self._sub, owned=owned)
        return self._rpc

    async def _send_acks(self, ack_ids: list[str]) -> None:
        await self._api().acknowledge(ack_ids)

    async def _send_nacks(self, ack_ids: list[str]) -> None:
        await self._api().modify_ack_deadline(ack_ids, 0)

    def _start(self) -> None:
        self._started = True
        self._api()
        spawn = asyncio.get_running_loop().create_task
        self._pullers = [
            spawn(self._pull_loop(), name=f"pubsub-pull-{i}")
            for i in range(self.config.pull_concurrency)
        ]
        self._tasks = [
            spawn(self._acks.run(), name="pubsub-acks"),
            spawn(self._nacks.run(), name="pubsub-nacks"),
            spawn(self._lease_loop(), name="pubsub-leases"),
        ]
        for task in (*self._pullers, *self._tasks):
            task.add_done_callback(self._on_task_done)
        _LOG.info(
            "unary pull started on %s (%s): %d pulls of up to %d messages, %s client",
            self._sub,
            self.host,
            self.config.pull_concurrency,
            self.config.pull_max_messages,
            self.config.client,
        )

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._closing:
            return
        error = task.exception()
        if error is not None and self._error is None:
            self._error = error
            _LOG.error("%s on %s stopped: %r", task.get_name(), self._sub, error)
            self._changed.set()

    def _wake_pullers(self) -> None:
        self._room.set()

    def _pull_size(self) -> int:
        """How many messages the next Pull asks for; 0: none now. A pull waits until room
        for at least half its share (``max_messages / pull_concurrency``) is free, so that
        a full window refills in a few large pulls rather than one per ack."""
        config = self.config
        if self._paused or self._closing or self._held_bytes >= config.max_bytes:
            return 0
        if self.unconfirmed >= config.max_messages:
            return 0
        room = config.max_messages - len(self._held) - self._reserved
        share = min(config.pull_max_messages, -(-config.max_messages // config.pull_concurrency))
        if room < max(1, share // 2):
            return 0
        return min(room, share)

    async def _pull_loop(self) -> None:
        idle = 0.0
        backoff = _BACKOFF_S[0]
        api = self._api()
        while not self._closing:
            size = self._pull_size()
            if size <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            self._reserved += size
            sent_at = self._clock()
            failed: Exception | None = None
            try:
                received = await api.pull(size)
            except gexc.DeadlineExceeded:
                received = ()
            except TRANSIENT_ERRORS as exc:
                received, failed = (), exc
            except gexc.GoogleAPICallError as exc:
                raise PubSubPullError(f"pull on {self._sub} ({self.host}) failed: {exc}") from exc
            finally:
                self._reserved -= size
            if failed is not None:
                _LOG.warning("pull on %s failed (%s); retrying in %g s", self._sub, failed, backoff)
                await self._sleep(backoff)
                backoff = min(backoff * 2, _BACKOFF_S[1])
                continue
            backoff = _BACKOFF_S[0]
            if received:
                idle = 0.0
                self._receive(received, sent_at)
            elif self._clock() - sent_at < _FAST_EMPTY_S:
                idle = min(max(idle * 2, _IDLE_WAIT_S[0]), _IDLE_WAIT_S[1])
                await self._sleep(idle)

    def _receive(self, received: Sequence[ReceivedMessage], sent_at: float) -> None:
        now = self._clock()
        sub = self._sub
        held = self._held
        buffer = self._buffer
        keys = self._keys
        ack_ids: list[str] = []
        size = 0
        for item in received:
            message = item.message
            stamp = message.publish_time
            delivery = Delivery(
                message_id=message.message_id,
                payload=message.data,
                attributes=dict(message.attributes),
                publish_time=stamp.seconds + stamp.nanos / 1e9,
                delivery_attempt=item.delivery_attempt,
                source=sub,
                ordering_key=message.ordering_key,
                size=message.ByteSize(),
            )
            ack_id = item.ack_id
            held[delivery] = _Held(ack_id, now)
            ack_ids.append(ack_id)
            size += delivery.size
            key = delivery.ordering_key
            if key:
                behind = keys.get(key)
                if behind is not None:
                    behind.append(delivery)
                    continue
                keys[key] = deque()
            buffer.append(delivery)
        self._held_bytes += size
        # The deadline started when the server sent the response: after the Pull was sent,
        # and (for a long poll that waited for messages) long after; a response is assumed
        # to spend at most _MAX_TRANSIT_S on the way.
        started_at = max(sent_at, now - _MAX_TRANSIT_S)
        due = self._leases.add(
            ack_ids, received_at=now, started_at=started_at, deadline_s=self._receipt_deadline_s
        )
        if self._lease_plan is None or due < self._lease_plan:
            self._lease_changed.set()
        self._changed.set()

    async def _lease_loop(self) -> None:
        while True:
            self._lease_changed.clear()
            due = self._leases.next_due()
            self._lease_plan = due
            if due is None:
                await self._lease_changed.wait()
                continue
            delay = due - self._clock()
            if delay > 0:
                await sleep_or_event(self._sleep, delay, self._lease_changed)
                continue
            await self.extend_due_leases()

    async def _next_delivery(self) -> Delivery:
        if not self._started and not self._closing:
            self._start()
        while True:
            if self._closing:
                raise StopAsyncIteration
            if self._error is not None:
                error = self._error
                if isinstance(error, PubSubPullError):
                    raise error
                raise PubSubPullError(f"pulling from {self._sub} stopped: {error!r}") from error
            if not self._paused and self._buffer:
                delivery = self._pop()
                if delivery is not None:
                    return delivery
                continue
            self._changed.clear()
            await self._changed.wait()

    def _pop(self) -> Delivery | None:
        delivery = self._buffer.popleft()
        held = self._held[delivery]
        if self._clock() - held.received_at < self.config.max_lease_duration_s:
            return delivery
        _LOG.warning(
            "message %s waited in the buffer past max_lease_duration_s=%g: its lease was "
            "dropped, nacking it for redelivery",
            delivery.message_id,
            self.config.max_lease_duration_s,
        )
        self._settle(delivery, nacked=True)
        return None

    def _settle(self, delivery: Delivery, *, nacked: bool) -> None:
        """Settled here (flow control has room at once); the ack or nack call follows."""
        held = self._held.pop(delivery, None)
        if held is None:
            raise self._not_held(delivery)
        self._held_bytes -= delivery.size
        self._leases.remove(held.ack_id)
        (self._nacks if nacked else self._acks).add(held.ack_id)
        key = delivery.ordering_key
        if key:
            self._next_of_key(key, nacked=nacked)
        self._room.set()

    def _next_of_key(self, key: str, *, nacked: bool) -> None:
        behind = self._keys.pop(key, None)
        if not behind:
            return
        if nacked:  # the key's later messages would overtake it: give them back too
            for delivery in behind:
                held = self._held.pop(delivery)
                self._held_bytes -= delivery.size
                self._leases.remove(held.ack_id)
                self._nacks.add(held.ack_id)
            return
        self._buffer.append(behind.popleft())
        self._keys[key] = behind
        self._changed.set()

    def _not_held(self, delivery: Delivery) -> ValueError:
        return ValueError(
            f"message {delivery.message_id} is not held by this source (already settled, "
            f"nacked by close(), or delivered by another source)"
        )


__all__ = [
    "AsyncClientRpc",
    "PubSubPullError",
    "PubSubPullSource",
    "PubSubPullSourceConfig",
    "PullRpc",
    "ThreadedClientRpc",
    "default_async_subscriber",
]
