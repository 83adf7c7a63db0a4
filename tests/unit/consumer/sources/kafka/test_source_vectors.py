"""KafkaSource's vectors: every record ready is yielded in one step (due retries first, then
the read-ahead in fetch order); a record whose headers cannot be read is kept out of the
vector and dead-lettered at the next step; ``ack_many`` settles a vector at once."""

from __future__ import annotations

import asyncio

from rowbatch.consumer.sources.base import VECTOR_MAX
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.kafka.source import KafkaSource
from tests.unit.consumer.sources.kafka.test_source import (
    TOPIC,
    TP0,
    TP1,
    Record,
    make_rig,
    offset,
    partition,
    start,
    until,
)


async def next_vector(source: KafkaSource) -> list[Delivery]:
    async with asyncio.timeout(5):
        return list(await anext(source.vectors()))


async def test_a_vector_holds_every_record_ready_in_fetch_order() -> None:
    rig = make_rig()
    await start(rig, {TP0, TP1})
    rig.consumer.feed(TP0, range(5))
    rig.consumer.feed(TP1, range(3))
    await until(lambda: rig.source.buffered == 8)
    vector = await next_vector(rig.source)
    got = [(partition(d).partition, offset(d)) for d in vector]
    # Every record, each partition's in offset order (which partition a fetch returns first
    # is the fake's set order, which varies with the process's hash seed).
    assert sorted(got) == [*((0, o) for o in range(5)), *((1, o) for o in range(3))]
    assert [o for p, o in got if p == 0] == list(range(5))
    assert [o for p, o in got if p == 1] == list(range(3))
    assert rig.source.buffered == 0
    assert rig.source.outstanding == 8
    await rig.source.ack_many(vector)
    assert rig.source.outstanding == 0
    await rig.source._commit({TP0, TP1}, "test")
    assert rig.consumer.commits[-1] == {TP0: 5, TP1: 3}
    await rig.source.close()


async def test_a_vector_is_at_most_vector_max_and_retries_come_first() -> None:
    rig = make_rig(max_poll_records=10 * VECTOR_MAX)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(VECTOR_MAX + 3))
    await until(lambda: rig.source.buffered == VECTOR_MAX + 3)
    first = await next_vector(rig.source)
    assert len(first) == VECTOR_MAX
    await rig.source.nack(first[0])
    await asyncio.sleep(0.05)  # the retry's backoff (0.01 s) has passed
    second = await next_vector(rig.source)
    assert [offset(d) for d in second] == [0, *range(VECTOR_MAX, VECTOR_MAX + 3)]
    assert second[0].delivery_attempt == 2
    await rig.source.close()


async def test_a_record_with_unreadable_headers_is_dead_lettered_at_the_next_step() -> None:
    rig = make_rig()
    await start(rig, {TP0})
    rig.consumer.pending[TP0] = [
        Record(TOPIC, 0, 0),
        Record(TOPIC, 0, 1, headers=(("rowbatch-chunk-id", b"\xff\xfe"),)),
        Record(TOPIC, 0, 2),
    ]
    await until(lambda: rig.source.buffered == 3)
    vector = await next_vector(rig.source)
    assert [offset(d) for d in vector] == [0, 2]
    assert not rig.producer.sent, "nothing awaited between taking the vector and handing it"
    await rig.source.ack_many(vector)
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.commits[-1] == {TP0: 1}, "the unreadable record holds the commit"
    rig.consumer.feed(TP0, [3])
    later = await next_vector(rig.source)
    assert [offset(d) for d in later] == [3]
    assert len(rig.producer.sent) == 1
    assert rig.source.dead_lettered_here == 1
    await rig.source.ack_many(later)
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.commits[-1] == {TP0: 4}
    await rig.source.close()
