"""The concurrency window of one endpoint: halved by an overload once per cooldown, grown back
by one per window's worth of answers up to where it started; moved by the server's queue
within its ceiling. Time is the ``now`` the caller passes."""

from __future__ import annotations

import random

import pytest

from rowbatch.consumer.model.openai.server_queue import QueueReading, read_queue
from rowbatch.consumer.model.window import Window


class Calls:
    def __init__(self) -> None:
        self.limits: list[int] = []
        self.rooms = 0

    def change(self, limit: int) -> None:
        self.limits.append(limit)

    def room(self) -> None:
        self.rooms += 1


class AlwaysLow(random.Random):
    """Draws 0.0: a share of a step rounds up, and a window with a share grows every
    reading (as if it read the queue alone); the random rounding is tested in
    test_admission.py."""

    def random(self) -> float:
        return 0.0


def window(initial: int = 8, ceiling: int = 16, **kwargs: float) -> tuple[Window, Calls]:
    calls = Calls()
    w = Window(
        initial, ceiling, on_change=calls.change, on_room=calls.room, rng=AlwaysLow(), **kwargs
    )
    return w, calls


def fill(w: Window) -> None:
    while w.in_use < w.limit:
        w.take()


@pytest.mark.parametrize(("initial", "ceiling"), [(0, 4), (5, 4), (-1, 1)])
def test_initial_must_be_between_one_and_the_ceiling(initial: int, ceiling: int) -> None:
    with pytest.raises(ValueError, match="1 <= initial <= ceiling"):
        Window(initial, ceiling)


def test_starts_at_initial_and_reports_it() -> None:
    w, calls = window(8, 16)
    assert (w.limit, w.in_use, w.free) == (8, 0, 8)
    assert calls.limits == [8]
    assert calls.rooms == 0


def test_take_and_give_count_places_and_giving_wakes_waiters() -> None:
    w, calls = window(2, 4)
    w.take()
    w.take()
    assert (w.in_use, w.free) == (2, 0)
    w.take()  # the pool only takes with room; free never goes below zero
    assert w.free == 0
    w.give()
    w.give()
    assert (w.in_use, w.free) == (1, 1)
    assert calls.rooms == 2


def test_an_overload_halves_once_per_cooldown() -> None:
    w, calls = window(8, 16, cooldown_s=1.0)
    w.overloaded(100.0)
    assert w.limit == 4
    # The same overload answers many requests at once: one cut.
    w.overloaded(100.0)
    w.overloaded(100.5)
    w.overloaded(100.999)
    assert w.limit == 4
    w.overloaded(101.0)
    assert w.limit == 2
    w.overloaded(101.5)
    assert w.limit == 2
    w.overloaded(102.0)
    assert w.limit == 1
    assert calls.limits == [8, 4, 2, 1]
    assert calls.rooms == 0  # shrinking makes no room


def test_the_limit_never_goes_below_one() -> None:
    w, calls = window(3, 3, cooldown_s=1.0)
    for now in range(10):
        w.overloaded(float(now))
    assert w.limit == 1
    assert calls.limits == [3, 1]  # 3 // 2 = 1, then unchanged (no repeated reports)


def test_the_first_overload_cuts_whatever_the_clock_reads() -> None:
    w, _ = window(8, 16, cooldown_s=5.0)
    w.overloaded(0.0)
    assert w.limit == 4


def test_answers_grow_it_back_by_one_per_windows_worth_up_to_initial() -> None:
    w, calls = window(8, 16, cooldown_s=1.0)
    w.overloaded(0.0)
    w.overloaded(1.0)
    assert w.limit == 2
    rooms = calls.rooms
    # 2 answers -> 3; 3 more -> 4; ... each step needs a window's worth.
    steps = []
    for _ in range(2 + 3 + 4 + 5 + 6 + 7):
        w.answered()
        steps.append(w.limit)
    assert steps[1] == 3
    assert steps[2 + 3 - 1] == 4
    assert steps[2 + 3 + 4 - 1] == 5
    assert steps[-2] == 7
    assert steps[-1] == 8
    assert steps == sorted(steps)
    assert calls.limits == [8, 4, 2, 3, 4, 5, 6, 7, 8]
    assert calls.rooms == rooms + 6  # every growth wakes waiting requests
    # Back at initial: answers grow it no further.
    for _ in range(100):
        w.answered()
    assert w.limit == 8


def test_one_answer_short_of_a_windows_worth_does_not_grow() -> None:
    w, _ = window(8, 16)
    w.overloaded(0.0)
    assert w.limit == 4
    for _ in range(3):
        w.answered()
    assert w.limit == 4
    w.answered()
    assert w.limit == 5


