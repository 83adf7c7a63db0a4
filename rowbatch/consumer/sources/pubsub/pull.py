"""Google Cloud Pub/Sub behind the ``Source`` protocol, on *unary* Pull (``source.mode =
"pull"``), with batching, leases and flow control of its own.

Why: google-cloud-pubsub's streaming pull hands every message to a callback on a thread pool
and sends every ack through its dispatcher, ~90 us of CPU per message; that caps a consumer at
about 2,000 small messages a second. Here the cost per message is one protobuf read and a few
dict operations; the RPCs are per batch. See docs/consumer.md "Pub/Sub pull mode" and
``python -m bench.pubsub_intake`` for the measurement.

How it works, one concern a module:

* **Pulling** (``pull_flow.py``): ``pull_concurrency`` tasks call Pull (on the source's own
  grpc.aio channel with protobuf messages of its own, ``grpc_calls.py``, which also serves the
  start-up check and dead letters without google-cloud-pubsub's client layers; or
  ``SubscriberClient`` in worker threads with ``client="threads"``: ``pull_rpc.py``) within
  flow control by messages and bytes; ``pause()`` stops them.
* **Holding** (``held.py``): received deliveries wait to be yielded; a message with an ordering
  key only after the key's previous one was settled.
* **Acks and nacks** (``id_batcher.py``) are local at once (flow control frees the room) and
  sent in confirmed batches; pulling stops while more than ``max_messages`` are unconfirmed.
* **Leases** (``leases.py``) are extended at 2/3 of each ack deadline, for up to
  ``max_lease_duration_s`` from receipt; a delivery still waiting to be yielded after that is
  nacked instead.
* **Close** stops pulling (a pull in flight gets ``close_pull_wait_s`` to return, its messages
  are nacked with the rest, then it is cancelled), stops lease keeping, nacks every unsettled
  delivery, sends all pending acks and nacks and waits for the answers, then closes the
  clients it built. Every step is bounded in time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rowbatch.consumer.sources.base import (
    VECTOR_MAX,
    DeliveryIterator,
    SharedBudget,
    VectorIterator,
    package_version,
)
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.calls import PubSubCalls
from rowbatch.consumer.sources.pubsub.clients import (
    check_credentials,
    client_address,
    default_publisher,
    default_subscriber,
)
from rowbatch.consumer.sources.pubsub.dead_letters import DeadLetters
from rowbatch.consumer.sources.pubsub.errors import PubSubPullError, not_held, warn_lease_lapsed
from rowbatch.consumer.sources.pubsub.grpc_calls import GrpcCalls
from rowbatch.consumer.sources.pubsub.held import HeldDeliveries
from rowbatch.consumer.sources.pubsub.id_batcher import AckNackBatches
from rowbatch.consumer.sources.pubsub.leases import MIN_ACK_DEADLINE_S, LeaseKeeper
from rowbatch.consumer.sources.pubsub.library_calls import LibraryCalls
from rowbatch.consumer.sources.pubsub.pull_flow import PullFlow, pull_loop
from rowbatch.consumer.sources.pubsub.pull_rpc import (
    RPC_TIMEOUT_S,
    PullRpc,
    ReceivedMessage,
    open_rpc,
)
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.source_base import PubSubSourceBase
from rowbatch.consumer.sources.pubsub.tasks import stop_tasks
from rowbatch.pubsub_env import project_of
from rowbatch.timing import SYSTEM_CLOCKS, Clocks

if TYPE_CHECKING:
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

_LOG = logging.getLogger(__name__)

_STOP_WAIT_S = 5.0
"""How long ``close`` waits for a cancelled task, or for the gRPC channel, to finish."""


@dataclass(frozen=True)
class LibraryClients:
    """google-cloud-pubsub clients for a :class:`PubSubPullSource` to use instead of a channel
    of its own (it does not close them): ``subscriber`` for the start-up check (with
    ``client="threads"``, for Pull, Acknowledge and ModifyAckDeadline too, in worker
    threads), ``publisher`` for dead letters (only beside a subscriber), ``async_subscriber``
    for Pull, Acknowledge and ModifyAckDeadline."""

    subscriber: pubsub_v1.SubscriberClient | None = None
    publisher: pubsub_v1.PublisherClient | None = None
    async_subscriber: SubscriberAsyncClient | None = None


class PubSubPullSource(PubSubSourceBase):
    """``Source`` over one Pub/Sub subscription, on unary Pull (see the module docstring).

    Without clients, it talks to Pub/Sub on a grpc.aio channel of its own (``GrpcCalls``,
    from the environment: ``PUBSUB_EMULATOR_HOST`` selects the emulator). Given
    google-cloud-pubsub ``clients`` (:class:`LibraryClients`), it uses those instead and does
    not close them. ``rpc`` replaces the Pull/Acknowledge/ModifyAckDeadline client and, with
    no clients given, leaves nothing to check or dead-letter to (unit tests);
    ``clocks.monotonic`` and ``clocks.sleep`` drive all lease and batching timing.
    Everything runs on the event loop's thread."""

    config: PubSubSettings

    def __init__(
        self,
        config: PubSubSettings,
        *,
        consumer_version: str | None = None,
        clients: LibraryClients | None = None,
        rpc: PullRpc | None = None,
        host: str | None = None,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
    ) -> None:
        subscriber, publisher, async_subscriber = (
            (clients.subscriber, clients.publisher, clients.async_subscriber)
            if clients is not None
            else (None, None, None)
        )
        clock, sleep = clocks.monotonic, clocks.sleep
        self.config = config
        self.consumer_version = consumer_version or package_version()
        self._on_dead_letter = on_dead_letter
        """Same hook as the other sources'; this source sends no dead letter on its own."""
        self._clock = clock
        self._sleep = sleep
        if publisher is not None and subscriber is None:
            raise ValueError("a publisher is used beside a subscriber: pass both or neither")
        project = project_of(config.subscription)
        self._grpc: GrpcCalls | None = None
        """The source's own channel (closed by ``close``); None when given clients or ``rpc``."""
        self._closers: list[Callable[[], object]] = []
        """Close the library clients this source built (``client="threads"`` without a
        subscriber, or a publisher beside a given subscriber)."""
        if config.client == "threads" and subscriber is None and rpc is None:
            subscriber = default_subscriber(project)
            self._closers.append(subscriber.close)
        self._subscriber = subscriber
        self._calls: PubSubCalls | None = None
        if subscriber is not None:
            if publisher is None and config.dead_letter_topic is not None:
                publisher = default_publisher(project_of(config.dead_letter_topic))
                self._closers.append(publisher.transport.close)
            self._calls = LibraryCalls(subscriber, publisher)
        elif rpc is None:
            check_credentials(project)
            self._grpc = GrpcCalls(project)
            self._calls = self._grpc
        self._async_subscriber = async_subscriber
        self._rpc: PullRpc | None = rpc
        self._dead_letters = DeadLetters(
            self._calls,
            topic=config.dead_letter_topic,
            consumer_version=self.consumer_version,
            timeout_s=config.dead_letter_timeout_s,
        )
        target = client_address(subscriber) if self._calls is not None else "(test)"
        self.host = host if host is not None else target

        self._changed = asyncio.Event()
        """Something to yield (or an error, or close)."""
        self._held = HeldDeliveries(config.subscription, self._changed)
        self._leases = LeaseKeeper(
            self._modify_ack_deadline,
            subscription=config.subscription,
            extension_s=config.max_lease_extension_s,
            max_duration_s=config.max_lease_duration_s,
            clock=clock,
            sleep=sleep,
        )
        self._settling = AckNackBatches(
            self._api,
            max_ids=config.ack_max_ids,
            max_delay_s=config.ack_delay_ms / 1000,
            retry_s=config.rpc_retry_s,
            clock=clock,
            sleep=sleep,
            on_settled=self._wake_pullers,
        )
        self._flow = PullFlow(config, self._held, lambda: self._settling.pending)
        self._pullers: list[asyncio.Task[None]] = []
        self._lease_tasks: list[asyncio.Task[None]] = []
        self._batcher_tasks: list[asyncio.Task[None]] = []
        self._error: BaseException | None = None
        self._started = False

    # -- Source protocol ---------------------------------------------------------------------

    def deliveries(self) -> DeliveryIterator:
        """Deliveries until ``close`` (then the iteration ends). Pulling starts on the first
        ``__anext__``. Raises ``PubSubPullError`` if Pull fails for good."""
        return DeliveryIterator(self._next_delivery)

    def vectors(self) -> VectorIterator:
        """``deliveries()`` in runs: each step yields every delivery ready to be yielded
        (at most ``VECTOR_MAX``), such as the messages of one Pull response."""
        return VectorIterator(self._next_vector)

    async def ack(self, delivery: Delivery) -> None:
        """Settled here at once; the Acknowledge call follows within ``ack_delay_s``."""
        self._settle(delivery, nacked=False)

    async def ack_many(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
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
            raise not_held(delivery)
        await self._dead_letters.forward(
            delivery, reason, nack=self.nack, ack_if_held=self._ack_if_held
        )

    def share_budget(self, budget: SharedBudget) -> None:
        """Hold what is received and not yet yielded in the pipeline's ``budget`` and pull
        only while it has room (called by the pipeline when it starts; see ``pull_flow``)."""
        self._flow.share(budget)

    def pause(self) -> None:
        """Stop pulling and yielding; pulls in flight still land in the buffer, and every
        held message stays leased."""
        self._flow.paused = True

    def resume(self) -> None:
        self._flow.paused = False
        self._flow.room.set()
        self._changed.set()

    async def close(self) -> None:
        """Stop pulling, nack every unsettled delivery, send every pending ack and nack and
        wait for the answers, then close the clients this source created. Idempotent.

        Bounded in time: pulls in flight get ``close_pull_wait_s``; the acks and nacks
        ``rpc_retry_s`` plus one call's deadline (what is not confirmed by then comes back
        after its ack deadline); each cancelled task and the gRPC channel ``_STOP_WAIT_S``."""
        if self._flow.closing:
            return
        self._flow.closing = True
        self._flow.room.set()
        self._changed.set()
        if self._pullers:
            await asyncio.wait(self._pullers, timeout=self.config.close_pull_wait_s)
        await stop_tasks(self._pullers, _STOP_WAIT_S, where=self._sub)
        # Lease keeping ends before the nacks go out: an extension sent after a nack would
        # keep the message from being redelivered until the extension ran out.
        await stop_tasks(self._lease_tasks, _STOP_WAIT_S, where=self._sub)
        unsettled = self._held.release_all()
        self._flow.report()
        self._leases.clear()
        self._settling.nacks.extend(unsettled)
        if self._started:
            await self._flush_at_close()
            if unsettled:
                _LOG.info(
                    "nacked %d unsettled message(s) on %s at close (%d nack(s) confirmed)",
                    len(unsettled),
                    self._sub,
                    self._settling.nacks.confirmed,
                )
        await stop_tasks(self._batcher_tasks, _STOP_WAIT_S, where=self._sub)
        if self._rpc is not None:
            try:
                await asyncio.wait_for(self._rpc.close(), _STOP_WAIT_S)
            except TimeoutError:
                _LOG.warning(
                    "the Pull client of %s did not close within %g s", self._sub, _STOP_WAIT_S
                )
        if self._grpc is not None:
            try:
                await asyncio.wait_for(self._grpc.close(), _STOP_WAIT_S)
            except TimeoutError:
                _LOG.warning("the channel to %s did not close within %g s", self.host, _STOP_WAIT_S)
        for close in self._closers:
            close()

    async def check(self) -> None:
        """Start-up check as for the streaming source (server, subscription, dead-letter
        topic or policy); also reads the subscription's ack deadline for lease timing."""
        subscription = await self._check_subscription()
        if subscription is None:
            return
        deadline = float(subscription.ack_deadline_seconds or 0)
        self._leases.receipt_deadline_s = max(MIN_ACK_DEADLINE_S, deadline)
        if subscription.enable_message_ordering:
            _LOG.info(
                "subscription %s has message ordering: a key's next message is delivered "
                "only once the previous one is settled",
                self._sub,
            )

    # -- extras ------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._flow.paused

    @property
    def buffered(self) -> int:
        """Received and leased, not yet yielded (waiting behind an ordering key included)."""
        return self._held.buffered

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
        return self._settling.pending

    @property
    def extension_calls(self) -> int:
        """ModifyAckDeadline calls that extended leases (for tests and the bench)."""
        return self._leases.extension_calls

    async def flush(self) -> None:
        """Send pending acks and nacks now and wait for the answers."""
        await self._settling.flush()

    async def extend_due_leases(self) -> int:
        """Extend every lease that is due (what the lease task does when it wakes); returns
        how many ack ids were extended. Messages held past ``max_lease_duration_s`` are
        dropped instead (a buffered one is nacked when it would be yielded)."""
        return await self._leases.extend_due()

    # -- internals ---------------------------------------------------------------------------

    def _api(self) -> PullRpc:
        if self._rpc is None:
            self._rpc = open_rpc(
                self.config.client,
                self._sub,
                calls=self._grpc,
                subscriber=self._subscriber,
                async_subscriber=self._async_subscriber,
            )
        return self._rpc

    async def _modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        await self._api().modify_ack_deadline(ack_ids, seconds)

    def _start(self) -> None:
        self._started = True
        api = self._api()
        spawn = asyncio.get_running_loop().create_task
        self._pullers = [
            spawn(
                pull_loop(
                    api,
                    self._flow,
                    self._receive,
                    subscription=self._sub,
                    host=self.host,
                    clock=self._clock,
                    sleep=self._sleep,
                ),
                name=f"pubsub-pull-{i}",
            )
            for i in range(self.config.pull_concurrency)
        ]
        self._batcher_tasks = [
            spawn(self._settling.acks.run(), name="pubsub-acks"),
            spawn(self._settling.nacks.run(), name="pubsub-nacks"),
        ]
        self._lease_tasks = [spawn(self._leases.run(), name="pubsub-leases")]
        for task in (*self._pullers, *self._batcher_tasks, *self._lease_tasks):
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
        if task.cancelled() or self._flow.closing:
            return
        error = task.exception()
        if error is not None and self._error is None:
            self._error = error
            _LOG.error("%s on %s stopped: %r", task.get_name(), self._sub, error)
            self._changed.set()

    async def _flush_at_close(self) -> None:
        limit = self.config.rpc_retry_s + RPC_TIMEOUT_S
        try:
            await asyncio.wait_for(self.flush(), limit)
        except TimeoutError:
            _LOG.warning(
                "acks and nacks on %s not confirmed within %g s at close: those messages "
                "come back after their ack deadline",
                self._sub,
                limit,
            )

    def _wake_pullers(self) -> None:
        self._flow.room.set()

    def _receive(self, received: Sequence[ReceivedMessage], sent_at: float) -> None:
        now = self._clock()
        ack_ids = self._held.receive(received, now)
        self._flow.report()
        self._leases.add(ack_ids, received_at=now, sent_at=sent_at)
        self._changed.set()

    async def _next_delivery(self) -> Delivery:
        vector = await self._next_run(1)
        return vector[0]

    async def _next_vector(self) -> list[Delivery]:
        return await self._next_run(VECTOR_MAX)

    async def _next_run(self, limit: int) -> list[Delivery]:
        """The next 1 to ``limit`` deliveries ready to be yielded (waiting for some)."""
        if not self._started and not self._flow.closing:
            self._start()
        while True:
            if self._flow.closing:
                raise StopAsyncIteration
            if self._error is not None:
                error = self._error
                if isinstance(error, PubSubPullError):
                    raise error
                raise PubSubPullError(f"pulling from {self._sub} stopped: {error!r}") from error
            if not self._flow.paused and self._held.has_ready():
                vector = self._pop(limit)
                if vector:
                    return vector
                continue
            self._changed.clear()
            await self._changed.wait()

    def _pop(self, limit: int) -> list[Delivery]:
        """Up to ``limit`` ready deliveries; those held past ``max_lease_duration_s`` are
        nacked instead."""
        held = self._held
        now = self._clock()
        vector: list[Delivery] = []
        while len(vector) < limit and held.has_ready():
            delivery, received_at = held.pop_ready()
            if now - received_at < self.config.max_lease_duration_s:
                vector.append(delivery)
                continue
            warn_lease_lapsed(_LOG, delivery, self.config.max_lease_duration_s)
            self._settle(delivery, nacked=True)
        self._flow.report()
        return vector

    def _settle(self, delivery: Delivery, *, nacked: bool) -> None:
        """Settled here (flow control has room at once); the ack or nack call follows."""
        ack_id, given_back = self._held.release(delivery, nacked=nacked)
        if given_back:
            self._flow.report()
        self._leases.remove(ack_id)
        settling = self._settling
        (settling.nacks if nacked else settling.acks).add(ack_id)
        for other in given_back:
            self._leases.remove(other)
            settling.nacks.add(other)
        self._flow.room.set()

    def _ack_if_held(self, delivery: Delivery) -> bool:
        if delivery not in self._held:
            return False
        self._settle(delivery, nacked=False)
        return True
