"""A member whose share consumer fails while running is remade after a backoff (its records
come back from the broker once their locks run out); one that cannot be made ends the source's
deliveries with the reason. The source counts each member's records, redeliveries and
acknowledgements in its registry."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from rowbatch.consumer.sources.base import SourceUnreachable
from rowbatch.consumer.sources.kafka_share.member import Ack, Member, MemberEvents, ShareRecord
from rowbatch.consumer.sources.kafka_share.source import KafkaShareSource
from rowbatch.timing import Backoff
from tests.unit.consumer.sources.kafka_share.test_source import (
    FakeShareConsumer,
    Message,
    settings,
    take,
)

NO_WAIT = Backoff(initial_s=1e-6, max_s=1e-6, jitter=0.0)


class FailingConsumer(FakeShareConsumer):
    """Hands out its batches, then its poll raises (a client gone bad)."""

    def poll(self, timeout: float) -> Iterable[Message]:
        if not self.batches:
            raise RuntimeError("client gone bad")
        return super().poll(timeout)


def test_a_member_whose_client_fails_is_made_again() -> None:
    bad = FailingConsumer([[Message(0)]])
    good = FakeShareConsumer([[Message(1)]])
    clients = iter([bad, good])
    taken: list[list[int]] = []
    restarts: list[BaseException] = []
    got_second = threading.Event()

    def handoff(member: Member, records: Any) -> None:
        taken.append([r.offset for r in records])
        for record in records:
            member.settle(record.partition, record.offset, Ack.ACCEPT)
        if len(taken) == 2:
            got_second.set()

    member = Member(
        0,
        lambda: next(clients),
        "in",
        handoff,
        {a: a for a in Ack},
        events=MemberEvents(restarted=restarts.append),
        backoff=NO_WAIT,
    )
    member.start()
    try:
        assert got_second.wait(5.0), "the member was not made again"
    finally:
        member.stop()
        assert member.join(5.0)
    assert taken == [[0], [1]]
    assert member.restarts == 1 and member.failure is None
    assert [str(e) for e in restarts] == ["client gone bad"]
    assert bad.closed and good.closed
    assert bad.acks == [(0, Ack.ACCEPT)] and good.acks == [(1, Ack.ACCEPT)]


def test_a_failure_in_the_middle_of_a_batch_drops_what_the_client_held() -> None:
    """The acknowledgement of a record the failed client held is not sent to the new one
    (the broker delivers that record again once its lock runs out)."""
    bad = FakeShareConsumer([[Message(0)]])
    good = FakeShareConsumer([[Message(1)]])

    def commit_fails(timeout: float) -> Any:
        raise RuntimeError("commit refused")

    bad.commit_sync = commit_fails  # type: ignore[method-assign]
    clients = iter([bad, good])
    second = threading.Event()
    members: list[Member] = []

    def handoff(member: Member, records: Any) -> None:
        for record in records:
            member.settle(record.partition, record.offset, Ack.ACCEPT)
        if records[0].offset == 1:
            second.set()

    member = Member(0, lambda: next(clients), "in", handoff, {a: a for a in Ack}, backoff=NO_WAIT)
    members.append(member)
    member.start()
    try:
        assert second.wait(5.0)
    finally:
        member.stop()
        assert member.join(5.0)
    assert member.restarts == 1
    assert good.acks == [(1, Ack.ACCEPT)]


async def test_a_client_that_cannot_be_made_ends_the_deliveries_with_the_reason() -> None:
    def refuse() -> Any:
        raise ValueError("No such configuration property: 'bogus'")

    source = KafkaShareSource(
        settings(), consumer_version="test", client=refuse, ack_types={a: a for a in Ack}
    )
    it = source.deliveries()
    with pytest.raises(SourceUnreachable, match="share consumer 0 failed: No such configuration"):
        await asyncio.wait_for(it.__anext__(), 5)
    await source.close()


async def test_the_source_counts_records_redeliveries_and_acknowledgements() -> None:
    registry = CollectorRegistry()
    fake = FakeShareConsumer([[Message(0), Message(1, count=2), Message(2, count=3)]])
    source = KafkaShareSource(
        settings(),
        consumer_version="test",
        registry=registry,
        client=lambda: fake,
        ack_types={a: a for a in Ack},
    )
    a, b, c = await take(source, 3)
    await source.ack(a)
    await source.nack(b)
    await source.ack(c)
    await source.close()

    def value(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, {"topic": "in", **labels}) or 0.0

    assert value("rowbatch_kafka_share_records_total", member="0") == 3
    assert value("rowbatch_kafka_share_redelivered_records_total") == 2
    assert value("rowbatch_kafka_share_acknowledgements_total", type="accept") == 2
    assert value("rowbatch_kafka_share_acknowledgements_total", type="release") == 1
    assert value("rowbatch_kafka_share_acknowledgements_total", type="reject") == 0


def test_refused_commits_are_told() -> None:
    fake = FakeShareConsumer([[Message(0)]])
    fake.commit_sync = lambda timeout: {("in", 0): "INVALID_RECORD_STATE"}  # type: ignore[method-assign]
    refused: list[int] = []
    done = threading.Event()

    def handoff(member: Member, records: Sequence[ShareRecord]) -> None:
        member.settle(0, 0, Ack.ACCEPT)

    def late(n: int) -> None:
        refused.append(n)
        done.set()

    member = Member(
        0, lambda: fake, "in", handoff, {a: a for a in Ack}, events=MemberEvents(late_acks=late)
    )
    member.start()
    try:
        assert done.wait(5.0)
    finally:
        member.stop()
        assert member.join(5.0)
    assert refused == [1] and member.restarts == 0


async def test_the_source_is_at_capacity_while_every_member_holds_records() -> None:
    fake = FakeShareConsumer([[Message(0)]])
    source = KafkaShareSource(
        settings(), consumer_version="test", client=lambda: fake, ack_types={a: a for a in Ack}
    )
    assert not source.at_capacity()  # no member yet
    [d] = await take(source, 1)
    assert source.at_capacity()  # its one member holds the record
    source.pause()
    assert not source.at_capacity()  # an outage measures no capacity
    source.resume()
    await source.ack(d)
    for _ in range(500):
        if not source.at_capacity():
            break
        await asyncio.sleep(0.01)
    assert not source.at_capacity()
    await source.close()
