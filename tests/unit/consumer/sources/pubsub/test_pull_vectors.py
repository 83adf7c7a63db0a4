"""PubSubPullSource's vectors: the messages of a Pull response ready to be yielded come in one
step (those behind an ordering key still wait for the one before them; those held past
``max_lease_duration_s`` are nacked instead), and ``ack_many`` settles them at once."""

from __future__ import annotations

import asyncio

from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from tests.unit.consumer.sources.pubsub.test_pull import (
    Factory,
    FakeRpc,
    FakeTime,
    make,
    received,
    rpc,
    settle,
    time_,
)

__all__ = ["make", "rpc", "time_"]  # the fixtures this module uses


async def next_vector(source: PubSubPullSource) -> list[Delivery]:
    return list(await asyncio.wait_for(anext(source.vectors()), 5))


async def test_a_pull_response_comes_as_one_vector(make: Factory, rpc: FakeRpc) -> None:
    source = make(ack_delay_ms=0, max_messages=1000)
    rpc.publish(received(40))
    vector = await next_vector(source)
    assert [d.message_id for d in vector] == [f"m{i}" for i in range(40)]
    assert source.buffered == 0 and source.outstanding == 40
    await source.ack_many(vector)
    await source.flush()
    assert rpc.acked == [f"a{i}" for i in range(40)]
    assert source.outstanding == 0


async def test_ordering_keys_hold_back_the_messages_behind_in_a_vector(
    make: Factory, rpc: FakeRpc
) -> None:
    source = make(ack_delay_ms=0)
    rpc.publish([*received(3, key="k"), *received(2, start=3)])
    vector = await next_vector(source)
    assert [d.message_id for d in vector] == ["m0", "m3", "m4"]
    await source.ack_many(vector)
    assert [d.message_id for d in await next_vector(source)] == ["m1"]


async def test_a_vector_leaves_out_what_was_held_past_the_lease_limit(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(max_lease_duration_s=5, ack_delay_ms=0)
    rpc.publish(received(1))
    [first] = await next_vector(source)
    source.pause()
    source._receive(received(2, start=1), time_.now)  # as a pull in flight would
    await time_.advance(6)
    source._receive(received(1, start=3), time_.now)
    source.resume()
    await settle()
    assert [d.message_id for d in await next_vector(source)] == ["m3"]
    await source.ack(first)
    await source.flush()
    assert sorted(rpc.nacked()) == ["a1", "a2"]
