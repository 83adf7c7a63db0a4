"""KafkaSource on the real broker: ordered commits with out-of-order settles, nack as local
re-delivery, dead letters with reasons, pause without losing group membership, rebalances that
never commit past an unwritten record, start-up checks, and the lag gauges."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiokafka import TopicPartition

from harness.kafka import KafkaEndpoint
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka.errors import KafkaConfigError
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.wire.dead_letter import ReasonClass
from tests.integration.kafka_helpers import KafkaTopics, group_offsets, produce, read_all

WAIT_S = 60.0


def source_config(t: KafkaTopics, **extra: Any) -> KafkaSettings:
    settings: dict[str, Any] = {
        "bootstrap_servers": t.bootstrap,
        "topic": t.topic,
        "group_id": t.group,
        "commit_interval_s": 0.2,
        "revoke_grace_s": 1.0,
        "redelivery_backoff_s": 0.2,
        "lag_interval_s": 0.5,
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 500,
        "check_timeout_s": 20.0,
        **extra,
    }
    return KafkaSettings(**settings)


@pytest.fixture
async def topics(kafka: KafkaEndpoint) -> KafkaTopics:
    return await KafkaTopics.create(kafka, partitions=1)


@pytest.fixture
async def topics6(kafka: KafkaEndpoint) -> KafkaTopics:
    return await KafkaTopics.create(kafka, partitions=6)


@pytest.fixture
async def source(topics: KafkaTopics) -> AsyncIterator[KafkaSource]:
    s = KafkaSource(source_config(topics, max_delivery_attempts=2))
    try:
        await s.check()
        yield s
    finally:
        await s.close()


def records(n: int, tag: str = "r") -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    return [
        (f"k{i}".encode(), f"{tag} {i} ✓".encode(), [("seq", str(i).encode()), ("x", b"")])
        for i in range(n)
    ]


async def take(source: KafkaSource, n: int, timeout_s: float = WAIT_S) -> list[Delivery]:
    it = source.deliveries()
    out: list[Delivery] = []
    async with asyncio.timeout(timeout_s):
        while len(out) < n:
            out.append(await anext(it))
    return out


async def nothing_within(source: KafkaSource, seconds: float) -> None:
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(anext(source.deliveries()), seconds)


async def committed_becomes(
    t: KafkaTopics, want: dict[int, int | None], timeout_s: float = 20
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        got, _ = await group_offsets(t.endpoint, t.topic, t.group, t.partitions)
        if got == want:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"committed offsets {got}, expected {want}")
        await asyncio.sleep(0.2)


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110 - polling state other tasks change
            await asyncio.sleep(0.1)


def offset_of(d: Delivery) -> int:
    return int(d.message_id.rsplit("/", 1)[1])


async def test_commits_stop_below_the_first_unsettled_record(
    topics: KafkaTopics, source: KafkaSource
) -> None:
    sent = await produce(topics.endpoint, topics.topic, records(30))
    got = await take(source, 30)
    assert [offset_of(d) for d in got] == list(range(30))
    first = got[0]
    assert first.message_id == f"{topics.topic}/0/0"
    assert first.source == f"{topics.topic}/0"
    assert first.payload == "r 0 ✓".encode()
    assert first.attributes == {"seq": "0", "x": ""}
    assert first.delivery_attempt == 1
    assert first.ordering_key == "k0"
    assert abs(first.publish_time - sent[0].timestamp / 1000) < 1e-3
    assert abs(first.publish_time - time.time()) < 60

    held = {4, 17}
    rest = [d for d in got if offset_of(d) not in held]
    random.Random(7).shuffle(rest)
    for d in rest:
        await source.ack(d)
    await committed_becomes(topics, {0: 4})
    await asyncio.sleep(1.0)  # several commit intervals: still waiting at 4
    assert (await group_offsets(topics.endpoint, topics.topic, topics.group, 1))[0] == {0: 4}
    assert source.committable() == {TopicPartition(topics.topic, 0): 4}

    await source.ack(got[4])
    await committed_becomes(topics, {0: 17})
    with pytest.raises(ValueError, match="not held"):
        await source.ack(got[4])

    reason = DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "column 'x' is int64, want string")
    await source.dead_letter(got[17], reason)
    await committed_becomes(topics, {0: 30})
    [dead] = await read_all(topics.endpoint, topics.dlq)
    assert dead.key == b"k17"
    assert dead.value == "r 17 ✓".encode()
    headers = dict(dead.headers)
    assert headers["seq"] == b"17"
    assert headers["x"] == b""
    assert headers["rowbatch-dlq-reason"] == b"schema-mismatch"
    assert headers["rowbatch-dlq-code"] == b"column_type_mismatch"
    assert headers["rowbatch-dlq-message"] == b"column 'x' is int64, want string"
    assert headers["rowbatch-dlq-source"] == f"{topics.topic}/0".encode()
    assert headers["rowbatch-dlq-message-id"] == f"{topics.topic}/0/17".encode()
    assert headers["rowbatch-dlq-topic"] == topics.topic.encode()
    assert headers["rowbatch-dlq-partition"] == b"0"
    assert headers["rowbatch-dlq-offset"] == b"17"
    assert headers["rowbatch-dlq-group"] == topics.group.encode()
    assert headers["rowbatch-dlq-delivery-attempt"] == b"1"
    assert headers["rowbatch-dlq-consumer-version"]
    assert headers["rowbatch-dlq-time"].endswith(b"Z")


async def test_nack_redelivers_locally_with_the_attempt_counted_and_holds_the_commit(
    topics: KafkaTopics, source: KafkaSource
) -> None:
    await produce(topics.endpoint, topics.topic, records(5))
    got = await take(source, 5)
    started = time.monotonic()
    await source.nack(got[1])
    for d in (got[0], *got[2:]):
        await source.ack(d)
    [again] = await take(source, 1)
    assert time.monotonic() - started >= 0.15  # redelivery_backoff_s
    assert again.message_id == got[1].message_id
    assert again.payload == got[1].payload
    assert again.delivery_attempt == 2
    assert not source.exceeded_attempts(again)
    await committed_becomes(topics, {0: 1})

    await source.nack(again)
    [third] = await take(source, 1)
    assert third.delivery_attempt == 3
    assert source.exceeded_attempts(third)  # max_delivery_attempts=2: the intake dead-letters
    await source.dead_letter(third, DeadLetterReason(ReasonClass.TOO_MANY_ATTEMPTS, "3 > 2"))
    await committed_becomes(topics, {0: 5})
    [dead] = await read_all(topics.endpoint, topics.dlq)
    assert dict(dead.headers)["rowbatch-dlq-delivery-attempt"] == b"3"


async def test_pause_longer_than_the_session_and_poll_timeouts_keeps_membership(
    topics6: KafkaTopics,
) -> None:
    t = topics6
    source = KafkaSource(source_config(t, max_poll_interval_ms=5000))
    try:
        await source.check()
        await produce(t.endpoint, t.topic, records(12, "before"))
        for d in await take(source, 12):
            await source.ack(d)
        assert source.assignments == 1
        assert source.assignment() == set(t.tps())

        source.pause()
        await produce(t.endpoint, t.topic, records(12, "during"))
        # 9 s paused: more than session_timeout_ms (6 s) and max_poll_interval_ms (5 s).
        await nothing_within(source, 9.0)
        assert source.assignments == 1, "the group rebalanced while paused"
        assert source.assignment() == set(t.tps())
        assert source.buffered == 0, "records were fetched while paused"

        source.resume()
        during = await take(source, 12)
        assert {d.payload.split()[0] for d in during} == {b"during"}
        for d in during:
            await source.ack(d)
        _, end = await group_offsets(t.endpoint, t.topic, t.group, t.partitions)
        assert sum(end.values()) == 24
        await committed_becomes(t, dict(end))
        assert source.assignments == 1
    finally:
        await source.close()


async def drain(source: KafkaSource, into: list[Delivery], ack: bool, stop: asyncio.Event) -> None:
    """Take deliveries into ``into`` (acking them if ``ack``) until ``stop``."""
    it = source.deliveries()
    while not stop.is_set():
        try:
            d = await asyncio.wait_for(anext(it), 0.2)
        except TimeoutError:
            continue
        into.append(d)
        if ack:
            await source.ack(d)


@pytest.mark.timeout(180)
async def test_a_rebalance_commits_what_is_done_and_never_past_an_unwritten_record(
    topics6: KafkaTopics,
) -> None:
    t = topics6
    per_partition = 10
    for p in range(t.partitions):
        await produce(t.endpoint, t.topic, records(per_partition, f"p{p}"), partition=p)
    total = per_partition * t.partitions
    a = KafkaSource(source_config(t))
    b = KafkaSource(source_config(t))
    stop = asyncio.Event()
    try:
        await a.check()
        first = await take(a, total)
        last = {d for d in first if offset_of(d) == per_partition - 1}
        assert len(last) == t.partitions
        for d in first:
            if d not in last:
                await a.ack(d)
        await committed_becomes(t, dict.fromkeys(range(t.partitions), per_partition - 1))

        # B joins: A's partitions are all revoked (eager rebalance); A waits revoke_grace_s
        # for the 6 unwritten records, commits below them, and forgets them.
        seen_a: list[Delivery] = []
        seen_b: list[Delivery] = []
        await b.check()
        tasks = [
            asyncio.create_task(drain(a, seen_a, True, stop)),
            asyncio.create_task(drain(b, seen_b, True, stop)),
        ]
        await until(lambda: len(seen_a) + len(seen_b) >= t.partitions)
        await asyncio.sleep(1.0)
        assert a.assignments == 2
        assert b.assignments == 1
        assert a.assignment() | b.assignment() == set(t.tps())
        assert not a.assignment() & b.assignment()
        again = sorted(d.message_id for d in seen_a + seen_b)
        assert again == sorted(d.message_id for d in last), "only the unwritten ones come back"
        # A finishing the old deliveries late changes nothing: they were revoked.
        for d in last:
            await a.ack(d)
        await committed_becomes(t, dict.fromkeys(range(t.partitions), per_partition))

        # More records flow to both members and are committed to the end.
        for p in range(t.partitions):
            await produce(t.endpoint, t.topic, records(5, f"more{p}"), partition=p)
        await committed_becomes(t, dict.fromkeys(range(t.partitions), per_partition + 5))
        assert seen_a and seen_b
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        await b.close()
        await a.close()


async def test_records_with_non_utf8_headers_are_dead_lettered_by_the_source(
    topics: KafkaTopics, source: KafkaSource
) -> None:
    await produce(
        topics.endpoint,
        topics.topic,
        [
            (b"bad", b"payload", [("rowbatch-chunk-id", b"\xff\xfe")]),
            (b"good", b"payload", [("seq", b"1")]),
        ],
    )
    [good] = await take(source, 1)
    assert good.message_id.endswith("/1")
    await source.ack(good)
    await committed_becomes(topics, {0: 2})
    assert source.dead_lettered_here == 1
    [dead] = await read_all(topics.endpoint, topics.dlq)
    headers = dict(dead.headers)
    assert dead.key == b"bad"
    assert headers["rowbatch-chunk-id"] == b"\xff\xfe"
    assert headers["rowbatch-dlq-reason"] == b"undecodable"
    assert headers["rowbatch-dlq-code"] == b"invalid_header"  # the WireError's reason
    assert b"rowbatch-chunk-id" in headers["rowbatch-dlq-message"]


async def test_lag_gauges_follow_the_committed_offsets(
    topics: KafkaTopics, source: KafkaSource
) -> None:
    await produce(topics.endpoint, topics.topic, records(10))
    got = await take(source, 10)
    assert await source.refresh_lag() == {0: 10}
    registry = source.registry
    assert (
        registry.get_sample_value("rowbatch_kafka_lag", {"topic": topics.topic, "partition": "0"})
        == 10
    )
    for d in got:
        await source.ack(d)
    await committed_becomes(topics, {0: 10})
    assert await source.refresh_lag() == {0: 0}
    assert registry.get_sample_value("rowbatch_kafka_lag_total", {"topic": topics.topic}) == 0


async def test_check_names_missing_topics(kafka: KafkaEndpoint) -> None:
    t = KafkaTopics(kafka, "no-such-topic-x1", "no-such-topic-x1.dlq", "g", 1)
    source = KafkaSource(source_config(t))
    try:
        with pytest.raises(
            KafkaConfigError, match=r"'no-such-topic-x1' and 'no-such-topic-x1\.dlq'"
        ):
            await source.check()
    finally:
        await source.close()
    real = await KafkaTopics.create(kafka, partitions=1)
    source = KafkaSource(source_config(real, dead_letter_topic="missing-dlq-x2"))
    try:
        with pytest.raises(KafkaConfigError, match=r"'missing-dlq-x2' does not exist"):
            await source.check()
    finally:
        await source.close()
