"""Bisecting a failed batch: every group ends up good or bad, bad is exactly the poison groups,
and the number of attempts stays within 1 + 2 k ceil(log2 n)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.consumer.engine.poison import Isolation, isolate


class Poison(Exception):
    pass


class Transient(Exception):
    pass


class Model:
    """Fails a request that holds any poison group; otherwise answers the groups' sum."""

    def __init__(self, poison: set[int], transient_on: int | None = None) -> None:
        self.poison = poison
        self.transient_on = transient_on
        self.attempts: list[list[int]] = []

    async def __call__(self, groups: Sequence[int]) -> int:
        self.attempts.append(list(groups))
        await asyncio.sleep(0)
        if self.transient_on is not None and len(self.attempts) == self.transient_on:
            raise Transient("server down")
        hit = sorted(set(groups) & self.poison)
        if hit:
            raise Poison(f"groups {hit}")
        return sum(groups)


def is_poison(exc: BaseException) -> bool:
    return isinstance(exc, Poison)


def bound(n: int, k: int) -> int:
    return 1 + 2 * k * math.ceil(math.log2(n)) if n > 1 else 1


def check(found: Isolation[int, int], groups: list[int], poison: set[int]) -> None:
    good_groups = [g for part, _ in found.good for g in part]
    bad_groups = [g for g, _ in found.bad]
    assert sorted(good_groups + bad_groups) == sorted(groups)  # each group exactly once
    assert set(bad_groups) == poison & set(groups)
    assert not set(good_groups) & poison
    for part, result in found.good:
        assert result == sum(part)
    for group, error in found.bad:
        assert isinstance(error, Poison)
        assert str(error) == f"groups [{group}]"
    # Order is kept: good runs and bad groups, merged, give back the input order.
    assert good_groups == [g for g in groups if g not in poison]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(min_value=0, max_value=200).flatmap(
        lambda n: st.tuples(
            st.just(n), st.sets(st.integers(min_value=0, max_value=max(n - 1, 0)), max_size=n)
        )
    )
)
async def test_isolate_properties(case: tuple[int, set[int]]) -> None:
    n, poison = case
    groups = list(range(n))
    model = Model(poison)
    found = await isolate(groups, model, is_poison)
    check(found, groups, poison)
    k = len(poison)
    if n:
        assert len(model.attempts) <= bound(n, k)
    else:
        assert model.attempts == []
    if not poison and n:
        assert found.good == [(groups, sum(groups))]
        assert len(model.attempts) == 1


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10_000), unique=True, min_size=1, max_size=64), st.data())
async def test_known_failure_skips_the_first_attempt(
    groups: list[int], data: st.DataObject
) -> None:
    poison = set(data.draw(st.lists(st.sampled_from(groups), min_size=1, unique=True)))
    model = Model(poison)
    first = Poison(f"groups {sorted(poison)}")
    found = await isolate(groups, model, is_poison, known_failure=first)
    check_known = [g for g, _ in found.bad]
    assert set(check_known) == poison
    assert groups not in model.attempts  # the whole was not tried again
    assert len(model.attempts) <= bound(len(groups), len(poison)) - 1
    if len(groups) == 1:
        assert found.bad == [(groups[0], first)]


async def test_halves_are_tried_in_order() -> None:
    model = Model({5})
    found = await isolate(list(range(8)), model, is_poison)
    assert model.attempts == [
        [0, 1, 2, 3, 4, 5, 6, 7],
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [4, 5],
        [4],
        [5],
        [6, 7],
    ]
    assert found.good == [([0, 1, 2, 3], 6), ([4], 4), ([6, 7], 13)]
    assert [g for g, _ in found.bad] == [5]


async def test_all_poison() -> None:
    model = Model({0, 1, 2})
    found = await isolate([0, 1, 2], model, is_poison)
    assert found.good == []
    assert [g for g, _ in found.bad] == [0, 1, 2]