def test_an_overload_restarts_the_count_of_answers() -> None:
    w, _ = window(8, 16, cooldown_s=1.0)
    w.overloaded(0.0)  # 4
    for _ in range(3):
        w.answered()
    w.overloaded(1.0)  # 2, count restarted
    w.answered()
    assert w.limit == 2
    w.answered()
    assert w.limit == 3


def test_answers_at_initial_do_nothing() -> None:
    w, calls = window(8, 16)
    for _ in range(50):
        w.answered()
    assert w.limit == 8
    assert calls.limits == [8]


# --- the server's queue -------------------------------------------------------------------------


def grow(w: Window, readings: int, now: float = 10.0) -> list[int]:
    """The limit after each of ``readings`` readings of an empty queue with the window full."""
    limits = []
    for _ in range(readings):
        fill(w)
        w.server_queue(waiting=0, running=w.in_use, now=now)
        limits.append(w.limit)
    return limits


def test_an_empty_queue_with_every_place_taken_grows_it_slow_start() -> None:
    # One place, then doubling, each step at most a quarter of the limit.
    w, calls = window(32, 1000)
    rooms = calls.rooms
    assert grow(w, 6) == [33, 35, 39, 47, 58, 72]
    assert calls.limits == [32, 33, 35, 39, 47, 58, 72]
    assert calls.rooms == rooms + 6  # every growth wakes waiting requests


def test_a_small_window_grows_by_one_a_reading() -> None:
    w, _ = window(2, 10)
    assert grow(w, 4) == [3, 4, 5, 6]


def test_after_a_cut_it_grows_one_place_a_reading() -> None:
    w, _ = window(32, 1000, cooldown_s=1.0)
    assert grow(w, 4) == [33, 35, 39, 47]  # slow start while nothing was ever cut
    w.overloaded(20.0)
    assert w.limit == 23
    assert grow(w, 2, now=21.0) == [24, 25]
    # A shrink for the server's queue ends the slow start too.
    w2, _ = window(32, 1000)
    fill(w2)
    w2.server_queue(waiting=4, running=32, now=0.0)  # 4 queued beyond the slots, 3 too many
    assert w2.limit == 29
    while w2.in_use > w2.limit:  # the cut takes effect as answers come back
        w2.give()
    for _ in range(5):  # the queue's average falls: 2.8, 1.96, 1.37 (held), 0.96, 0.67
        w2.server_queue(waiting=0, running=29, now=0.0)
    before = w2.limit
    assert before <= 29
    assert grow(w2, 1, now=0.5) == [before]  # not within cooldown_s of the cut
    assert grow(w2, 2, now=1.0) == [before + 1, before + 2]  # then one place a reading


def test_no_growth_while_a_place_is_free() -> None:
    w, calls = window(8, 100)
    for _ in range(7):
        w.take()
    w.server_queue(waiting=0, running=7, now=10.0)
    assert w.limit == 8
    assert calls.limits == [8]


def test_within_half_a_request_of_the_target_queue_it_holds() -> None:
    w, calls = window(8, 100)
    fill(w)
    for waiting in (1.0, 0.6, 1.4):  # the average of 1.0, 0.88, 1.04: within target +- 0.5
        w.server_queue(waiting=waiting, running=8, now=10.0)
    assert calls.limits == [8]


def test_no_growth_within_the_cooldown_of_an_overload() -> None:
    w, _ = window(8, 100, cooldown_s=1.0)
    w.overloaded(10.0)
    assert w.limit == 4
    fill(w)
    w.server_queue(waiting=0, running=4, now=10.5)
    assert w.limit == 4
    w.server_queue(waiting=0, running=4, now=11.0)
    assert w.limit == 5


def test_growth_stops_at_the_ceiling() -> None:
    w, calls = window(32, 40)
    assert grow(w, 5) == [33, 35, 39, 40, 40]
    assert calls.limits == [32, 33, 35, 39, 40]


def test_shrinks_by_this_windows_share_of_the_excess_waiting() -> None:
    w, calls = window(16, 32, target_waiting=1.0)
    for _ in range(8):
        w.take()
    # 5 waiting, 1 of them welcome: 4 too many; this window holds 8 of the 15 at the server.
    w.server_queue(waiting=5, running=10, now=0.0)
    assert w.limit == 16 - 3  # ceil(4 * 8 / 15) = ceil(2.13)
    assert calls.limits == [16, 13]


def test_the_default_target_lets_one_wait() -> None:
    w, _ = window(16, 32)
    for _ in range(8):
        w.take()
    w.server_queue(waiting=5, running=10, now=0.0)
    assert w.limit == 16 - 3  # ceil(4 * 8 / 15) = ceil(2.13)


def test_alone_at_the_server_it_gives_back_all_the_excess() -> None:
    w, _ = window(16, 32, target_waiting=1.0)
    fill(w)
    w.server_queue(waiting=6, running=10, now=0.0)
    assert w.limit == 16 - 5


