"""The share-group source: ``members`` share consumers on their threads
(:mod:`.member`) feed one queue of deliveries on the event loop. A delivery is settled by
acknowledging its record on the member that holds it: ``ack`` accepts it (its rows are
written), ``dead_letter`` publishes rowbatch's dead letter (with the reason, confirmed by the
broker, as the classic Kafka source does) and then rejects it, ``nack`` releases it (the
broker delivers it again, counting a delivery). ``pause`` stops polling, so an outage costs
no delivery count while a member holds nothing; the records a member holds through a long
outage are delivered again once their lock runs out (idempotent writes make that harmless,
and ``max_delivery_attempts`` dead-letters a record before the broker would archive it)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from rowbatch.consumer.sources.base import (
    DeadLetterFailed,
    DeliveryIterator,
    SourceConfigError,
    SourceUnreachable,
)
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka.dead_letters import dead_letter_headers
from rowbatch.consumer.sources.kafka_share.client_log import client_logger
from rowbatch.consumer.sources.kafka_share.lag import ShareLagMonitor
from rowbatch.consumer.sources.kafka_share.member import (
    Ack,
    Member,
    MemberEvents,
    ShareClient,
    ShareRecord,
)
from rowbatch.consumer.sources.kafka_share.metrics import ShareMetrics
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.kafka_share.share_offsets import ShareOffsetsReader
from rowbatch.wire.dead_letter import ReasonClass
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import kafka_headers_to_attributes

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_MS = 1000
"""librdkafka's first wait before it connects to a broker again (doubling up to 10 s); its
default, 100 ms, has the share consumer try dozens of times a second while a broker is down."""
STOP_WAIT_S = 15.0
"""How long ``close`` waits for each member's thread (its last commit included)."""


def _confluent() -> Any:
    try:
        import confluent_kafka  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise SourceConfigError(
            "the kafka-share source needs confluent-kafka >= 2.15 (pip install confluent-kafka)"
        ) from exc
    if not hasattr(confluent_kafka, "ShareConsumer"):
        raise SourceConfigError(
            f"confluent-kafka {confluent_kafka.version()[0]} has no ShareConsumer: the "
            "kafka-share source needs 2.15 or later"
        )
    return confluent_kafka


def client_logging() -> dict[str, Any]:
    """What each librdkafka client of the source is given: its log through Python's logging,
    thinned (:mod:`.client_log`), and a reconnect backoff that does not flood it."""
    return {"logger": client_logger(), "reconnect.backoff.ms": RECONNECT_BACKOFF_MS}


def delivery_of(record: ShareRecord) -> tuple[Delivery, WireError | None]:
    """The delivery a record is yielded as, and why its headers could not be decoded (then it
    is dead-lettered by the source, not yielded)."""
    try:
        attributes = kafka_headers_to_attributes(record.headers)
        bad: WireError | None = None
    except WireError as exc:
        attributes, bad = {}, exc
    size = len(record.value) + sum(len(k) + len(v or b"") for k, v in record.headers)
    delivery = Delivery.of(
        message_id=f"{record.topic}/{record.partition}/{record.offset}",
        payload=record.value,
        attributes=attributes,
        publish_time=record.timestamp_ms / 1000 if record.timestamp_ms > 0 else time.time(),
        delivery_attempt=record.delivery_count,
        source=f"{record.topic}/{record.partition}",
        ordering_key=record.key.decode("utf-8", errors="replace") if record.key else "",
        size=size,
    )
    return delivery, bad