async def test_non_poison_error_propagates() -> None:
    model = Model({3}, transient_on=3)  # whole fails (poison), first half ok, second half down
    with pytest.raises(Transient, match="server down"):
        await isolate([0, 1, 2, 3], model, is_poison)
    assert len(model.attempts) == 3


async def test_cancellation_propagates() -> None:
    started = asyncio.Event()

    async def hang(groups: Sequence[int]) -> int:
        started.set()
        await asyncio.Event().wait()
        return 0

    task = asyncio.create_task(isolate([1, 2], hang, is_poison))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


class MergingModel(Model):
    """A server that merges requests: the attempts numbered in ``spoiled`` fail as if merged
    with someone else's poison request, whatever they hold."""

    def __init__(self, poison: set[int], spoiled: set[int]) -> None:
        super().__init__(poison)
        self.spoiled = spoiled

    async def __call__(self, groups: Sequence[int]) -> int:
        if len(self.attempts) + 1 in self.spoiled:
            self.attempts.append(list(groups))
            raise Poison(f"groups {sorted(self.poison)} (merged)")
        return await super().__call__(groups)


async def test_confirm_keeps_a_good_group_that_failed_for_a_merged_neighbour() -> None:
    # The only group of a batch failed because the server merged it with a poison request:
    # tried again alone, it is answered, not dead-lettered.
    model = MergingModel(poison=set(), spoiled={1})
    found = await isolate([7], model, is_poison, confirm=True)
    assert found.bad == []
    assert found.good == [([7], 7)]
    assert model.attempts == [[7], [7]]


async def test_without_confirm_a_spoiled_single_attempt_is_called_poison() -> None:
    model = MergingModel(poison=set(), spoiled={1})
    found = await isolate([7], model, is_poison)
    assert [g for g, _ in found.bad] == [7]  # what confirm exists to prevent


async def test_confirm_calls_poison_what_fails_alone_twice_and_costs_one_attempt_more() -> None:
    groups = list(range(8))
    model = Model({5})
    found = await isolate(groups, model, is_poison, confirm=True)
    check(found, groups, {5})
    assert model.attempts.count([5]) == 2
    assert len(model.attempts) <= bound(8, 1) + 1


async def test_confirm_with_a_spoiled_bisection_step_still_finds_exactly_the_poison() -> None:
    groups = list(range(8))
    model = MergingModel(poison={2}, spoiled={3})  # the second half's attempt is spoiled
    found = await isolate(groups, model, is_poison, confirm=True)
    assert [g for g, _ in found.bad] == [2]
    assert sorted(g for part, _ in found.good for g in part) == [0, 1, 3, 4, 5, 6, 7]


# Fatal errors (``is_fatal``): bisected like poison, the groups failing alone reported in
# ``failed`` (to retry later), and bounded when the server fails everything.


class Fatal(Exception):
    pass


class CrashingModel(Model):
    """Poison groups fail a request as INVALID_ARGUMENT would; failing that, ``crash`` groups
    fail it as a model raising would (INTERNAL); ``broken`` fails every request so."""

    def __init__(self, poison: set[int], crash: set[int], *, broken: bool = False) -> None:
        super().__init__(poison)
        self.crash = crash
        self.broken = broken

    async def __call__(self, groups: Sequence[int]) -> int:
        answer = await super().__call__(groups)
        hit = sorted(set(groups) & self.crash)
        if self.broken or hit:
            raise Fatal(f"internal error {hit}")
        return answer


def is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, Fatal)


def fatal_bound(n: int) -> int:
    """Attempts an isolation makes on a server failing everything."""
    return 2 + math.ceil(math.log2(n))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=1, max_value=200), st.data(), st.booleans())