def test_a_share_never_exceeds_the_excess() -> None:
    w, _ = window(16, 32, target_waiting=1.0)
    fill(w)
    w.server_queue(waiting=3, running=1, now=0.0)  # in_use 16 > load 4: share capped at 1
    assert w.limit == 16 - 2


def test_nothing_in_flight_gives_nothing_back() -> None:
    w, calls = window(8, 16)
    w.server_queue(waiting=50, running=20, now=0.0)
    assert w.limit == 8
    assert calls.limits == [8]


def test_shrinking_stops_at_one() -> None:
    w, _ = window(4, 8)
    fill(w)
    w.server_queue(waiting=100, running=0, now=0.0)
    assert w.limit == 1
    assert w.free == 0


def test_a_custom_target_waiting_and_the_moving_average() -> None:
    w, _ = window(8, 16, target_waiting=4.0)
    fill(w)
    w.server_queue(waiting=4, running=8, now=0.0)
    assert w.limit == 8
    w.server_queue(waiting=6, running=8, now=0.0)  # average 4.6: inside the band (4 +- 1)
    assert w.limit == 8
    w.server_queue(waiting=9, running=8, now=0.0)  # average 4.6 + 0.3 x 4.4 = 5.92: above 5
    assert w.limit == 8 - 1  # ceil(1.92 * 8 / 17) = ceil(0.9)


def test_no_second_cut_before_the_first_took_effect() -> None:
    w, _ = window(16, 32)
    fill(w)
    w.server_queue(waiting=10, running=16, now=0.0)
    assert w.limit == 10  # ceil(9 * 16 / 26) = ceil(5.54): 6 given back
    w.server_queue(waiting=10, running=16, now=0.25)  # 16 still in flight: wait for them
    assert w.limit == 10
    while w.in_use > w.limit:
        w.give()
    w.server_queue(waiting=10, running=16, now=0.5)  # within cooldown_s: may be stale
    assert w.limit == 10
    w.server_queue(waiting=10, running=16, now=1.0)
    assert w.limit < 10


def test_the_queue_can_grow_it_beyond_initial_and_answers_leave_it_there() -> None:
    w, _ = window(4, 16)
    assert grow(w, 1) == [5]
    for _ in range(20):
        w.answered()
    assert w.limit == 5


# --- once the server's slots are known ----------------------------------------------------------


def test_the_most_seen_running_is_the_servers_slots() -> None:
    w, _ = window(8, 100)
    fill(w)
    assert w.slots == 0
    w.server_queue(waiting=1, running=10, now=0.0)
    w.server_queue(waiting=1, running=9, now=0.0)
    assert w.slots == 10
    w.server_queue(waiting=1, running=12, now=0.0)  # a server never runs more than its slots
    assert w.slots == 12


def test_a_cohort_replaced_at_once_is_no_queue() -> None:
    # Requests that started together finish together: at the server's step after, most of its
    # slots are free and their replacements all show as waiting until the next step takes them.
    w, calls = window(32, 64)
    fill(w)
    w.server_queue(waiting=1, running=32, now=0.0)  # 32 slots
    w.server_queue(waiting=19, running=3, now=0.25)  # 19 waiting, 29 slots free: none queued
    assert calls.limits == [32]


def test_growth_stops_at_the_ceiling_after_a_cut_too() -> None:
    w, _ = window(8, 10)
    w.overloaded(0.0)
    assert grow(w, 10, now=5.0)[-1] == 10


# --- the server's metrics, as the window reads them ---------------------------------------------

VLLM = """\
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="llm"} 3.0
vllm:num_requests_waiting{model_name="other"} 40.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="llm"} 16.0
vllm:num_requests_running{model_name="other"} 1.0
"""


def test_read_queue_takes_the_models_samples() -> None:
    assert read_queue(VLLM, "llm") == QueueReading(3.0, 16.0)
    assert read_queue(VLLM, "other") == QueueReading(40.0, 1.0)
    # A model the labels do not name: the server's totals.
    assert read_queue(VLLM, "unnamed") == QueueReading(43.0, 17.0)


def test_read_queue_knows_sglang_and_llama_cpp() -> None:
    sglang = "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs 2\n"
    sglang += "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 7\n"
    assert read_queue(sglang, "m") == QueueReading(2.0, 7.0)
    llama = "llamacpp:requests_deferred 1\nllamacpp:requests_processing 4\n"
    assert read_queue(llama, "m") == QueueReading(1.0, 4.0)


def test_read_queue_of_a_page_without_queue_metrics_is_none() -> None:
    assert read_queue("# TYPE up gauge\nup 1\n", "m") is None
    assert read_queue("", "m") is None
