"""``PubSubPullSource`` against a fake Pull/Acknowledge/ModifyAckDeadline client, with an
injected clock and sleep: batching of acks and nacks, lease timing, flow control, pause and
resume, ordering keys, close. No real time passes in these tests."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.pubsub_v1 import types as pstypes
from pydantic import ValidationError

from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.observe.costs import pulled_cost
from rowbatch.consumer.service.build_io import make_source
from rowbatch.consumer.sources.base import READ_AHEAD_SHARE, Source
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.errors import PubSubPullError
from rowbatch.consumer.sources.pubsub.id_batcher import IdBatcher
from rowbatch.consumer.sources.pubsub.leases import LeaseBook
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource
from rowbatch.consumer.sources.pubsub.tasks import sleep_or_event
from rowbatch.timing import Clocks
from rowbatch.wire.dead_letter import ReasonClass

SUB = "projects/p/subscriptions/sub"


def err(kind: type[Exception], text: str) -> Exception:
    return kind(text)


class FakeTime:
    """A monotonic clock and a sleep that only returns when the clock is advanced."""

    def __init__(self) -> None:
        self.now = 1000.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self.now + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        # Ready tasks first reach their sleeps at the current time: how many loop turns that
        # takes differs between Python versions (3.12's wait_for runs inline, without a task).
        await settle()
        self.now += seconds
        for wake_at, future in self._sleepers:
            if wake_at <= self.now and not future.done():
                future.set_result(None)
        self._sleepers = [(t, f) for t, f in self._sleepers if not f.done()]
        await settle()


async def settle() -> None:
    """Let every ready task run (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


def received(
    n: int,
    *,
    start: int = 0,
    key: str = "",
    attempt: int = 0,
    data: bytes = b"row",
) -> list[Any]:
    stamp = datetime.fromtimestamp(1_700_000_000.5, UTC)
    out = []
    for i in range(start, start + n):
        message = pstypes.PubsubMessage(
            data=data,
            message_id=f"m{i}",
            attributes={"i": str(i)},
            ordering_key=key,
            publish_time=stamp,
        )
        item = pstypes.ReceivedMessage(ack_id=f"a{i}", message=message, delivery_attempt=attempt)
        out.append(pstypes.ReceivedMessage.pb(item))
    return out


class FakeRpc:
    """Serves ``backlog``; a Pull on an empty backlog waits for more (a long poll)."""

    def __init__(self) -> None:
        self.backlog: deque[Any] = deque()
        self.pulls: list[int] = []
        self.acks: list[list[str]] = []
        self.modacks: list[tuple[list[str], int]] = []
        self.ack_errors: list[Exception] = []
        self.pull_errors: list[Exception] = []
        self.closed = False
        self._more = asyncio.Event()

    def publish(self, items: Sequence[Any]) -> None:
        self.backlog.extend(items)
        self._more.set()

    async def pull(self, max_messages: int) -> Sequence[Any]:
        self.pulls.append(max_messages)
        if self.pull_errors:
            raise self.pull_errors.pop(0)
        while not self.backlog:
            self._more.clear()
            await self._more.wait()
        n = min(max_messages, len(self.backlog))
        return [self.backlog.popleft() for _ in range(n)]

    async def acknowledge(self, ack_ids: list[str]) -> None:
        if self.ack_errors:
            raise self.ack_errors.pop(0)
        self.acks.append(list(ack_ids))

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        self.modacks.append((list(ack_ids), seconds))

    async def close(self) -> None:
        self.closed = True

    @property
    def acked(self) -> list[str]:
        return [a for batch in self.acks for a in batch]

    def extensions(self) -> list[list[str]]:
        return [ids for ids, seconds in self.modacks if seconds > 0]

    def nacked(self) -> list[str]:
        return [a for ids, seconds in self.modacks if seconds == 0 for a in ids]


Factory = Callable[..., PubSubPullSource]


@pytest.fixture
def time_() -> FakeTime:
    return FakeTime()


@pytest.fixture
def rpc() -> FakeRpc:
    return FakeRpc()


@pytest.fixture
async def make(time_: FakeTime, rpc: FakeRpc) -> AsyncIterator[Factory]:
    made: list[PubSubPullSource] = []

    def factory(**overrides: Any) -> PubSubPullSource:
        settings: dict[str, Any] = {
            "subscription": SUB,
            "dead_letter_topic": None,
            "close_pull_wait_s": 0.0,
            **overrides,
        }
        source = PubSubPullSource(
            PubSubSettings(**settings),
            consumer_version="test",
            rpc=rpc,
            clocks=Clocks(monotonic=time_.clock, sleep=time_.sleep),
        )
        made.append(source)
        return source

    yield factory
    for source in made:
        await source.close()


async def take(iterator: AsyncIterator[Delivery], n: int) -> list[Delivery]:
    return [await asyncio.wait_for(anext(iterator), 5) for _ in range(n)]


def _as_source(source: PubSubPullSource) -> Source:
    return source  # mypy checks that PubSubPullSource satisfies the Source protocol


# --- deliveries -------------------------------------------------------------------------------


async def test_deliveries_carry_the_message(make: Factory, rpc: FakeRpc) -> None:
    source = _as_source(make())
    rpc.publish(received(1, attempt=3, data=b"payload"))
    [delivery] = await take(source.deliveries(), 1)
    assert delivery.message_id == "m0"
    assert delivery.payload == b"payload"
    assert dict(delivery.attributes) == {"i": "0"}
    assert delivery.publish_time == 1_700_000_000.5
    assert delivery.delivery_attempt == 3
    assert delivery.source == SUB
    # Like the streaming client's Message.size: the serialized PubsubMessage.
    expected = len(received(1, attempt=3, data=b"payload")[0].message.SerializeToString())
    assert delivery.size == expected > len(b"payload")


# --- batched acks and nacks --------------------------------------------------------------------


async def test_acks_go_out_in_calls_of_at_most_ack_max_ids(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(ack_max_ids=100, ack_delay_ms=1000, max_messages=1000)
    rpc.publish(received(250))
    deliveries = await take(source.deliveries(), 250)
    for delivery in deliveries:
        await source.ack(delivery)
    await settle()
    # Two full calls at once; the last 50 wait for the delay (an hour here) or a flush.
    assert [len(batch) for batch in rpc.acks] == [100, 100]
    assert source.unconfirmed == 50
    await source.flush()
    assert [len(batch) for batch in rpc.acks] == [100, 100, 50]
    assert rpc.acked == [d.message_id.replace("m", "a") for d in deliveries]
    assert source.unconfirmed == 0 and source.outstanding == 0


async def test_an_ack_waits_at_most_ack_delay(make: Factory, rpc: FakeRpc, time_: FakeTime) -> None:
    source = make(ack_delay_ms=10)
    rpc.publish(received(5))
    deliveries = await take(source.deliveries(), 5)
    for delivery in deliveries:
        await source.ack(delivery)
    await settle()
    assert rpc.acks == []
    await time_.advance(0.005)
    assert rpc.acks == []
    await time_.advance(0.006)
    assert rpc.acks == [["a0", "a1", "a2", "a3", "a4"]]


async def test_nacks_are_batched_modify_ack_deadline_zero(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(ack_delay_ms=10)
    rpc.publish(received(3))
    for delivery in await take(source.deliveries(), 3):
        await source.nack(delivery)
    with pytest.raises(ValueError, match="not held"):
        await source.ack(delivery)
    await time_.advance(0.02)
    assert rpc.modacks == [(["a0", "a1", "a2"], 0)]
    assert rpc.acks == []


async def test_a_failed_ack_call_is_retried(make: Factory, rpc: FakeRpc, time_: FakeTime) -> None:
    source = make(ack_delay_ms=0)
    rpc.ack_errors = [err(gexc.ServiceUnavailable, "down"), err(gexc.DeadlineExceeded, "slow")]
    rpc.publish(received(2))
    for delivery in await take(source.deliveries(), 2):
        await source.ack(delivery)
    await settle()
    assert rpc.acks == []
    await time_.advance(0.1)  # first backoff
    await time_.advance(0.2)  # second
    assert rpc.acks == [["a0", "a1"]]
    assert source.unconfirmed == 0


async def test_a_rejected_ack_call_is_given_up_and_logged(
    make: Factory, rpc: FakeRpc, caplog: pytest.LogCaptureFixture
) -> None:
    source = make(ack_delay_ms=0)
    rpc.ack_errors = [err(gexc.InvalidArgument, "bad ack ids")]
    rpc.publish(received(1))
    [delivery] = await take(source.deliveries(), 1)
    with caplog.at_level(logging.WARNING):
        await source.ack(delivery)
        await source.flush()
    assert rpc.acks == []
    assert "ack of 1 message(s) not confirmed (InvalidArgument" in caplog.text


def test_id_batcher_give_up_after_retry_window() -> None:
    now = [0.0]
    sent: list[list[str]] = []

    async def send(ids: list[str]) -> None:
        now[0] += 1.0
        raise err(gexc.ServiceUnavailable, "down")

    async def sleep(seconds: float) -> None:
        now[0] += seconds

    async def run() -> IdBatcher:
        batcher = IdBatcher(
            "ack", send, max_ids=10, max_delay_s=0, retry_s=5, clock=lambda: now[0], sleep=sleep
        )
        batcher.extend(["x", "y"])
        await batcher.flush()
        return batcher

    batcher = asyncio.run(run())
    assert sent == []
    assert batcher.given_up == 2 and batcher.pending == 0
    assert 4 <= now[0] <= 6  # about retry_s of trying


# --- leases ------------------------------------------------------------------------------------


async def test_leases_are_extended_at_two_thirds_of_each_deadline(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    # No check(): the subscription's ack deadline is taken as 10 s, the minimum.
    source = make(max_lease_extension_s=60)
    rpc.publish(received(3))
    deliveries = await take(source.deliveries(), 3)
    await source.ack(deliveries[0])
    await source.flush()

    await time_.advance(6.5)
    assert rpc.extensions() == []
    await time_.advance(0.2)  # 6.7 s after the pull was sent: 2/3 of 10 s
    assert [sorted(ids) for ids in rpc.extensions()] == [["a1", "a2"]]
    assert rpc.modacks[-1][1] == 60

    await time_.advance(39.9)
    assert len(rpc.extensions()) == 1
    await time_.advance(0.2)  # 2/3 of 60 s after the first extension
    assert [sorted(ids) for ids in rpc.extensions()] == [["a1", "a2"], ["a1", "a2"]]
    assert source.leased == 2


async def test_extensions_of_nearby_pulls_share_one_call(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(max_lease_extension_s=60, pull_concurrency=1)
    iterator = source.deliveries()
    rpc.publish(received(2))
    await take(iterator, 2)
    await time_.advance(3)
    rpc.publish(received(2, start=2))
    await take(iterator, 2)
    await time_.advance(3.7)  # the first pull is due; the second (due in 3 s) joins it
    assert [sorted(ids) for ids in rpc.extensions()] == [["a0", "a1", "a2", "a3"]]
    assert source.extension_calls == 1


async def test_a_failed_extension_is_retried(
    make: Factory, rpc: FakeRpc, time_: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    source = make()
    rpc.publish(received(1))
    await take(source.deliveries(), 1)
    original = rpc.modify_ack_deadline
    failures = [err(gexc.ServiceUnavailable, "down")]

    async def flaky(ack_ids: list[str], seconds: int) -> None:
        if failures:
            raise failures.pop()
        await original(ack_ids, seconds)

    rpc.modify_ack_deadline = flaky  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        await time_.advance(6.7)
    assert rpc.extensions() == []
    assert "extending the leases of 1 message(s)" in caplog.text
    await time_.advance(1.0)
    assert rpc.extensions() == [["a0"]]


async def test_leases_end_after_max_lease_duration(
    make: Factory, rpc: FakeRpc, time_: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    source = make(max_lease_extension_s=60, max_lease_duration_s=100)
    rpc.publish(received(1))
    await take(source.deliveries(), 1)
    await time_.advance(6.7)  # extended to +60 s
    await time_.advance(40)  # at 46.7 s: again
    await time_.advance(40)  # at 86.7 s: again (held < 100 s)
    assert len(rpc.extensions()) == 3
    with caplog.at_level(logging.WARNING):
        await time_.advance(40)  # at 126.7 s: held past 100 s, dropped
    assert len(rpc.extensions()) == 3
    assert source.leased == 0 and source.outstanding == 1
    assert "held past max_lease_duration_s=100" in caplog.text


async def test_a_buffered_delivery_past_max_lease_duration_is_nacked(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(max_lease_duration_s=5, ack_delay_ms=0)
    iterator = source.deliveries()
    rpc.publish(received(1))
    [first] = await take(iterator, 1)
    source.pause()
    rpc.publish(received(1, start=1))
    await source.ack(first)
    # Paused: no pull starts, so push the second message in as a pull in flight would.
    source._receive(list(rpc.backlog), time_.now)
    rpc.backlog.clear()
    await time_.advance(6)
    source.resume()
    rpc.publish(received(1, start=2))
    [fresh] = await take(iterator, 1)
    assert fresh.message_id == "m2"
    await source.flush()
    assert rpc.nacked() == ["a1"]


# --- flow control, pause, resume ---------------------------------------------------------------


async def test_flow_control_holds_at_max_messages(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(max_messages=10, pull_concurrency=2, ack_delay_ms=0)
    rpc.publish(received(40))
    iterator = source.deliveries()
    got = await take(iterator, 10)
    await settle()
    assert source.outstanding == 10
    assert sum(rpc.pulls) == 10  # the two pulls shared the room
    waiting = asyncio.ensure_future(anext(iterator))
    await settle()
    assert not waiting.done()

    for delivery in got[:4]:
        await source.ack(delivery)
    await settle()
    assert waiting.done()
    assert source.outstanding == 10
    assert sum(rpc.pulls) == 14
    got = [*got[4:], waiting.result(), *await take(iterator, 3)]
    await settle()
    assert source.outstanding == 10 and source.buffered == 0


async def test_flow_control_by_bytes(make: Factory, rpc: FakeRpc) -> None:
    source = make(max_bytes=1024, pull_concurrency=1, pull_max_messages=1, ack_delay_ms=0)
    rpc.publish(received(5, data=b"x" * 600))
    iterator = source.deliveries()
    first, _ = await take(iterator, 2)
    await settle()
    assert rpc.pulls == [1, 1]  # 1,200 bytes held: no third pull
    assert source.outstanding == 2
    await source.ack(first)
    await take(iterator, 1)
    await settle()
    assert rpc.pulls == [1, 1, 1]


async def test_read_ahead_is_held_in_a_shared_budget_within_its_share(
    make: Factory, rpc: FakeRpc
) -> None:
    # max_messages would let 10,000 messages wait; the shared budget holds the read-ahead to a
    # quarter of it (issue 22: 20,000 pulled 1-row messages were ~40 MiB nobody counted)
    budget = ByteBudget(400_000)
    source = make(max_messages=10_000, pull_concurrency=2, ack_delay_ms=0)
    source.share_budget(budget)
    rpc.publish(received(2_000))
    iterator = source.deliveries()
    await take(iterator, 1)
    await settle()
    quarter = budget.limit * READ_AHEAD_SHARE
    per_message = pulled_cost((await take(iterator, 1))[0])
    assert 0 < budget.ahead <= quarter + 64 * per_message  # a first pull may overshoot once
    pulled = sum(rpc.pulls)
    assert pulled < 2 * quarter / per_message
    for _ in range(5):
        await take(iterator, int(quarter / per_message / 2))
        await settle()
        assert budget.ahead <= quarter
    assert sum(rpc.pulls) > pulled  # taking made room: pulls went on
    assert budget.ahead == source._held.ahead_bytes


async def test_messages_larger_than_the_read_ahead_share_still_come_one_at_a_time(
    make: Factory, rpc: FakeRpc
) -> None:
    # a 40 KB message against a 100 KB budget: its read-ahead share (25 KB) never holds one
    budget = ByteBudget(100_000)
    source = make(pull_concurrency=1, ack_delay_ms=0)
    source.share_budget(budget)
    rpc.publish(received(1, data=b"x" * 40_000))
    iterator = source.deliveries()
    await source.ack((await take(iterator, 1))[0])  # the first pull tells the cost
    rpc.publish(received(3, start=1, data=b"x" * 40_000))
    for _ in range(3):
        delivery = (await take(iterator, 1))[0]
        await settle()
        assert budget.ahead <= pulled_cost(delivery)  # one waits at most
        await source.ack(delivery)
    assert rpc.pulls[0] == 64 and rpc.pulls[1:4] == [1, 1, 1]


async def test_no_pull_while_the_pipeline_holds_the_budget(make: Factory, rpc: FakeRpc) -> None:
    budget = ByteBudget(100_000)
    await budget.acquire(budget.limit)
    source = make(pull_concurrency=1, ack_delay_ms=0)
    source.share_budget(budget)
    rpc.publish(received(50))
    waiting = asyncio.ensure_future(anext(source.deliveries()))
    await settle()
    assert rpc.pulls == [] and not waiting.done()
    await budget.release(budget.limit)  # the pipeline settled what it held: pulling starts
    await settle()
    assert rpc.pulls and waiting.done()


async def test_pause_stops_pulling_and_yielding_while_leases_continue(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(pull_concurrency=1, pull_max_messages=2)
    iterator = source.deliveries()
    rpc.publish(received(2))
    held = await take(iterator, 2)
    await settle()
    pulls = len(rpc.pulls)  # one more pull is waiting (long poll) on the empty backlog
    source.pause()
    assert source.paused
    rpc.publish(received(4, start=2))  # the waiting pull gets 2 of them
    waiting = asyncio.ensure_future(anext(iterator))
    await settle()
    assert not waiting.done()
    assert len(rpc.pulls) == pulls  # no new pull while paused
    assert source.buffered == 2 and source.outstanding == 4

    await time_.advance(6.7)
    assert sorted(rpc.extensions()[0]) == ["a0", "a1", "a2", "a3"]

    source.resume()
    assert (await asyncio.wait_for(waiting, 5)).message_id == "m2"
    for delivery in held:
        await source.ack(delivery)
    rest = await take(iterator, 3)
    assert [d.message_id for d in rest] == ["m3", "m4", "m5"]


# --- ordering keys -------------------------------------------------------------------------


async def test_a_keys_next_message_waits_until_the_previous_is_settled(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(ack_delay_ms=0)
    iterator = source.deliveries()
    rpc.publish([*received(3, key="k"), *received(1, start=3, key="j"), *received(1, start=4)])
    got = await take(iterator, 3)
    assert [d.message_id for d in got] == ["m0", "m3", "m4"]
    waiting = asyncio.ensure_future(anext(iterator))
    await settle()
    assert not waiting.done()
    assert source.buffered == 2 and source.outstanding == 5

    await source.ack(got[0])
    assert (await asyncio.wait_for(waiting, 5)).message_id == "m1"


async def test_nacking_a_keyed_message_nacks_the_ones_behind_it(
    make: Factory, rpc: FakeRpc
) -> None:
    source = make(ack_delay_ms=0)
    iterator = source.deliveries()
    rpc.publish(received(3, key="k"))
    [first] = await take(iterator, 1)
    await settle()
    await source.nack(first)
    await source.flush()
    assert rpc.nacked() == ["a0", "a1", "a2"]
    assert source.outstanding == 0 and source.buffered == 0


# --- close, dead letters, errors ---------------------------------------------------------------


async def test_close_nacks_everything_unsettled_and_sends_pending_acks(
    make: Factory, rpc: FakeRpc
) -> None:
    source = make(ack_delay_ms=1000, max_messages=6)
    iterator = source.deliveries()
    rpc.publish(received(8))
    handed = await take(iterator, 3)
    await settle()
    assert source.outstanding == 6 and source.buffered == 3
    await source.ack(handed[0])

    await source.close()
    assert rpc.acked == ["a0"]
    assert sorted(rpc.nacked()) == ["a1", "a2", "a3", "a4", "a5"]
    assert rpc.closed
    with pytest.raises(StopAsyncIteration):
        await anext(iterator)
    with pytest.raises(ValueError, match="not held"):
        await source.ack(handed[1])
    assert source.outstanding == 0 and source.unconfirmed == 0
    await source.close()  # idempotent


async def test_close_ends_lease_keeping_before_the_nacks(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make()
    rpc.publish(received(2))
    await take(source.deliveries(), 2)
    answer_nacks = asyncio.Event()
    original = rpc.modify_ack_deadline

    async def slow_nacks(ack_ids: list[str], seconds: int) -> None:
        if seconds == 0:
            await answer_nacks.wait()
        await original(ack_ids, seconds)

    rpc.modify_ack_deadline = slow_nacks  # type: ignore[method-assign]
    closing = asyncio.ensure_future(source.close())
    await settle()
    await time_.advance(6.7)  # the leases fall due while the nacks are in flight
    answer_nacks.set()
    await asyncio.wait_for(closing, 5)
    # An extension after the nacks would keep the messages from being redelivered.
    assert rpc.extensions() == []
    assert sorted(rpc.nacked()) == ["a0", "a1"]
    assert source.leased == 0


@pytest.mark.parametrize("steps", range(6))
async def test_a_cancel_while_sleep_or_event_tidies_up_is_not_lost(steps: int) -> None:
    # The event is set, so the wait ends; the cancel then lands `steps` turns later, in the
    # middle of cancelling the helper tasks for some value of `steps`. Before, that cancel was
    # swallowed there: the task went on, and close() waited for it forever.
    event = asyncio.Event()
    task = asyncio.ensure_future(sleep_or_event(asyncio.sleep, 3600, event))
    await settle()
    event.set()
    for _ in range(steps):
        await asyncio.sleep(0)
    requested = task.cancel()
    await asyncio.wait({task}, timeout=5)
    assert task.done()
    assert task.cancelled() == requested


async def test_dead_letter_without_topic_nacks(make: Factory, rpc: FakeRpc) -> None:
    source = make(ack_delay_ms=0)
    rpc.publish(received(1))
    [delivery] = await take(source.deliveries(), 1)
    await source.dead_letter(delivery, DeadLetterReason(ReasonClass.UNDECODABLE, "bad"))
    await source.flush()
    assert rpc.nacked() == ["a0"]
    with pytest.raises(ValueError, match="not held"):
        await source.dead_letter(delivery, DeadLetterReason(ReasonClass.UNDECODABLE, "bad"))


async def test_transient_pull_errors_are_retried(
    make: Factory, rpc: FakeRpc, time_: FakeTime
) -> None:
    source = make(pull_concurrency=1)
    rpc.pull_errors = [err(gexc.ServiceUnavailable, "down")]
    rpc.publish(received(1))
    waiting = asyncio.ensure_future(anext(source.deliveries()))
    await settle()
    assert not waiting.done()
    await time_.advance(0.1)
    assert (await asyncio.wait_for(waiting, 5)).message_id == "m0"


async def test_a_permanent_pull_error_ends_deliveries(make: Factory, rpc: FakeRpc) -> None:
    source = make(pull_concurrency=1)
    rpc.pull_errors = [err(gexc.NotFound, "Subscription does not exist")]
    with pytest.raises(PubSubPullError, match=f"pull on {SUB}"):
        await asyncio.wait_for(anext(source.deliveries()), 5)


# --- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "complaint"),
    [
        ({"subscription": "subs/x"}, r"subscription\n  String should match pattern"),
        ({"dead_letter_topic": "t"}, r"dead_letter_topic\n  String should match pattern"),
        ({"max_messages": 0}, "max_messages"),
        ({"pull_concurrency": 0}, "pull_concurrency"),
        ({"ack_max_ids": 1001}, "ack_max_ids"),
        ({"max_lease_extension_s": 5}, "max_lease_extension_s"),
        ({"max_lease_duration_s": 0}, "max_lease_duration_s"),
        ({"ack_delay_ms": -1}, "ack_delay_ms"),
    ],
)
def test_config_rejects_bad_values(overrides: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValidationError, match=complaint):
        PubSubSettings(**{"subscription": SUB, "dead_letter_topic": None, **overrides})


def test_lease_book_groups_and_drops() -> None:
    book = LeaseBook(extension_s=60, max_duration_s=50, slack_s=10)
    assert book.add(["a"], received_at=0, started_at=0, deadline_s=10) == pytest.approx(20 / 3)
    book.add(["b"], received_at=5, started_at=5, deadline_s=10)
    book.add(["c"], received_at=30, started_at=30, deadline_s=10)
    assert book.take_due(6.0) == ([], [])
    cohorts, dropped = book.take_due(7.0)  # a is due; b (due at 11.7) is within the slack
    assert sorted(i for c in cohorts for i in c.ack_ids) == ["a", "b"] and dropped == []
    book.extended(cohorts, sent_at=7.0)
    assert book.next_due() == pytest.approx(30 + 20 / 3)
    book.remove("c")
    assert book.next_due() == pytest.approx(47.0)
    cohorts, dropped = book.take_due(60.0)  # held 60 s > 50 s: dropped
    assert cohorts == [] and sorted(dropped) == ["a", "b"]
    assert len(book) == 0 and book.next_due() is None


async def test_make_source_picks_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:9")
    base = {"subscription": SUB, "dead_letter_topic": "projects/p/topics/dlq"}
    default = make_source(PubSubSettings.model_validate(base))
    streaming = make_source(PubSubSettings.model_validate({**base, "mode": "streaming"}))
    try:
        assert isinstance(default, PubSubPullSource)
        assert default.config.max_lease_extension_s == 60
        assert isinstance(streaming, PubSubSource)
    finally:
        await default.close()
        await streaming.close()
