"""Share groups (KIP-932) on a real Kafka 4.4.0 broker through confluent-kafka's ShareConsumer
(Preview), explicit acknowledgement: two members of one group share a one-partition topic and
accept each record once between them; a RELEASEd record comes back with its delivery count
up by one; a batch left unacknowledged past its lock (1 s, the least the broker allows) comes
back to another member, and the late acknowledgement is refused (INVALID_RECORD_STATE)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from confluent_kafka import (
    AcknowledgeType,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    ShareConsumer,
    TopicPartition,
)

from harness.kafka import KafkaEndpoint, create_topic
from harness.kafka.share import set_share_group_config, share_group_lag
from tests.integration import share_fixtures

share_kafka = share_fixtures.share_kafka  # the fixture, where pytest finds it

_WAIT_S = 60.0
_LOCK_MS = 1000  # group.share.min.record.lock.duration.ms on the share broker


def _unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def _topic_and_group(endpoint: KafkaEndpoint, **group_configs: str) -> tuple[str, str]:
    """A fresh one-partition topic, and a fresh share group that starts at its beginning."""
    topic, group = _unique("share"), _unique("share-group")
    asyncio.run(create_topic(endpoint, topic, partitions=1))
    set_share_group_config(
        endpoint.bootstrap_servers, group, share_auto_offset_reset="earliest", **group_configs
    )
    return topic, group


def _produce(endpoint: KafkaEndpoint, topic: str, count: int, per_batch: int = 10_000) -> None:
    """``count`` records, at most ``per_batch`` to a record batch: the broker hands a share
    group's members whole record batches (each ShareFetch acquires batches, not records)."""
    producer = Producer(
        {
            "bootstrap.servers": endpoint.bootstrap_servers,
            "acks": "all",
            "batch.num.messages": per_batch,
        }
    )
    for i in range(count):
        producer.produce(topic, key=str(i).encode(), value=f"record {i}".encode())
    assert producer.flush(_WAIT_S) == 0, "records left unsent"


@contextmanager
def _member(
    endpoint: KafkaEndpoint, group: str, topic: str, name: str, **config: Any
) -> Iterator[tuple[ShareConsumer, list[KafkaException]]]:
    """A subscribed ShareConsumer in explicit mode, and the errors its acknowledgement
    callback reported; closed on exit (close sends pending acknowledgements)."""
    failures: list[KafkaException] = []

    def on_commit(offsets: dict[TopicPartition, set[int]], exc: KafkaException | None) -> None:
        if exc is not None:
            failures.append(exc)

    consumer = ShareConsumer(
        {
            "bootstrap.servers": endpoint.bootstrap_servers,
            "group.id": group,
            "client.id": name,
            "share.acknowledgement.mode": "explicit",
            **config,
        }
    )
    try:
        consumer.set_acknowledgement_commit_callback(on_commit)
        consumer.subscribe([topic])
        yield consumer, failures
    finally:
        consumer.close()