class KafkaShareSource:
    def __init__(
        self,
        settings: KafkaShareSettings,
        *,
        consumer_version: str,
        on_dead_letter: Callable[[DeadLetterReason], None] | None = None,
        registry: CollectorRegistry | None = None,
        client: Callable[[], ShareClient] | None = None,
        ack_types: dict[Ack, Any] | None = None,
        lag_reader: ShareOffsetsReader | None = None,
    ) -> None:
        """``registry``: where the source's counters and the group's lag go (:mod:`.metrics`,
        :mod:`.lag`; default: its own). ``client``/``ack_types``: the share consumer and its
        acknowledgement types (tests give fakes; default: confluent-kafka's). ``lag_reader``:
        where the lag is read (default: the brokers, when the share consumer is
        confluent-kafka's; with a fake consumer and no reader, the lag is not read)."""
        self._s = settings
        self._version = consumer_version
        self._on_dead_letter = on_dead_letter or (lambda reason: None)
        self._client = client
        self._ack_types = ack_types
        self._queue: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self._held: dict[Delivery, tuple[Member, ShareRecord]] = {}
        self._members: list[Member] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._producer: Any = None
        self._closed = False
        self._paused = False
        self._tasks: set[asyncio.Future[None]] = set()
        registry = registry or CollectorRegistry()
        self.metrics = ShareMetrics(registry, settings.topic)
        self.lag = ShareLagMonitor(settings, registry, reader=lag_reader)
        self._reads_lag = client is None or lag_reader is not None
        self._lag_task: asyncio.Task[None] | None = None

    @property
    def members(self) -> Sequence[Member]:
        return self._members

    # --- start-up -----------------------------------------------------------------------------

    async def check(self) -> None:
        """The topic and the dead-letter topic exist; the group's start and lock are set
        (``configure_group``)."""
        await asyncio.to_thread(self._check)

    def _check(self) -> None:
        kafka = _confluent()
        admin_api = importlib.import_module("confluent_kafka.admin")
        AdminClient = admin_api.AdminClient  # noqa: N806

        admin = AdminClient({**self._s.client_config(), **client_logging()})
        try:
            topics = admin.list_topics(timeout=self._s.check_timeout_s).topics
        except kafka.KafkaException as exc:
            raise SourceUnreachable(
                f"Kafka at {self._s.bootstrap_servers} did not answer: {exc}"
            ) from exc
        missing = [t for t in (self._s.topic, self._s.dlq_topic) if t not in topics]
        if missing:
            raise SourceConfigError(
                f"topic(s) {missing} do not exist on {self._s.bootstrap_servers} "
                "(rowbatch-consumer admin ensure creates them)"
            )
        if not self._s.configure_group:
            return
        from rowbatch.consumer.sources.kafka_share import group_config  # noqa: PLC0415

        configs = group_config.ConfluentGroupConfigs(
            admin, address=self._s.bootstrap_servers, timeout_s=self._s.check_timeout_s
        )
        group_config.configure_share_group(configs, self._s)

    # --- deliveries ---------------------------------------------------------------------------

    def deliveries(self) -> AsyncIterator[Delivery]:
        if not self._members:
            self._start()
        return DeliveryIterator(self._next)

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._client is None or self._ack_types is None:
            kafka = _confluent()
            config = {**self._s.consumer_config(), **client_logging()}
            self._client = self._client or (lambda: kafka.ShareConsumer(config))
            kinds = kafka.AcknowledgeType
            self._ack_types = self._ack_types or {
                Ack.ACCEPT: kinds.ACCEPT,
                Ack.RELEASE: kinds.RELEASE,
                Ack.REJECT: kinds.REJECT,
            }
        if self._reads_lag and self._lag_task is None:
            self._lag_task = asyncio.create_task(self.lag.run(), name="kafka-share-lag")
        for index in range(self._s.members):
            member = Member(
                index,
                self._client,
                self._s.topic,
                self._handoff,
                self._ack_types,
                events=MemberEvents(
                    late_acks=self.metrics.refused_commits, restarted=self.metrics.restarted
                ),
            )
            if self._paused:
                member.pause()
            self._members.append(member)
            member.start()

    def _handoff(self, member: Member, records: Sequence[ShareRecord]) -> None:
        """On the member's thread: the records to the event loop."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._take, member, records)

    def _take(self, member: Member, records: Sequence[ShareRecord]) -> None:
        self.metrics.took(
            member.index, len(records), sum(1 for r in records if r.delivery_count > 1)
        )
        for record in records:
            delivery, bad = delivery_of(record)
            self._held[delivery] = (member, record)
            if bad is not None:
                reason = DeadLetterReason(
                    ReasonClass.UNDECODABLE, f"{bad.reason}: {bad}", code=bad.reason
                )
                task = asyncio.ensure_future(self._dead_letter_or_release(delivery, reason))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                continue
            self._queue.put_nowait(delivery)

    async def _dead_letter_or_release(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        try:
            await self.dead_letter(delivery, reason)
            self._on_dead_letter(reason)  # the pipeline counts the dead letters it asks for
        except DeadLetterFailed:
            log.exception("dead letter of %s failed; releasing it", delivery.message_id)
            await self.nack(delivery)

    async def _next(self) -> Delivery:
        while True:
            if self._closed:
                raise StopAsyncIteration
            failed = next((m for m in self._members if m.failure is not None), None)
            if failed is not None:
                raise SourceUnreachable(
                    f"share consumer {failed.index} failed: {failed.failure}"
                ) from failed.failure
            try:
                async with asyncio.timeout(1.0):
                    item = await self._queue.get()
            except TimeoutError:
                continue
            if item is None:
                raise StopAsyncIteration
            return item

    # --- settling -----------------------------------------------------------------------------

    def _settle(self, delivery: Delivery, ack: Ack) -> None:
        held = self._held.pop(delivery, None)
        if held is None:
            return
        member, record = held
        member.settle(record.partition, record.offset, ack)
        self.metrics.acknowledged(ack)

    async def ack(self, delivery: Delivery) -> None:
        self._settle(delivery, Ack.ACCEPT)

    async def nack(self, delivery: Delivery) -> None:
        self._settle(delivery, Ack.RELEASE)

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        held = self._held.get(delivery)
        if held is None:
            return
        _, record = held
        headers = dead_letter_headers(
            record,
            delivery,
            reason,
            group_id=self._s.group_id,
            consumer_version=self._version,
        )
        await asyncio.to_thread(self._publish, record, headers, delivery.message_id)
        self._settle(delivery, Ack.REJECT)

    def _publish(
        self, record: ShareRecord, headers: list[tuple[str, bytes]], message_id: str
    ) -> None:
        kafka = _confluent()
        if self._producer is None:
            self._producer = kafka.Producer({**self._s.producer_config(), **client_logging()})
        outcome: list[Any] = []
        self._producer.produce(
            self._s.dlq_topic,
            value=record.value,
            key=record.key,
            headers=headers,
            on_delivery=lambda error, message: outcome.append(error),
        )
        self._producer.flush(self._s.dead_letter_timeout_s)
        if not outcome or outcome[0] is not None:
            why = outcome[0] if outcome else f"no confirmation in {self._s.dead_letter_timeout_s} s"
            raise DeadLetterFailed(
                f"dead-letter publish of {message_id} to {self._s.dlq_topic} failed: {why}"
            )

    # --- flow ---------------------------------------------------------------------------------

    def at_capacity(self) -> bool:
        """Every member holds records the pipeline has not settled: this replica handles all
        it can take (``SaturatesItself``), so its rate is its capacity. Not while paused (an
        outage is not a measure of capacity)."""
        members = self._members
        return not self._paused and bool(members) and all(m.holding for m in members)

    def pause(self) -> None:
        self._paused = True
        for member in self._members:
            member.pause()

    def resume(self) -> None:
        self._paused = False
        for member in self._members:
            member.resume()

    async def close(self) -> None:
        """Unsettled deliveries released, the members stopped (each commits what it
        acknowledged), the dead-letter producer flushed."""
        if self._closed:
            return
        self._closed = True
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
        await self.lag.close()
        await asyncio.gather(*self._tasks, return_exceptions=True)  # dead letters under way
        for delivery in list(self._held):
            self._settle(delivery, Ack.RELEASE)
        for member in self._members:
            member.stop()
        for member in self._members:
            if not await asyncio.to_thread(member.join, STOP_WAIT_S):
                log.warning(
                    "share consumer %d did not stop within %.0f s", member.index, STOP_WAIT_S
                )
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 5.0)
            self._producer = None  # destroyed with its last reference
        self._queue.put_nowait(None)