async def test_one_crashing_group_is_failed_alone_and_every_other_answered_once(
    n: int, data: st.DataObject, confirm: bool
) -> None:
    groups = list(range(n))
    crash = data.draw(st.sampled_from(groups))
    poison = set(data.draw(st.lists(st.sampled_from(groups), max_size=3))) - {crash}
    model = CrashingModel(poison, {crash})
    found = await isolate(groups, model, is_poison, is_fatal=is_fatal, confirm=confirm)
    assert [g for g, _ in found.failed] == [crash]
    assert all(isinstance(e, Fatal) for _, e in found.failed)
    assert sorted(g for g, _ in found.bad) == sorted(poison)
    good = [g for part, _ in found.good for g in part]
    assert good == [g for g in groups if g != crash and g not in poison]  # once each, in order
    for part, result in found.good:
        assert result == sum(part)
    if not poison:
        assert len(model.attempts) <= bound(n, 1) + confirm


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=1000), st.booleans(), st.booleans())
async def test_a_server_failing_everything_costs_at_most_2_plus_log2_n_attempts(
    n: int, confirm: bool, known: bool
) -> None:
    groups = list(range(n))
    model = CrashingModel(set(), set(), broken=True)
    first = Fatal("internal error (first)") if known else None
    found = await isolate(
        groups, model, is_poison, is_fatal=is_fatal, known_failure=first, confirm=confirm
    )
    assert found.good == [] and found.bad == []
    assert [g for g, _ in found.failed] == groups
    want = fatal_bound(n) if n > 1 else 1
    assert len(model.attempts) == want - known


async def test_crashers_spread_out_are_all_found() -> None:
    groups = list(range(16))
    model = CrashingModel(set(), {0, 5, 11})
    found = await isolate(groups, model, is_poison, is_fatal=is_fatal, confirm=True)
    assert [g for g, _ in found.failed] == [0, 5, 11]
    assert [g for part, _ in found.good for g in part] == [g for g in groups if g not in {0, 5, 11}]


async def test_crashers_all_down_the_left_end_it_and_the_rest_is_failed_untried() -> None:
    # Groups 0 and 1 crash: whole, [0..3], [0, 1], [0], [1] fail with nothing answered. The
    # allowance for 8 groups is 1 + 3 fatal failures, so [1]'s, the fifth, ends the isolation:
    # [2, 3] and [4..7] are not tried, and everything not answered is handed back.
    model = CrashingModel(set(), {0, 1})
    found = await isolate(list(range(8)), model, is_poison, is_fatal=is_fatal, confirm=True)
    assert model.attempts == [[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 3], [0, 1], [0], [1]]
    assert found.good == []
    assert [g for g, _ in found.failed] == list(range(8))
    assert all(isinstance(e, Fatal) for _, e in found.failed)


async def test_after_a_success_a_fatal_group_is_confirmed_alone_like_poison() -> None:
    model = CrashingModel(set(), {5})
    found = await isolate(list(range(8)), model, is_poison, is_fatal=is_fatal, confirm=True)
    assert model.attempts.count([5]) == 2
    assert [g for g, _ in found.failed] == [5]


async def test_a_good_group_spoiled_by_a_merged_crash_is_answered_on_its_confirm() -> None:
    # [4, 5] is spoiled (merged with someone else's crashing request); [4] too; alone again,
    # it is answered.
    class Spoiling(CrashingModel):
        async def __call__(self, groups: Sequence[int]) -> int:
            if len(self.attempts) + 1 in (4, 5):
                self.attempts.append(list(groups))
                raise Fatal("internal error (merged)")
            return await super().__call__(groups)

    model = Spoiling(set(), {6})
    found = await isolate(list(range(8)), model, is_poison, is_fatal=is_fatal, confirm=True)
    assert [g for g, _ in found.failed] == [6]
    assert sorted(g for part, _ in found.good for g in part) == [0, 1, 2, 3, 4, 5, 7]


async def test_without_is_fatal_a_fatal_error_propagates_as_before() -> None:
    model = CrashingModel(set(), {3})
    with pytest.raises(Fatal):
        await isolate(list(range(8)), model, is_poison)
    assert len(model.attempts) == 1
