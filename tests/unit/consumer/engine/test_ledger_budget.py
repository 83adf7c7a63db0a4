from __future__ import annotations

import asyncio

import pytest

from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.dead_letter import ReasonClass


def delivery(mid: str) -> Delivery:
    return Delivery(mid, b"", {}, 0.0, 1, "projects/p/subscriptions/s")


def test_message_completes_when_all_rows_written_across_batches() -> None:
    ledger = Ledger()
    e = ledger.open(delivery("m1"), "c1", rows=10, reserved_bytes=100, accepted_at=0.0)
    assert ledger.written(e.key, 4) is None
    done = ledger.written(e.key, 6)
    assert done is e
    assert done.failure is None
    assert len(ledger) == 0


def test_failure_waits_for_the_rest_then_dead_letters_whole_message() -> None:
    ledger = Ledger()
    e = ledger.open(delivery("m1"), "c1", rows=10, reserved_bytes=100, accepted_at=0.0)
    reason = DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, "row 3 rejected")
    assert ledger.failed(e.key, 5, reason) is None
    done = ledger.written(e.key, 5)
    assert done is not None
    assert done.failure == reason
    assert done.written_rows == 5


def test_over_resolution_is_an_error() -> None:
    ledger = Ledger()
    e = ledger.open(delivery("m1"), "c1", rows=2, reserved_bytes=0, accepted_at=0.0)
    with pytest.raises(ValueError, match="only 2 were outstanding"):
        ledger.written(e.key, 3)


async def test_budget_blocks_until_released() -> None:
    budget = ByteBudget(100)
    await budget.acquire(60)
    waiter = asyncio.create_task(budget.acquire(50))
    await asyncio.sleep(0)  # let the waiter run up to its wait (a yield, not a timed wait)
    assert not waiter.done()
    await budget.release(60)
    await asyncio.wait_for(waiter, timeout=5)
    assert budget.used == 50


async def test_oversized_request_admitted_alone() -> None:
    budget = ByteBudget(100)
    await budget.acquire(500)
    assert budget.used == 500
    assert not budget.fits(1)
    await budget.release(500)
    assert budget.fits(100)


def test_budget_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="must be > 0"):
        ByteBudget(0)


async def test_read_ahead_takes_room_from_intake_and_giving_it_back_wakes_intake() -> None:
    budget = ByteBudget(100)
    await budget.acquire(10)
    budget.set_ahead(60)
    assert budget.room == 30
    assert not budget.fits(40)
    waiter = asyncio.create_task(budget.acquire(40))
    await asyncio.sleep(0)  # a yield: the waiter is now waiting
    assert not waiter.done()
    budget.set_ahead(20)  # the source handed records to intake: synchronous, wakes it
    await asyncio.wait_for(waiter, timeout=5)
    assert (budget.used, budget.ahead, budget.room) == (50, 20, 30)


async def test_intake_is_never_starved_by_read_ahead_alone() -> None:
    budget = ByteBudget(100)
    budget.set_ahead(150)  # one large fetch overshot the whole budget
    await asyncio.wait_for(budget.acquire(30), timeout=5)  # nothing held: admitted
    assert budget.used == 30


async def test_releases_are_reported_to_watchers() -> None:
    budget = ByteBudget(100)
    seen: list[int] = []
    budget.watch(lambda: seen.append(budget.used))
    await budget.acquire(70)
    await budget.release(30)
    await budget.release(40)
    assert seen == [40, 0]


async def test_a_cancelled_wait_holds_nothing() -> None:
    budget = ByteBudget(100)
    await budget.acquire(90)
    waiter = asyncio.create_task(budget.acquire(50))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await budget.release(90)
    assert budget.used == 0


async def test_release_now_wakes_waiters_and_watchers_without_yielding() -> None:
    budget = ByteBudget(100)
    await budget.acquire(80)
    watched: list[int] = []
    budget.watch(lambda: watched.append(budget.used))
    waiter = asyncio.create_task(budget.acquire(50))
    await asyncio.sleep(0)
    assert not waiter.done()
    budget.release_now(60)
    assert budget.used == 20
    assert watched == [20]
    await asyncio.wait_for(waiter, 1)
    assert budget.used == 70
