"""The Kafka source's side of scale-out, without a broker: a revoke takes back from the pipeline
the records it has not sent to the model (not committed past, counted, not waited for) and waits
only for the others; the read-ahead holds no more rows than the pipeline's work bound, without
pausing the partitions unless the pipeline stalls."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence

import pytest
from prometheus_client import generate_latest

from rowbatch.consumer.sources.base import BoundsReadAhead, WithdrawsDeliveries, WorkBound
from rowbatch.consumer.sources.delivery import Delivery
from tests.unit.consumer.sources.kafka.test_source import (
    TP0,
    TP1,
    make_rig,
    offset,
    partition,
    start,
    take,
    until,
)


class FakePipeline:
    """Drops what ``unsent`` says was not yet sent to the model."""

    def __init__(self, unsent: set[tuple[int, int]]) -> None:
        self.unsent = unsent
        self.asked: list[list[str]] = []

    def withdraw(self, deliveries: Sequence[Delivery]) -> Collection[Delivery]:
        self.asked.append(sorted(d.message_id for d in deliveries))
        return [d for d in deliveries if (partition(d).partition, offset(d)) in self.unsent]


def test_the_kafka_source_has_both_capabilities() -> None:
    source = make_rig().source
    assert isinstance(source, BoundsReadAhead)
    assert isinstance(source, WithdrawsDeliveries)


async def test_a_revoke_takes_back_what_was_not_sent_and_waits_only_for_the_rest() -> None:
    rig = make_rig(revoke_grace_s=15.0)  # far longer than the test may take
    pipeline = FakePipeline({(0, 2), (0, 3), (0, 4), (1, 9)})
    rig.source.on_withdraw(pipeline.withdraw)
    await start(rig, {TP0, TP1})
    rig.consumer.feed(TP0, range(5))
    rig.consumer.feed(TP1, range(2))
    got = {(partition(d), offset(d)): d for d in await take(rig.source, 7)}
    await rig.source.ack(got[(TP0, 0)])

    async def finish_what_was_sent() -> None:
        await until(lambda: rig.source.withdrawn == 3)
        for key in [(TP0, 1), (TP1, 0), (TP1, 1)]:
            await rig.source.ack(got[key])

    finisher = asyncio.create_task(finish_what_was_sent())
    async with asyncio.timeout(5):
        await rig.consumer.assign({TP1})  # eager: both revoked, TP0 goes to another member
    await finisher
    # Asked once, with every yielded and unsettled record of the revoked partitions.
    assert pipeline.asked == [[f"rows/0/{o}" for o in range(1, 5)] + ["rows/1/0", "rows/1/1"]]
    assert rig.source.withdrawn == 3
    # The commit stops at the first record taken back: the next owner reads 2.. again.
    assert rig.consumer.commits[-1] == {TP0: 2, TP1: 2}
    assert rig.source.outstanding == 0
    with pytest.raises(ValueError, match="not held"):
        await rig.source.ack(got[(TP0, 2)])
    metrics = generate_latest(rig.source.registry).decode()
    assert 'rowbatch_kafka_records_withdrawn_total{topic="rows"} 3.0' in metrics
    await rig.source.close()


async def test_a_partition_coming_back_is_read_again_from_the_first_record_taken_back() -> None:
    rig = make_rig()
    rig.source.on_withdraw(FakePipeline({(0, 1), (0, 2)}).withdraw)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(3))
    first = await take(rig.source, 3)
    await rig.source.ack(first[0])
    await rig.consumer.assign({TP0})  # the same member again
    assert rig.consumer.commits[-1] == {TP0: 1}
    again = await take(rig.source, 2)
    assert [offset(d) for d in again] == [1, 2]
    for d in again:
        await rig.source.ack(d)
    await rig.source._commit({TP0}, "test")
    assert rig.consumer.committed_now[TP0] == 3
    await rig.source.close()


async def test_a_failing_withdraw_leaves_the_revoke_waiting_as_before() -> None:
    rig = make_rig(revoke_grace_s=0.01)

    def broken(deliveries: Sequence[Delivery]) -> Collection[Delivery]:
        raise RuntimeError("bug")

    rig.source.on_withdraw(broken)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(2))
    d0, _ = await take(rig.source, 2)
    await rig.source.ack(d0)
    await rig.consumer.assign(set())
    assert rig.consumer.commits[-1] == {TP0: 1}
    assert rig.source.withdrawn == 0
    await rig.source.close()


# --- the read-ahead's rows bound ----------------------------------------------------------------
# The fake records carry 10 rows each.


async def test_read_ahead_holds_no_more_rows_than_the_work_bound_without_pausing() -> None:
    rig = make_rig()
    rig.source.bound_read_ahead(WorkBound(batch_rows=5, in_flight=3, rows=30))
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(20))
    await until(lambda: rig.source.buffered == 3)
    # One record first (rows per record unknown), then what the 20 rows left hold.
    assert rig.consumer.asked[:2] == [1, 2]
    asked = len(rig.consumer.asked)
    for _ in range(200):
        await asyncio.sleep(0)
    assert rig.source.buffered == 3
    assert len(rig.consumer.asked) == asked  # no fetch while full...
    assert rig.consumer.paused() == set()  # ...and no pause (aiokafka keeps its prefetch)
    await take(rig.source, 2)
    await until(lambda: rig.source.buffered == 3)
    assert rig.consumer.asked[asked:] == [2]
    await rig.source.close()


async def test_a_configured_rows_bound_wins_over_the_pipelines() -> None:
    rig = make_rig(max_buffered_rows=20)
    rig.source.bound_read_ahead(WorkBound(batch_rows=5, in_flight=3, rows=1000))
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(20))
    await until(lambda: rig.source.buffered == 2)
    for _ in range(200):
        await asyncio.sleep(0)
    assert rig.source.buffered == 2
    await rig.source.close()


async def test_a_stalled_pipeline_pauses_fetching_until_the_rows_drain_to_half() -> None:
    rig = make_rig()
    rig.source._ahead.stall_s = 0.0  # stalled as soon as the buffer is full
    rig.source.bound_read_ahead(WorkBound(batch_rows=5, in_flight=3, rows=30))
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(20))
    await until(lambda: rig.consumer.paused() == {TP0})
    assert rig.source.buffered == 3
    await take(rig.source, 1)
    assert rig.consumer.paused() == {TP0}  # 20 rows left: more than half of 30
    await take(rig.source, 1)
    assert rig.consumer.paused() == set()
    await until(lambda: rig.source.buffered == 3)
    await rig.source.close()
