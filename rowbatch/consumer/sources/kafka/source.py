"""Apache Kafka behind the ``Source`` protocol, on aiokafka, as a consumer-group member.

How it works (aiokafka 0.14; ``aiokafka/consumer/{consumer,group_coordinator,fetcher}.py``):

* **Fetching** (``readahead.py``). One background *poll task* calls ``getmany`` in a loop
  and puts records into a local buffer; ``deliveries()`` yields from that buffer. The poll
  task never waits long for the pipeline (at most ``STALL_S`` for a full buffer), so the
  consumer keeps "polling" while the pipeline is busy or paused: aiokafka
  counts ``max_poll_interval_ms`` from the end of the last ``getmany`` (its
  ``fetcher_idle_time``) and leaves the group when it is exceeded; heartbeats are sent by
  aiokafka's own heartbeat task. Membership is therefore lost only if the event loop itself
  is blocked for that long.
* **Backpressure** (``readahead.py``): pausing, and the read-ahead bounded by the configured
  limits, the pipeline's work bound in rows and its shared byte budget.
* **Commits and rebalances** (``partitions.py``, ``revoke.py``): the committed offset of a
  partition never passes an unsettled record; each assignment is an epoch, and a revoke takes
  back from the pipeline the records not yet sent to the model, waits ``revoke_grace_s`` for
  the others, commits, then forgets the partitions.
* **nack = re-deliver locally.** Kafka has no per-record nack: committing past a record
  would lose it, and seeking back would re-read everything after it. So a nacked record stays
  unsettled (the partition's commit waits at it) and is put back in a retry queue, yielded
  again after ``redelivery_backoff_s * 2**(attempt-1)`` (capped by
  ``redelivery_backoff_max_s``) with ``delivery_attempt`` + 1, while the rest of the
  partition keeps flowing. The intake dead-letters a delivery whose attempt exceeds
  ``max_delivery_attempts`` (reason ``too-many-attempts``), which settles it, so a record
  that keeps failing holds the partition's commit for a bounded number of attempts only.
  The attempt count is local: it restarts at 1 when the partition moves to another member
  (or the process restarts). A nack after ``close``, or of a revoked partition's record,
  changes nothing (the next owner reads it again).
* **Dead letters** (``dead_letters.py``) to ``<topic>.dlq``, settled once the broker confirmed.
* **Lag** (``lag.py``): the whole group's lag per partition, in the registry it was given,
  and the group's backlog and write rate for the scaling signal (``rowbatch_desired_replicas``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry

from rowbatch.consumer.observe.scaling import ScalingSignal
from rowbatch.consumer.sources.base import (
    VECTOR_MAX,
    DeliveryIterator,
    SharedBudget,
    VectorIterator,
    Withdraw,
    WorkBound,
    package_version,
)
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka.clients import KafkaClients
from rowbatch.consumer.sources.kafka.dead_letters import (
    RowPartRecord,
    dead_letter_headers,
    publish_dead_letter,
)
from rowbatch.consumer.sources.kafka.errors import (
    DeadLetterFailed,
    KafkaConsumeError,
    KafkaUnreachable,
)
from rowbatch.consumer.sources.kafka.lag import LagMonitor, standalone_signal
from rowbatch.consumer.sources.kafka.partitions import Partitions, RebalanceListener
from rowbatch.consumer.sources.kafka.readahead import ReadAhead
from rowbatch.consumer.sources.kafka.records import Held, to_delivery
from rowbatch.consumer.sources.kafka.revoke import Revoker
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.timing import Backoff
from rowbatch.wire.dead_letter import ReasonClass
from rowbatch.wire.errors import WireError

_LOG = logging.getLogger(__name__)


class KafkaSource:
    """``Source`` over one Kafka topic, as a member of consumer group ``group_id``.

    Clients are created on first use (``check`` or the first delivery) and closed by
    ``close``. ``registry``: where the lag gauges go (the consumer's metrics registry); a
    private one when not given. ``consumer_factory``/``producer_factory`` replace the aiokafka
    classes (tests). ``on_dead_letter(reason)`` is called after each dead letter the source
    sends on its own initiative is confirmed (the pipeline counts the ones it asks for).
    ``signal``: the consumer's scaling signal, which the lag report feeds; without one the
    source keeps its own (gauges in ``registry``). Everything runs on the event loop's thread."""

    def __init__(
        self,
        config: KafkaSettings,
        *,
        consumer_version: str | None = None,
        registry: CollectorRegistry | None = None,
        consumer_factory: Callable[..., Any] | None = None,
        producer_factory: Callable[..., Any] | None = None,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
        signal: ScalingSignal | None = None,
    ) -> None:
        self.config = config
        self.consumer_version = consumer_version or package_version()
        """Written to ``rowbatch-dlq-consumer-version``."""
        self._on_dead_letter = on_dead_letter
        """Called once per dead letter the source sent on its own initiative (records whose
        headers are not UTF-8), after the broker confirmed it; not for ``dead_letter`` calls
        of the pipeline, which counts those itself."""
        self.registry = registry if registry is not None else CollectorRegistry()
        self._clients = KafkaClients(
            config,
            consumer_factory=consumer_factory or AIOKafkaConsumer,
            producer_factory=producer_factory or AIOKafkaProducer,
            closed=lambda: self._closed,
        )
        self._partitions = Partitions(config.topic, config.commit_timeout_s)
        self._ahead = ReadAhead(config, self._clients.started_consumer)
        self._redelivery = Backoff(
            min(config.redelivery_backoff_s, config.redelivery_backoff_max_s),
            config.redelivery_backoff_max_s,
            jitter=0.0,
        )
        """The delay of the n-th re-delivery of a record (an initial delay above the cap
        waits the cap, as it always did)."""
        self._unsettled: dict[Delivery, Held] = {}
        """Yielded and not yet settled."""
        self._revoker = Revoker(
            topic=config.topic,
            grace_s=config.revoke_grace_s,
            registry=self.registry,
            partitions=self._partitions,
            ahead=self._ahead,
            unsettled=self._unsettled,
            commit=self._commit,
            closed=lambda: self._closed,
        )
        self._listener = RebalanceListener(self._revoker.revoke, self._on_assigned)
        self._lag = LagMonitor(
            config,
            self.registry,
            rows_per_record=lambda: self._ahead.rows_per_record,
            signal=signal or standalone_signal(config, self.registry),
        )
        self._changed = asyncio.Event()
        self._undecodable: deque[tuple[Delivery, WireError]] = deque()
        """Registered records whose headers are not UTF-8, to dead-letter here."""
        self._closed = False
        self._error: BaseException | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.dead_lettered_here = 0
        """Records the source dead-lettered itself (headers that are not UTF-8)."""

    # -- Source protocol ---------------------------------------------------------------------

    async def check(self) -> None:
        """Start-up check: the brokers answer (``KafkaUnreachable`` naming them, within
        ``check_timeout_s``), the topic and the dead-letter topic exist
        (``KafkaConfigError`` naming the missing ones). Then joins the group (within
        ``join_timeout_s``). After ``KafkaUnreachable`` it may be called again (start-up waits
        for the brokers: ``open_source``); on any other failure the source is closed (its
        clients stopped): it cannot be used any more."""
        try:
            await self._clients.check_topics()
            await self._ensure_consumer()
        except KafkaUnreachable:
            raise
        except BaseException:
            await self.close()
            raise

    def deliveries(self) -> DeliveryIterator:
        """Deliveries until ``close`` (then the iteration ends). Joins the group on the first
        ``__anext__`` if ``check`` did not. Raises ``KafkaConsumeError`` if consuming fails
        for good."""
        return DeliveryIterator(self._next_delivery)

    def vectors(self) -> VectorIterator:
        """``deliveries()`` in runs: each step yields every record ready to be yielded (due
        retries first, then the read-ahead in fetch order), at most ``VECTOR_MAX``."""
        return VectorIterator(self._next_vector)

    async def ack(self, delivery: Delivery) -> None:
        self._settle(self._take(delivery))

    async def ack_many(self, deliveries: Sequence[Delivery]) -> None:
        for delivery in deliveries:
            self._settle(self._take(delivery))

    async def nack(self, delivery: Delivery) -> None:
        """Re-deliver locally after a backoff, with ``delivery_attempt`` + 1; the partition's
        commit waits at this record meanwhile (see the module docstring)."""
        held = self._take(delivery)
        if self._closed or not self._partitions.is_current(held):
            return
        held.attempt += 1
        delay = self._redelivery.wait(held.attempt - 1)
        self._ahead.retry(held, time.monotonic() + delay)
        self._changed.set()

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        """Publish the original key, value and headers plus ``rowbatch-dlq-*`` headers to the
        dead-letter topic, wait for the broker's confirmation, then settle the record. Raises
        ``DeadLetterFailed`` (delivery left unsettled) when the publish is not confirmed in
        time, ``ValueError`` if the delivery is not held. A delivery whose partition was
        revoked meanwhile is dropped without publishing (its next owner handles it)."""
        held = self._unsettled.get(delivery)
        if held is None:
            raise self._not_held(delivery)
        if not self._partitions.is_assigned(held):
            self._take(delivery)
            _LOG.info(
                "not dead-lettering %s: its partition was revoked (the next owner reads it again)",
                delivery.message_id,
            )
            return
        topic = self.config.dlq_topic
        headers = dead_letter_headers(
            held.record,
            delivery,
            reason,
            group_id=self.config.group_id,
            consumer_version=self.consumer_version,
        )
        await publish_dead_letter(
            self._ensure_producer,
            topic,
            held.record,
            headers,
            message_id=delivery.message_id,
            timeout_s=self.config.dead_letter_timeout_s,
        )
        if delivery not in self._unsettled:
            _LOG.warning(
                "%s was dead-lettered to %s but settled meanwhile; not settling it again",
                delivery.message_id,
                topic,
            )
            return
        self._settle(self._take(delivery))

    @property
    def dead_letters_rows(self) -> bool:
        """Rows can be dead-lettered on their own (``DeadLettersRows``)."""
        return True

    async def dead_letter_rows(
        self,
        delivery: Delivery,
        payload: bytes,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
    ) -> None:
        """Publish a row part of ``delivery`` (``payload`` and ``attributes`` as its value and
        headers, the record's key) with the ``rowbatch-dlq-*`` headers to the dead-letter
        topic and wait for the broker's confirmation; the record stays unsettled."""
        held = self._unsettled.get(delivery)
        if held is None:
            raise self._not_held(delivery)
        original = held.record
        part = RowPartRecord(
            topic=original.topic,
            partition=original.partition,
            offset=original.offset,
            key=original.key,
            value=payload,
            headers=[(k, v.encode("utf-8")) for k, v in attributes.items()],
        )
        headers = dead_letter_headers(
            part,
            delivery,
            reason,
            group_id=self.config.group_id,
            consumer_version=self.consumer_version,
        )
        await publish_dead_letter(
            self._ensure_producer,
            self.config.dlq_topic,
            part,
            headers,
            message_id=delivery.message_id,
            timeout_s=self.config.dead_letter_timeout_s,
        )

    def pause(self) -> None:
        """Stop yielding and pause fetching of every assigned partition; polling (and so
        group membership) goes on."""
        self._ahead.paused = True
        self._ahead.update_fetch_pause()

    def resume(self) -> None:
        self._ahead.paused = False
        self._ahead.update_fetch_pause()
        self._changed.set()

    def share_budget(self, budget: SharedBudget) -> None:
        """Hold the read-ahead in the pipeline's ``budget`` and read ahead only while it has
        room (called by the pipeline when it starts)."""
        self._ahead.share(budget)

    def bound_read_ahead(self, bound: WorkBound) -> None:
        """Read ahead no more than ``bound.rows`` rows (unless ``max_buffered_rows`` is set)."""
        self._ahead.bound(bound.rows)

    def on_withdraw(self, withdraw: Withdraw) -> None:
        """At a revoke, take back through ``withdraw`` what the pipeline has not yet sent to
        the model (see ``revoke.py``)."""
        self._revoker.register(withdraw)

    @property
    def read_ahead_bytes(self) -> int:
        """What the buffered and retry-waiting records cost."""
        return self._ahead.bytes

    async def close(self) -> None:
        """Stop polling, commit what is committable, leave the group, close the clients.
        Unsettled records are not committed past: the partition's next owner reads them
        again. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        self._partitions.settled.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._clients.consumer_started:
            await self._commit(set(self._partitions.fetching), "close")
        await self._clients.stop()

    # -- extras ------------------------------------------------------------------------------

    @property
    def paused(self) -> bool:
        return self._ahead.paused

    @property
    def buffered(self) -> int:
        """Fetched and not yet yielded (current partitions only)."""
        return len(self._ahead.buffer)

    @property
    def outstanding(self) -> int:
        """Yielded and not yet settled."""
        return len(self._unsettled)

    @property
    def assignments(self) -> int:
        """Partition assignments received (1 after joining; +1 per rebalance)."""
        return self._partitions.assignments

    @property
    def withdrawn(self) -> int:
        """Records taken back from the pipeline at revokes."""
        return self._revoker.withdrawn

    @property
    def commits(self) -> int:
        """Successful offset commits."""
        return self._partitions.commits

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member currently takes records from."""
        return set(self._partitions.fetching)

    def committable(self) -> dict[TopicPartition, int]:
        """What a commit now would send, per current partition."""
        return self._partitions.committable()

    def exceeded_attempts(self, delivery: Delivery) -> bool:
        limit = self.config.max_delivery_attempts
        return limit is not None and delivery.delivery_attempt > limit

    async def refresh_lag(self) -> dict[int, int]:
        """Read end offsets and the group's committed offsets of every partition of the
        topic, update the gauges, and return the lag per partition."""
        return await self._lag.refresh(await self._ensure_consumer())

    # -- internals: clients, tasks, rebalances -----------------------------------------------

    @property
    def _buffer(self) -> deque[Held]:
        """The fetched records not yet yielded."""
        return self._ahead.buffer

    async def _ensure_producer(self) -> Any:
        return await self._clients.ensure_producer()

    async def _ensure_consumer(self) -> Any:
        return await self._clients.ensure_consumer(self._listener, self._start_tasks)

    def _start_tasks(self) -> None:
        self._tasks = [
            asyncio.create_task(self._poll_loop(), name="rowbatch-kafka-poll"),
            asyncio.create_task(self._commit_loop(), name="rowbatch-kafka-commit"),
            asyncio.create_task(self._lag.run(self.refresh_lag), name="rowbatch-kafka-lag"),
        ]

    async def _poll_loop(self) -> None:
        await self._ahead.fetch(
            self._clients.consumer,
            self._partitions.received,
            closed=lambda: self._closed,
            fetched=self._changed.set,
            fail=self._fail,
        )

    def _fail(self, exc: BaseException) -> None:
        _LOG.error("consuming from Kafka topic %s failed: %r", self.config.topic, exc)
        self._error = exc
        self._changed.set()

    async def _commit_loop(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.config.commit_interval_s)
                await self._commit(set(self._partitions.fetching), "periodic")
        except Exception as exc:  # noqa: BLE001 - a bug here must stop consuming, not commits
            self._fail(exc)

    async def _commit(self, tps: set[TopicPartition], why: str) -> None:
        await self._partitions.commit(self._clients.consumer, tps, why)

    def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        mine = self._partitions.assign(assigned)
        consumer = self._clients.consumer
        if self._ahead.fetch_paused and mine and consumer is not None:
            consumer.pause(*mine)

    # -- internals: deliveries ---------------------------------------------------------------

    async def _next_delivery(self) -> Delivery:
        vector = await self._next_run(1)
        return vector[0]

    async def _next_vector(self) -> list[Delivery]:
        return await self._next_run(VECTOR_MAX)

    async def _next_run(self, limit: int) -> list[Delivery]:
        """The next 1 to ``limit`` deliveries ready to be yielded (waiting for some)."""
        if not self._clients.consumer_started and not self._closed:
            await self._ensure_consumer()
        while True:
            if self._error is not None:
                raise KafkaConsumeError(
                    f"consuming Kafka topic {self.config.topic} "
                    f"({self.config.bootstrap_servers}) failed: {self._error!r}"
                ) from self._error
            if self._closed:
                raise StopAsyncIteration
            while self._undecodable:  # put aside while a vector was being handed over
                await self._dead_letter_undecodable(*self._undecodable.popleft())
            now = time.monotonic()
            if not self._ahead.paused:
                ready = self._ahead.pop_ready_many(now, self._partitions.is_current, limit)
                if ready:
                    vector = []
                    for held in ready:
                        delivery, bad = self._register(held)
                        if bad is None:
                            vector.append(delivery)
                        else:
                            self._undecodable.append((delivery, bad))
                    if vector:
                        # Handed over with no await since they were registered, so a revoke
                        # finds each either here or in the pipeline; the undecodable ones
                        # are dead-lettered at the next call (they hold their commit).
                        return vector
                    continue
            self._changed.clear()
            timeout: float | None = None
            due = self._ahead.next_due()
            if not self._ahead.paused and due is not None:
                timeout = max(0.0, due - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._changed.wait()

    def _register(self, held: Held) -> tuple[Delivery, WireError | None]:
        """``held`` as a delivery, now unsettled, and why its headers cannot become
        attributes (then it must be dead-lettered here, not yielded), or None."""
        delivery, bad = to_delivery(held)
        self._unsettled[delivery] = held
        self._partitions.yielded(held)
        return delivery, bad

    async def _dead_letter_undecodable(self, delivery: Delivery, bad: WireError) -> None:
        """Dead-letter ``delivery`` here (``undecodable``): its headers are not UTF-8."""
        reason = DeadLetterReason(ReasonClass.UNDECODABLE, f"{bad.reason}: {bad}", code=bad.reason)
        try:
            await self.dead_letter(delivery, reason)
        except DeadLetterFailed:
            _LOG.exception("dead-letter publish failed for %s; retrying later", delivery.message_id)
            await self.nack(delivery)
            return
        self.dead_lettered_here += 1
        _LOG.warning("dead-lettered %s: undecodable headers: %s", delivery.message_id, bad)
        if self._on_dead_letter is not None:
            try:
                self._on_dead_letter(reason)
            except Exception:  # noqa: BLE001 - a metrics hook must not stop consumption
                _LOG.exception("on_dead_letter hook failed for %s", delivery.message_id)

    def _take(self, delivery: Delivery) -> Held:
        held = self._unsettled.pop(delivery, None)
        if held is None:
            raise self._not_held(delivery)
        self._partitions.returned(held)
        return held

    def _settle(self, held: Held) -> None:
        self._partitions.settle(held)

    def _not_held(self, delivery: Delivery) -> ValueError:
        return ValueError(
            f"record {delivery.message_id} is not held by this source (already settled, or "
            f"delivered by another source)"
        )


__all__ = ["KafkaSource"]
