"""KafkaSource without a broker: a fake aiokafka consumer/producer drives fetches, rebalances
and commits, so the commit rule can be checked against any interleaving of settles, nacks,
dead letters and revokes. Plus configuration, wiring and the lag arithmetic."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr, ValidationError

from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.observe import costs
from rowbatch.consumer.observe.lag import ThroughputMeter, desired_replicas, partition_lag
from rowbatch.consumer.section import MiB
from rowbatch.consumer.service.build_io import make_source
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka import errors as kafka_errors
from rowbatch.consumer.sources.kafka.errors import KafkaConfigError, KafkaUnreachable
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.wire.dead_letter import ReasonClass

TOPIC = "rows"
TP0 = TopicPartition(TOPIC, 0)
TP1 = TopicPartition(TOPIC, 1)


@dataclass
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None = b"k"
    value: bytes | None = b"v"
    headers: tuple[tuple[str, bytes], ...] = (("rowbatch-row-count", b"10"),)
    timestamp: int = 1_700_000_000_000


@dataclass
class FakeConsumer:
    """Just enough of AIOKafkaConsumer: fetches come from ``feed``; commits are recorded."""

    options: Mapping[str, Any]
    listener: Any = None
    assigned: set[TopicPartition] = field(default_factory=set)
    paused_tps: set[TopicPartition] = field(default_factory=set)
    pending: dict[TopicPartition, list[Record]] = field(default_factory=dict)
    commits: list[dict[TopicPartition, int]] = field(default_factory=list)
    committed_now: dict[TopicPartition, int] = field(default_factory=dict)
    end: dict[TopicPartition, int] = field(default_factory=dict)
    stopped: bool = False
    on_commit: Any = None
    asked: list[int] = field(default_factory=list)
    """``max_records`` of every ``getmany``."""
    pauses: int = 0
    """Calls of ``pause`` (aiokafka drops what it prefetched for a paused partition)."""

    def subscribe(self, topics: list[str], listener: Any) -> None:
        assert topics == [TOPIC]
        self.listener = listener

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    def feed(self, tp: TopicPartition, offsets: Iterable[int]) -> None:
        records = [Record(tp.topic, tp.partition, o) for o in offsets]
        self.pending.setdefault(tp, []).extend(records)
        self.end[tp] = max(self.end.get(tp, 0), *(o + 1 for o in offsets))

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[Any]]:
        out: dict[TopicPartition, list[Record]] = {}
        left = max_records
        for tp, recs in self.pending.items():
            if recs and left > 0 and tp in self.assigned and tp not in self.paused_tps:
                out[tp], self.pending[tp] = recs[:left], recs[left:]
                left -= len(out[tp])
        self.asked.append(max_records)
        if not out:
            await asyncio.sleep(0.005)
        return out

    def pause(self, *tps: TopicPartition) -> None:
        self.pauses += 1
        self.paused_tps |= set(tps)

    def resume(self, *tps: TopicPartition) -> None:
        self.paused_tps -= set(tps)

    def paused(self) -> set[TopicPartition]:
        return set(self.paused_tps)

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        if self.on_commit is not None:
            self.on_commit(offsets)
        assert set(offsets) <= self.assigned, "committed a partition it does not own"
        self.commits.append(dict(offsets))
        self.committed_now.update(offsets)

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end.get(tp, 0) for tp in tps}

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.committed_now.get(tp)

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    async def assign(self, tps: set[TopicPartition]) -> None:
        """A rebalance: revoke everything (eager), then assign ``tps``."""
        await self.listener.on_partitions_revoked(set(self.assigned))
        self.assigned = set(tps)
        self.paused_tps = set()
        # As aiokafka: a reassigned partition restarts from its committed offset.
        for tp in tps:
            start = self.committed_now.get(tp, 0)
            self.pending[tp] = [
                Record(tp.topic, tp.partition, o) for o in range(start, self.end.get(tp, 0))
            ]
        await self.listener.on_partitions_assigned(set(tps))


@dataclass
class FakeProducer:
    options: Mapping[str, Any]
    sent: list[tuple[str, Any, Any, list[tuple[str, bytes]]]] = field(default_factory=list)
    fail: bool = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def send(
        self, topic: str, value: Any, key: Any, headers: list[tuple[str, bytes]]
    ) -> asyncio.Future[None]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.fail:
            from aiokafka.errors import KafkaTimeoutError

            future.set_exception(KafkaTimeoutError("no"))
        else:
            self.sent.append((topic, value, key, headers))
            future.set_result(None)
        return future


@dataclass
class Rig:
    source: KafkaSource
    made: dict[str, Any]

    @property
    def consumer(self) -> FakeConsumer:
        return self.made["consumer"]  # type: ignore[no-any-return]

    @property
    def producer(self) -> FakeProducer:
        return self.made["producer"]  # type: ignore[no-any-return]


def make_rig(**extra: Any) -> Rig:
    made: dict[str, Any] = {}

    def consumer(**options: Any) -> FakeConsumer:
        made["consumer"] = FakeConsumer(options)
        return made["consumer"]  # type: ignore[no-any-return]

    def producer(**options: Any) -> FakeProducer:
        made["producer"] = FakeProducer(options)
        return made["producer"]  # type: ignore[no-any-return]

    options: dict[str, Any] = {
        "bootstrap_servers": "b:9092",
        "topic": TOPIC,
        "group_id": "g",
        "commit_interval_s": 3600,  # commits only when the test asks (revoke, close, _commit)
        "lag_interval_s": 3600,
        "revoke_grace_s": 0.2,
        "redelivery_backoff_s": 0.01,
    }
    config = KafkaSettings(**{**options, **extra})
    source = KafkaSource(config, consumer_factory=consumer, producer_factory=producer)
    return Rig(source, made)


async def start(rig: Rig, tps: set[TopicPartition]) -> None:
    await rig.source._ensure_consumer()
    await rig.source._ensure_producer()
    await rig.consumer.assign(tps)


async def take(source: KafkaSource, n: int) -> list[Delivery]:
    it = source.deliveries()
    async with asyncio.timeout(5):
        return [await anext(it) for _ in range(n)]


def offset(d: Delivery) -> int:
    return int(d.message_id.rsplit("/", 1)[1])


def partition(d: Delivery) -> TopicPartition:
    return TopicPartition(TOPIC, int(d.message_id.split("/")[1]))


async def test_revoke_waits_for_in_flight_records_then_commits_only_what_is_done() -> None:
    rig = make_rig()
    await start(rig, {TP0, TP1})
    rig.consumer.feed(TP0, range(5))
    rig.consumer.feed(TP1, range(3))
    got = await take(rig.source, 8)
    by = {(partition(d), offset(d)): d for d in got}
    for key in [(TP0, 0), (TP0, 1), (TP0, 3), (TP1, 0), (TP1, 1), (TP1, 2)]:
        await rig.source.ack(by[key])

    async def settle_during_revoke() -> None:
        await asyncio.sleep(0.05)
        await rig.source.ack(by[(TP0, 2)])  # in the grace period: counts

    settler = asyncio.create_task(settle_during_revoke())
    await rig.consumer.assign({TP1})  # TP0 goes to another member
    await settler
    # TP0: 4 was still unsettled after the grace: commit stops at 4. TP1: all done.
    assert rig.consumer.commits[-1] == {TP0: 4, TP1: 3}
    assert rig.source.assignment() == {TP1}
    # TP0/4 settles late: it belongs to a revoked assignment and is ignored.
    await rig.source.ack(by[(TP0, 4)])
    await rig.source._commit({TP0, TP1}, "test")
    assert rig.consumer.commits[-1] == {TP0: 4, TP1: 3}
    await rig.source.close()
    assert rig.consumer.stopped


async def test_buffered_records_of_revoked_partitions_are_not_yielded_and_not_committed() -> None:
    rig = make_rig()
    await start(rig, {TP0, TP1})
    rig.consumer.feed(TP0, range(4))
    [d0] = await take(rig.source, 1)  # the others wait in the local buffer
    await rig.source.ack(d0)
    await asyncio.sleep(0.05)
    assert rig.source.buffered == 3
    await rig.consumer.assign({TP1})
    assert rig.consumer.commits[-1] == {TP0: 1}
    assert rig.source.buffered == 0
    rig.consumer.feed(TP1, [0])
    [d] = await take(rig.source, 1)
    assert partition(d) == TP1
    await rig.source.close()


async def test_a_partition_coming_back_is_read_again_from_its_committed_offset() -> None:
    rig = make_rig()
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(3))
    old = await take(rig.source, 3)
    await rig.source.ack(old[0])
    await rig.consumer.assign({TP0})  # same member again; 1 and 2 were in flight
    assert rig.consumer.commits[-1] == {TP0: 1}
    again = await take(rig.source, 2)
    assert [offset(d) for d in again] == [1, 2]
    await rig.source.ack(old[1])  # old generation: ignored
    await rig.source.ack(again[1])
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.committed_now[TP0] == 1
    await rig.source.ack(again[0])
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.committed_now[TP0] == 3
    await rig.source.close()


async def test_pause_pauses_fetching_of_every_partition_including_new_ones() -> None:
    rig = make_rig()
    await start(rig, {TP0})
    rig.source.pause()
    assert rig.consumer.paused() == {TP0}
    await rig.consumer.assign({TP0, TP1})
    assert rig.consumer.paused() == {TP0, TP1}
    rig.consumer.feed(TP1, [0])
    await asyncio.sleep(0.05)
    assert rig.source.buffered == 0
    rig.source.resume()
    assert rig.consumer.paused() == set()
    [d] = await take(rig.source, 1)
    assert partition(d) == TP1
    await rig.source.close()


async def test_a_full_buffer_stops_fetching_without_pausing_the_partitions() -> None:
    """Pausing would make aiokafka drop what it prefetched and fetch it again on resume: a
    full buffer only stops the poll task from taking more until the pipeline takes some."""
    rig = make_rig(max_buffered_records=4)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(6))
    await until(lambda: rig.source.buffered == 4)
    asked = len(rig.consumer.asked)
    for _ in range(1_000):
        await asyncio.sleep(0)
    assert rig.source.buffered == 4
    assert len(rig.consumer.asked) == asked  # no fetch while full
    assert rig.consumer.pauses == 0
    await take(rig.source, 3)
    await until(lambda: rig.source.buffered == 3)  # the 2 left fetched: room for 3
    assert max(rig.consumer.asked) <= 4  # never more than the room left
    assert rig.consumer.pauses == 0
    await rig.source.close()


async def test_a_buffer_full_for_the_stall_time_pauses_fetching_until_it_drains_to_half() -> None:
    rig = make_rig(max_buffered_records=4)
    rig.source._ahead.stall_s = 0.0  # stalled as soon as the buffer is full
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(6))
    await until(lambda: rig.consumer.paused() == {TP0})
    assert rig.source.buffered == 4
    await take(rig.source, 1)
    assert rig.consumer.paused() == {TP0}  # 3 left
    await take(rig.source, 1)
    assert rig.consumer.paused() == set()  # 2 left: half of 4
    await rig.source.close()


RECORD_COST = (
    (len(b"v") + len(b"k") + len("rowbatch-row-count") + len(b"10"))
    + costs.RECORD_OVERHEAD_BYTES
    + costs.HEADER_OVERHEAD_BYTES
)
"""What one of the fake records costs read ahead (key, value, one header, overheads)."""


async def until(predicate: Any, rounds: int = 200_000) -> None:
    """Yield to the event loop (no timed sleep of ours) until ``predicate()``."""
    for _ in range(rounds):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_read_ahead_is_counted_at_its_real_cost() -> None:
    rig = make_rig(max_buffered_bytes=10 * RECORD_COST)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(12))
    await until(lambda: rig.source.buffered == 12)
    assert rig.source.read_ahead_bytes == 12 * RECORD_COST  # not 12 x 24 bytes of payload
    asked = len(rig.consumer.asked)
    for _ in range(1_000):
        await asyncio.sleep(0)
    assert len(rig.consumer.asked) == asked  # over max_buffered_bytes: no fetch
    await take(rig.source, 7)
    assert rig.source.read_ahead_bytes == 5 * RECORD_COST
    assert rig.consumer.pauses == 0
    await rig.source.close()


async def test_read_ahead_is_held_in_the_pipeline_budget_and_stops_when_it_is_full() -> None:
    rig = make_rig()
    budget = ByteBudget(40 * RECORD_COST)
    rig.source.share_budget(budget)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(5))
    await until(lambda: rig.source.buffered == 5)
    assert budget.ahead == 5 * RECORD_COST
    rig.consumer.feed(TP0, range(5, 60))
    await until(lambda: rig.source.buffered == 10)
    # A quarter of the budget at most, and no fetch asked for more than the room left holds.
    for _ in range(1_000):
        await asyncio.sleep(0)
    assert rig.source.buffered == 10
    assert budget.ahead == rig.source.read_ahead_bytes == budget.limit // 4
    assert rig.consumer.asked[1] == 5
    # The pipeline holds the rest and more (one message is always admitted alone).
    await budget.acquire(34 * RECORD_COST)
    taken = await take(rig.source, 6)  # the read-ahead shrinks as the pipeline takes records
    # ... and refills to what the budget has room for (6 of the 40), not to its share.
    await until(lambda: budget.ahead == 6 * RECORD_COST)
    for _ in range(1_000):
        await asyncio.sleep(0)
    assert budget.ahead == 6 * RECORD_COST
    await budget.release(34 * RECORD_COST)  # room again: the read-ahead fills its share
    await until(lambda: rig.source.buffered == 10)
    assert rig.consumer.pauses == 0  # never paused: nothing aiokafka fetched was dropped
    for d in taken:
        await rig.source.ack(d)
    await rig.source.close()


async def test_read_ahead_of_revoked_partitions_is_dropped_from_the_budget_at_once() -> None:
    rig = make_rig()
    budget = ByteBudget(1024 * 1024)
    rig.source.share_budget(budget)
    await start(rig, {TP0, TP1})
    rig.consumer.feed(TP0, range(6))
    rig.consumer.feed(TP1, range(4))
    await until(lambda: rig.source.buffered == 10)
    [d] = await take(rig.source, 1)
    await rig.source.nack(d)  # waits for its retry: read ahead too
    assert budget.ahead == 10 * RECORD_COST
    await rig.consumer.assign({TP1})  # TP0 goes to another member
    left = sum(1 for h in rig.source._buffer if h.tp == TP1)
    assert budget.ahead == rig.source.read_ahead_bytes == left * RECORD_COST
    await rig.source.close()


async def test_a_failed_dead_letter_leaves_the_record_unsettled() -> None:
    rig = make_rig()
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(2))
    d0, d1 = await take(rig.source, 2)
    await rig.source.ack(d1)
    rig.producer.fail = True
    reason = DeadLetterReason(ReasonClass.UNDECODABLE, "bad")
    with pytest.raises(kafka_errors.DeadLetterFailed, match="rows/0/0"):
        await rig.source.dead_letter(d0, reason)
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.committed_now[TP0] == 0
    await rig.source.nack(d0)
    [again] = await take(rig.source, 1)
    assert again.delivery_attempt == 2
    rig.producer.fail = False
    await rig.source.dead_letter(again, reason)
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.commits[-1] == {TP0: 2}
    [(topic, value, key, headers)] = rig.producer.sent
    assert (topic, value, key) == ("rows.dlq", b"v", b"k")
    names = dict(headers)
    assert names["rowbatch-dlq-delivery-attempt"] == b"2"
    assert names["rowbatch-row-count"] == b"10"
    await rig.source.close()


async def test_own_dead_letters_are_reported_once_with_their_code_the_pipelines_are_not() -> None:
    rig = make_rig()
    seen: list[DeadLetterReason] = []
    rig.source._on_dead_letter = seen.append  # what make_source passes, as a plain list here
    await start(rig, {TP0})
    rig.consumer.pending[TP0] = [
        Record(TOPIC, 0, 0, headers=(("rowbatch-chunk-id", b"\xff\xfe"),)),
        Record(TOPIC, 0, 1),
    ]
    [d1] = await take(rig.source, 1)
    assert offset(d1) == 1
    [own] = seen
    assert own.reason_class is ReasonClass.UNDECODABLE
    assert own.code == "invalid_header"
    assert dict(rig.producer.sent[0][3])["rowbatch-dlq-code"] == b"invalid_header"

    await rig.source.dead_letter(d1, DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "x"))
    assert len(seen) == 1, "the pipeline counts the dead letters it asks for"
    assert dict(rig.producer.sent[1][3])["rowbatch-dlq-code"] == b"column_type_mismatch"
    await rig.source.close()


def test_make_source_counts_the_sources_own_dead_letters_in_the_metrics() -> None:
    from rowbatch.consumer.observe.metrics import Metrics

    metrics = Metrics()
    source = make_source(
        KafkaSettings.model_validate(
            {"bootstrap_servers": "b:9092", "topic": "t", "group_id": "g"}
        ),
        metrics,
    )
    assert isinstance(source, KafkaSource)
    assert source.registry is metrics.registry
    assert source._on_dead_letter is not None
    source._on_dead_letter(DeadLetterReason(ReasonClass.UNDECODABLE, "bad header"))
    sample = metrics.registry.get_sample_value(
        "rowbatch_messages_dead_lettered_total", {"reason": "undecodable"}
    )
    assert sample == 1.0


@settings(max_examples=40, deadline=None)
@given(
    counts=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_interleaving_of_settles_and_rebalances_never_commits_past_an_unwritten_record(
    counts: tuple[int, int], seed: int
) -> None:
    """Records are acked, nacked (re-delivered), dead-lettered (sometimes failing) or left
    hanging, in random order, with rebalances and commits in between. Every commit, at any
    moment, must be at or below the first record of its partition not yet written."""
    asyncio.run(_interleaving(counts, random.Random(seed)))


async def _interleaving(counts: tuple[int, int], rng: random.Random) -> None:
    rig = make_rig(max_delivery_attempts=None, revoke_grace_s=0.01)
    done: dict[TopicPartition, set[int]] = {TP0: set(), TP1: set()}

    def check(offsets: Mapping[TopicPartition, int]) -> None:
        for tp, committed in offsets.items():
            assert all(o in done[tp] for o in range(committed)), (tp, committed, done[tp])

    await start(rig, {TP0, TP1})
    rig.consumer.on_commit = check
    rig.consumer.feed(TP0, range(counts[0]))
    rig.consumer.feed(TP1, range(counts[1]))
    held: list[Delivery] = []
    it = rig.source.deliveries()
    for _ in range(200):
        if all(len(done[tp]) == n for tp, n in zip((TP0, TP1), counts, strict=True)):
            break
        step = rng.random()
        if step < 0.45 or not held:
            with contextlib.suppress(TimeoutError):
                held.append(await asyncio.wait_for(anext(it), 0.02))
            continue
        d = held.pop(rng.randrange(len(held)))
        if step < 0.7:
            await rig.source.ack(d)
            done[partition(d)].add(offset(d))
        elif step < 0.8:
            await rig.source.nack(d)
        elif step < 0.9:
            rig.producer.fail = rng.random() < 0.3
            try:
                await rig.source.dead_letter(d, DeadLetterReason(ReasonClass.UNDECODABLE, "x"))
            except kafka_errors.DeadLetterFailed:
                await rig.source.nack(d)
            else:
                done[partition(d)].add(offset(d))
        elif step < 0.95:
            await rig.source._commit({TP0, TP1}, "test")
            held.append(d)
        else:
            # A rebalance; the held deliveries of the old assignment are dropped (their
            # records come back from the committed offset).
            held.clear()
            await rig.consumer.assign(rng.choice([{TP0, TP1}, {TP0}, {TP1}, {TP0, TP1}]))
            if rig.consumer.assigned != {TP0, TP1}:
                await rig.consumer.assign({TP0, TP1})
    await rig.source._commit({TP0, TP1}, "test")
    await rig.source.close()
    assert rig.consumer.commits, "nothing was ever committed: the check saw nothing"


# --- configuration and wiring ----------------------------------------------------------------


def test_config_defaults_and_client_options() -> None:
    config = KafkaSettings(bootstrap_servers="b:9092", topic="rows", group_id="g")
    assert config.dlq_topic == "rows.dlq"
    options = config.consumer_options()
    assert options["enable_auto_commit"] is False
    assert options["group_id"] == "g"
    assert options["security_protocol"] == "PLAINTEXT"
    assert "sasl_mechanism" not in options
    assert "ssl_context" not in options
    producer = config.producer_options()
    assert producer["acks"] == "all"
    assert producer["enable_idempotence"] is True


def test_fetches_are_bounded_by_the_budget_unless_set() -> None:
    """aiokafka holds a whole fetch response, parsed, before the source takes a record: a
    fetch brings at most a 32nd of the budget (not less than 64 KiB) unless the
    configuration names its own ``fetch_max_bytes``."""
    base = {"bootstrap_servers": "b:9092", "topic": "t", "group_id": "g"}
    config = KafkaSettings.model_validate(base)
    assert config.fetch_max_bytes == 16 * MiB
    assert config.within_budget(16 * MiB).consumer_options()["fetch_max_bytes"] == 512 * 1024
    assert config.within_budget(256 * MiB).fetch_max_bytes == 8 * MiB
    assert config.within_budget(1024 * MiB) is config  # under the cap already
    assert config.within_budget(MiB).fetch_max_bytes == 64 * 1024
    assert config.within_budget(16 * MiB).max_partition_fetch_bytes == MiB  # not touched
    chosen = KafkaSettings.model_validate({**base, "fetch_max_bytes": 32 * MiB})
    assert chosen.within_budget(16 * MiB) is chosen
    source = make_source(config, budget_bytes=16 * MiB)
    assert isinstance(source, KafkaSource)
    assert source.config.fetch_max_bytes == 512 * 1024


def test_sasl_and_tls_are_passed_through() -> None:
    config = KafkaSettings(
        bootstrap_servers="b:9093",
        topic="rows",
        group_id="g",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_plain_username="user",
        sasl_plain_password=SecretStr("secret"),
    )
    assert "secret" not in repr(config)
    options = config.client_options()
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert options["sasl_plain_username"] == "user"
    assert options["sasl_plain_password"] == "secret"
    assert options["ssl_context"] is not None
    bad_ca = KafkaSettings(
        bootstrap_servers="b:9093",
        topic="rows",
        group_id="g",
        security_protocol="SSL",
        ssl_cafile=Path("/nonexistent/ca.pem"),
    )
    with pytest.raises(KafkaConfigError, match=r"ssl_cafile=/nonexistent/ca\.pem"):
        bad_ca.client_options()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"topic": ""}, r"topic\n  String should have at least 1 character"),
        ({"dead_letter_topic": "rows"}, "must differ"),
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        ({"sasl_mechanism": "PLAIN"}, "needs security_protocol"),
        ({"ssl_cafile": "ca.pem"}, "ssl_cafile need security_protocol"),
        ({"revoke_grace_s": 25.0}, r"must exceed revoke_grace_s \+ commit_timeout_s"),
        ({"heartbeat_interval_ms": 10_000}, "below session_timeout_ms"),
        (
            {"max_delivery_attempts": 0},
            r"max_delivery_attempts\n  Input should be greater than or equal to 1",
        ),
        ({"commit_interval_s": 0}, r"commit_interval_s\n  Input should be greater than 0"),
        (
            {"max_buffered_rows": 0},
            r"max_buffered_rows\n  Input should be greater than or equal to 1",
        ),
    ],
)
def test_bad_config_is_named(extra: dict[str, Any], message: str) -> None:
    settings: dict[str, Any] = {"bootstrap_servers": "b:9092", "topic": "rows", "group_id": "g"}
    with pytest.raises(ValidationError, match=message):
        KafkaSettings(**{**settings, **extra})


def test_settings_wire_into_a_kafka_source() -> None:
    settings = KafkaSettings.model_validate(
        {
            "bootstrap_servers": "b:9093",
            "topic": "rows",
            "group_id": "g",
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
            "max_delivery_attempts": 3,
            "commit_interval_s": 2.5,
            "max_buffered_rows": 4096,
        }
    )
    assert "'p'" not in repr(settings)
    source = make_source(settings)
    assert isinstance(source, KafkaSource)
    assert source.config is settings  # the one settings type, used as it is
    assert source.config.client_options()["sasl_plain_password"] == "p"
    assert source.config.sasl_mechanism == "SCRAM-SHA-256"
    assert source.config.max_delivery_attempts == 3
    assert source.config.commit_interval_s == 2.5
    assert source.config.max_buffered_rows == 4096
    assert KafkaSettings(bootstrap_servers="b", topic="t", group_id="g").max_buffered_rows is None
    assert source.config.dlq_topic == "rows.dlq"


@pytest.mark.parametrize(
    "extra",
    [
        {"security_protocol": "SASL_SSL"},
        {"sasl_mechanism": "PLAIN"},
        {"ssl_cafile": "ca.pem"},
        {"revoke_grace_s": 25},
        {"dead_letter_topic": "rows"},
        {"topic": ""},
    ],
)
def test_bad_settings_are_refused(extra: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        KafkaSettings.model_validate(
            {"bootstrap_servers": "b:9092", "topic": "rows", "group_id": "g", **extra}
        )


# --- lag arithmetic --------------------------------------------------------------------------


def test_partition_lag() -> None:
    end = {0: 100, 1: 50, 2: 7}
    assert partition_lag(end, {0: 90, 1: 50, 2: None}) == {0: 10, 1: 0, 2: 0}
    assert partition_lag(end, {0: 90, 1: 50, 2: None}, {2: 3}) == {0: 10, 1: 0, 2: 4}
    assert partition_lag({0: 5}, {0: 9}) == {0: 0}  # never negative


def test_desired_replicas_follows_the_rule_with_its_caps() -> None:
    # 60,000 rows, 30 s target, 1,000 rows/s per replica -> 2 replicas.
    assert desired_replicas(60_000, 30, 1000, max_replicas=6) == 2
    assert desired_replicas(60_001, 30, 1000, max_replicas=6) == 3
    assert desired_replicas(10**9, 30, 1000, max_replicas=6) == 6  # capped by partitions
    assert desired_replicas(0, 30, 1000, max_replicas=6) == 1  # floor
    with pytest.raises(ValueError, match="must be > 0"):
        desired_replicas(1, 30, 0, max_replicas=6)


def test_throughput_meter_counts_busy_windows_only() -> None:
    meter = ThroughputMeter(alpha=0.5)
    assert meter.sample(0.0, busy=True) is None
    meter.done(1000)
    assert meter.sample(2.0, busy=True) == 500.0
    meter.done(10)
    assert meter.sample(4.0, busy=False) == 500.0  # idle window: unchanged
    meter.done(3000)
    assert meter.sample(6.0, busy=True) == 500.0  # started idle: unchanged
    meter.done(3000)
    assert meter.sample(8.0, busy=True) == 0.5 * 1500 + 0.5 * 500


# --- start-up: joining the group, brokers that do not answer --------------------------------------


def test_joining_the_group_may_take_a_rebalance_longer_than_the_check() -> None:
    config = KafkaSettings(
        bootstrap_servers="b:9092",
        topic="t",
        group_id="g",
        check_timeout_s=5,
        session_timeout_ms=45_000,
        rebalance_timeout_ms=60_000,
    )
    assert config.join_timeout_s == 5 + 45 + 60


def with_attributes(factory: Callable[..., Any], **attributes: Any) -> Callable[..., Any]:
    """``factory``, whose clients get ``attributes`` set."""

    def make(**options: Any) -> Any:
        made = factory(**options)
        for name, value in attributes.items():
            setattr(made, name, value)
        return made

    return make


async def test_a_slow_group_join_is_not_taken_for_brokers_that_do_not_answer() -> None:
    """Starting the consumer waits for the group's assignment: a member restarted while the
    group waits on one that died waits past ``check_timeout_s`` (here 10 ms)."""
    rig = make_rig(check_timeout_s=0.01)
    joined = asyncio.Event()

    async def slow_start() -> None:
        await asyncio.sleep(0.05)  # the rebalance, slower than the check's 10 ms
        joined.set()

    clients = rig.source._clients
    clients._consumer_factory = with_attributes(clients._consumer_factory, start=slow_start)
    await rig.source._ensure_consumer()
    assert joined.is_set()
    await rig.source.close()


@dataclass
class FlakyCluster:
    """``producer.client``: metadata fails ``failures`` times (brokers that do not answer)."""

    failures: int
    calls: int = 0

    async def fetch_all_metadata(self) -> FlakyCluster:
        self.calls += 1
        if self.calls <= self.failures:
            from aiokafka.errors import KafkaConnectionError

            raise KafkaConnectionError("connection refused")
        return self

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0, 1}

    def topics(self) -> set[str]:
        return {TOPIC, f"{TOPIC}.dlq"}


async def test_a_check_that_found_no_broker_can_be_made_again() -> None:
    """Start-up waits for the brokers by calling ``check`` again (``open_source``): a check
    that raised ``KafkaUnreachable`` leaves the source usable."""
    rig = make_rig()
    cluster = FlakyCluster(failures=1)
    clients = rig.source._clients
    clients._producer_factory = with_attributes(clients._producer_factory, client=cluster)
    with pytest.raises(KafkaUnreachable, match="cannot reach Kafka at b:9092"):
        await rig.source.check()
    assert not rig.source._closed
    await rig.source.check()
    assert cluster.calls == 2
    assert rig.source._clients.consumer_started
    await rig.source.close()