def _poll_until(
    consumer: ShareConsumer, done: Callable[[list[Message]], bool], timeout_s: float = _WAIT_S
) -> list[Message]:
    """Poll until a batch satisfies ``done``; return that batch."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        batch = list(consumer.poll(0.2))
        for msg in batch:
            assert msg.error() is None, msg.error()
        if done(batch):
            return batch
    raise AssertionError(f"no such batch in {timeout_s:.0f} s")


def _offset(msg: Message) -> int:
    offset = msg.offset()
    assert offset is not None
    return offset


def _commit_errors(consumer: ShareConsumer) -> dict[tuple[str, int], KafkaException]:
    """commit_sync, keeping the partitions whose acknowledgements failed."""
    results = consumer.commit_sync(_WAIT_S)
    return {(tp.topic, tp.partition): exc for tp, exc in results.items() if exc is not None}


def _wait_lag_zero(endpoint: KafkaEndpoint, group: str, topic: str) -> None:
    """The broker's own view, once it has written the group's state: nothing left to do."""
    deadline = time.monotonic() + _WAIT_S
    while True:
        lag = share_group_lag(endpoint.bootstrap_servers, group, {topic: [0]})
        if lag.get((topic, 0)) is not None and lag[(topic, 0)].lag == 0:
            return
        assert time.monotonic() < deadline, f"lag never 0: {lag}"
        time.sleep(0.2)


def test_two_members_accept_every_record_once(share_kafka: KafkaEndpoint) -> None:
    records = 1000
    topic, group = _topic_and_group(share_kafka)
    _produce(share_kafka, topic, records, per_batch=20)

    accepted: dict[str, list[int]] = {"member-a": [], "member-b": []}
    batches: dict[str, list[int]] = {name: [] for name in accepted}  # records per poll
    lock = threading.Lock()
    all_accepted = threading.Event()
    started = time.monotonic()

    def run(name: str) -> tuple[list[KafkaException], dict[tuple[str, int], KafkaException]]:
        with _member(share_kafka, group, topic, name, **{"max.poll.records": 50}) as (
            consumer,
            failures,
        ):
            deadline = time.monotonic() + _WAIT_S
            while not all_accepted.is_set() and time.monotonic() < deadline:
                batch = consumer.poll(0.2)
                for msg in batch:
                    assert msg.error() is None, msg.error()
                    assert msg.delivery_count() == 1, (msg.offset(), msg.delivery_count())
                    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
                    with lock:
                        accepted[name].append(_offset(msg))
                        if sum(map(len, accepted.values())) >= records:
                            all_accepted.set()
                if len(batch):
                    with lock:
                        batches[name].append(len(batch))
                    time.sleep(0.02)  # "work" on the batch, so the other member fetches too
            return failures, _commit_errors(consumer)

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="share-member") as pool:
        futures = [pool.submit(run, name) for name in accepted]
        outcomes = [future.result() for future in futures]
    elapsed = time.monotonic() - started

    for failures, commit_errors in outcomes:
        assert failures == [] and commit_errors == {}, (failures, commit_errors)
    every = [offset for offsets in accepted.values() for offset in offsets]
    assert sorted(every) == list(range(records)), "a record accepted twice, or never"
    _wait_lag_zero(share_kafka, group, topic)
    shares = {name: len(offsets) for name, offsets in accepted.items()}
    print(
        f"\n{records} records accepted in {elapsed:.2f} s (both members' start to the last "
        f"ack); each member's share: {shares}; records per poll: {batches}"
    )


def test_released_record_is_redelivered(share_kafka: KafkaEndpoint) -> None:
    topic, group = _topic_and_group(share_kafka)
    _produce(share_kafka, topic, 5)
    with _member(share_kafka, group, topic, "releaser") as (consumer, failures):
        first = _poll_until(consumer, lambda batch: len(batch) > 0)
        assert [m.delivery_count() for m in first] == [1] * len(first)
        released = first[0].offset()
        for msg in first:
            ack = AcknowledgeType.RELEASE if msg.offset() == released else AcknowledgeType.ACCEPT
            consumer.acknowledge(msg, ack)
        started = time.monotonic()
        again = _poll_until(consumer, lambda batch: any(m.offset() == released for m in batch))
        redelivered = next(m for m in again if m.offset() == released)
        assert redelivered.delivery_count() == 2
        for msg in again:
            consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
        assert _commit_errors(consumer) == {}
        print(
            f"\noffset {released} released, back after {time.monotonic() - started:.2f} s "
            f"with delivery_count {redelivered.delivery_count()}"
        )
    assert failures == []
    _wait_lag_zero(share_kafka, group, topic)


def test_batch_past_its_lock_is_redelivered_and_late_ack_refused(
    share_kafka: KafkaEndpoint,
) -> None:
    records = 10
    topic, group = _topic_and_group(share_kafka, **{"share.record.lock.duration.ms": str(_LOCK_MS)})
    _produce(share_kafka, topic, records)
    with (
        _member(share_kafka, group, topic, "holder") as (holder, holder_failures),
        _member(share_kafka, group, topic, "taker") as (taker, taker_failures),
    ):
        held = _poll_until(holder, lambda batch: len(batch) > 0)
        acquired = time.monotonic()
        held_offsets = sorted(_offset(m) for m in held)
        assert [m.delivery_count() for m in held] == [1] * len(held)
        # The holder leaves its batch unacknowledged; the lock expires; the other member gets
        # those records again, each on its second delivery.
        again: dict[int, Message] = {}
        while not set(held_offsets) <= again.keys():
            for msg in _poll_until(taker, lambda batch: len(batch) > 0):
                again[_offset(msg)] = msg
                taker.acknowledge(msg, AcknowledgeType.ACCEPT)
        waited = time.monotonic() - acquired
        assert [again[o].delivery_count() for o in held_offsets] == [2] * len(held)
        assert waited >= _LOCK_MS / 1000 * 0.9
        # Too late: the holder's acknowledgement of records it no longer holds is refused.
        for msg in held:
            holder.acknowledge(msg, AcknowledgeType.ACCEPT)
        late = _commit_errors(holder)
        assert list(late) == [(topic, 0)], late
        error = late[(topic, 0)].args[0]
        assert error.code() == KafkaError.INVALID_RECORD_STATE, error
        while len(again) < records:  # any the holder did not get in its batch
            for msg in _poll_until(taker, lambda batch: len(batch) > 0):
                again[_offset(msg)] = msg
                taker.acknowledge(msg, AcknowledgeType.ACCEPT)
        assert _commit_errors(taker) == {}
        print(
            f"\n{len(held)} records back to the other member {waited:.2f} s after the first "
            f"acquired them (lock {_LOCK_MS} ms), delivery_count 2; the late ack: {error}"
        )
    assert [e.args[0].code() for e in holder_failures] == [KafkaError.INVALID_RECORD_STATE]
    assert taker_failures == []
    _wait_lag_zero(share_kafka, group, topic)
