"""The fixed-step LLM server's logic without a socket or a clock: the scheduler driven by explicit
``tick()`` calls (continuous batching, the waiting queue's limit, occupancy and queue-length
percentiles), the tick driver on a fake loop, the HTTP parser, and the API's answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.fixed_step_llm import (
    App,
    HttpConnection,
    HttpError,
    Job,
    Scheduler,
    ServerConfig,
    TickDriver,
    build_parser,
    histogram_percentile,
    parse_request,
)


def jobs(*tokens: int) -> list[Job]:
    return [Job(t) for t in tokens]


def run_until_idle(scheduler: Scheduler, limit: int = 10_000) -> list[list[Job]]:
    """Tick until nothing runs or waits; what finished at each tick."""
    finished: list[list[Job]] = []
    for _ in range(limit):
        if scheduler.idle():
            return finished
        finished.append(scheduler.tick())
    raise AssertionError("the scheduler never went idle")


# --- admission and finishing --------------------------------------------------------------------


def test_jobs_are_admitted_at_the_next_tick_fifo_into_free_slots() -> None:
    scheduler = Scheduler(slots=2, max_waiting=10)
    a, b, c, d = jobs(3, 3, 3, 3)
    assert scheduler.submit([a, b, c, d])
    assert (scheduler.running, scheduler.waiting) == (0, 4)  # nothing before a tick

    scheduler.tick()
    assert (a.admitted_tick, b.admitted_tick) == (1, 1)
    assert (c.admitted_tick, d.admitted_tick) == (-1, -1)
    assert (scheduler.running, scheduler.waiting) == (2, 2)

    finished = [scheduler.tick() for _ in range(3)]
    assert finished == [[], [], [a, b]]
    assert (c.admitted_tick, d.admitted_tick) == (4, 4)


def test_admission_is_in_arrival_order_one_slot_at_a_time() -> None:
    scheduler = Scheduler(slots=1, max_waiting=10)
    queued = jobs(1, 1, 1, 1, 1)
    for job in queued:
        assert scheduler.submit([job])
    order = [job for done in run_until_idle(scheduler) for job in done]
    assert order == queued
    assert [j.admitted_tick for j in queued] == [1, 2, 3, 4, 5]
    assert [j.finished_tick for j in queued] == [2, 3, 4, 5, 6]


def test_a_job_of_t_tokens_finishes_t_ticks_after_its_admission() -> None:
    scheduler = Scheduler(slots=4, max_waiting=0)
    short, long = jobs(1, 5)
    scheduler.submit([short, long])
    run_until_idle(scheduler)
    assert (short.admitted_tick, short.finished_tick) == (1, 2)
    assert (long.admitted_tick, long.finished_tick) == (1, 6)
    assert scheduler.tokens_total == 1 + 5


def test_a_finished_job_frees_its_slot_at_the_tick_for_a_waiting_one() -> None:
    scheduler = Scheduler(slots=2, max_waiting=2)
    short, long, waiting = jobs(2, 5, 4)
    scheduler.submit([short, long, waiting])
    assert scheduler.tick() == []  # tick 1: short and long admitted, waiting waits
    assert scheduler.tick() == []
    assert (scheduler.running, scheduler.waiting) == (2, 1)
    assert scheduler.tick() == [short]  # tick 3: short done, its slot goes to waiting
    assert waiting.admitted_tick == 3
    assert (scheduler.running, scheduler.waiting) == (2, 0)
    assert [j for done in run_until_idle(scheduler) for j in done] == [long, waiting]
    assert (long.finished_tick, waiting.finished_tick) == (6, 7)


def test_a_job_runs_at_least_one_tick() -> None:
    with pytest.raises(ValueError, match="at least one tick"):
        Job(0)


# --- the waiting queue's limit -------------------------------------------------------------------


def test_a_request_beyond_slots_plus_waiting_queue_is_rejected() -> None:
    scheduler = Scheduler(slots=2, max_waiting=3)
    for _ in range(5):
        assert scheduler.submit(jobs(10))
    assert not scheduler.submit(jobs(10))
    scheduler.tick()  # two admitted, three wait: the queue is full
    assert (scheduler.running, scheduler.waiting) == (2, 3)
    assert not scheduler.submit(jobs(10))
    assert scheduler.rejected_total == 2
    assert scheduler.stats().rejected == 2
    assert (scheduler.running, scheduler.waiting) == (2, 3)  # the rejected ones left no trace


def test_arrivals_waiting_for_a_free_slot_do_not_fill_the_queue() -> None:
    """Requests that arrived between ticks with slots free are not 'waiting beyond the slots':
    with no queue at all, the slots still take a burst of ``slots`` requests."""
    scheduler = Scheduler(slots=3, max_waiting=0)
    assert all(scheduler.submit(jobs(4)) for _ in range(3))
    assert not scheduler.submit(jobs(4))


def test_a_list_of_prompts_is_all_taken_or_all_rejected() -> None:
    scheduler = Scheduler(slots=2, max_waiting=1)
    assert scheduler.submit(jobs(2, 2))
    assert scheduler.room() == 1
    assert not scheduler.submit(jobs(2, 2))  # two do not fit into one place
    assert scheduler.waiting == 2
    assert scheduler.submit(jobs(2))


def test_room_comes_back_as_jobs_finish() -> None:
    scheduler = Scheduler(slots=1, max_waiting=1)
    assert scheduler.submit(jobs(1, 1))
    assert not scheduler.submit(jobs(1))
    scheduler.tick()  # first admitted, second waits
    assert not scheduler.submit(jobs(1))
    scheduler.tick()  # first done, second admitted
    assert scheduler.submit(jobs(1))


# --- occupancy ---------------------------------------------------------------------------------


def test_two_rounds_back_to_back_fill_every_slot() -> None:
    scheduler = Scheduler(slots=4, max_waiting=4)
    assert scheduler.submit(jobs(*[3] * 8))
    run_until_idle(scheduler)
    stats = scheduler.stats()
    assert stats.window_ticks == 6
    assert stats.occupied_slot_ticks == 8 * 3
    assert stats.occupancy == 1.0
    assert stats.served == 8


def test_occupancy_counts_empty_slots_and_idle_steps_inside_the_window() -> None:
    scheduler = Scheduler(slots=4, max_waiting=0)
    scheduler.submit(jobs(4))  # one slot of four for 4 steps
    run_until_idle(scheduler)
    assert scheduler.stats().occupancy == 0.25
    scheduler.skip_idle(4)  # the driver slept 4 ticks
    scheduler.submit(jobs(2, 2, 2, 2))  # all four for 2 steps
    run_until_idle(scheduler)
    stats = scheduler.stats()
    # window: the first admitted at tick 1 (done at 5), ticks 6-9 skipped, four admitted at
    # tick 10 and done at 12: 11 steps
    assert stats.window_ticks == 11
    assert stats.occupied_slot_ticks == 4 + 8
    assert stats.occupancy == pytest.approx(12 / 44)


def test_the_window_ignores_idle_ticks_before_the_first_admission_and_after_the_last_finish() -> (
    None
):
    scheduler = Scheduler(slots=2, max_waiting=0)
    for _ in range(5):
        scheduler.tick()
    scheduler.skip_idle(100)
    scheduler.submit(jobs(3, 3))
    run_until_idle(scheduler)
    for _ in range(7):
        scheduler.tick()
    stats = scheduler.stats()
    assert stats.ticks == 5 + 100 + 4 + 7
    assert (stats.window_ticks, stats.occupied_slot_ticks, stats.occupancy) == (3, 6, 1.0)


def test_no_occupancy_before_a_request_finished() -> None:
    scheduler = Scheduler(slots=2, max_waiting=0)
    assert scheduler.stats().occupancy is None
    scheduler.submit(jobs(5))
    scheduler.tick()
    scheduler.tick()
    stats = scheduler.stats()
    assert (stats.occupancy, stats.window_ticks, stats.running) == (None, 0, 1)


def test_reset_starts_the_stats_again_but_not_the_totals() -> None:
    scheduler = Scheduler(slots=2, max_waiting=0)
    scheduler.submit(jobs(2, 2))
    run_until_idle(scheduler)
    assert not scheduler.submit(jobs(1, 1, 1))
    scheduler.submit(jobs(4))
    scheduler.tick()  # admitted at tick 4: running across the reset
    scheduler.reset_stats()
    assert (scheduler.stats().served, scheduler.stats().rejected, scheduler.stats().ticks) == (
        0,
        0,
        0,
    )
    run_until_idle(scheduler)
    stats = scheduler.stats()
    # the running job opened the window at the reset; it finished 4 ticks after its admission
    assert (stats.window_ticks, stats.occupied_slot_ticks, stats.served) == (4, 4, 1)
    assert stats.occupancy == 0.5
    assert (scheduler.served_total, scheduler.rejected_total) == (3, 1)


def test_skipping_ticks_with_a_job_running_is_a_bug() -> None:
    scheduler = Scheduler(slots=1, max_waiting=0)
    scheduler.submit(jobs(3))
    scheduler.tick()
    with pytest.raises(RuntimeError, match="running"):
        scheduler.skip_idle(1)


# --- the waiting queue's length ------------------------------------------------------------------


def test_queue_length_is_sampled_after_each_ticks_admissions_within_the_window() -> None:
    scheduler = Scheduler(slots=1, max_waiting=10)
    scheduler.tick()  # before the window: not sampled
    scheduler.submit(jobs(1, 1, 1, 1, 1))
    run_until_idle(scheduler)
    stats = scheduler.stats()
    assert stats.window_ticks == 5
    assert stats.waiting_histogram == {4: 1, 3: 1, 2: 1, 1: 1, 0: 1}
    assert (stats.waiting_percentile(50), stats.waiting_percentile(90)) == (2, 4)
    assert stats.waiting_max == 4


def test_queue_percentiles_over_a_long_run_match_numpy() -> None:
    """Random arrivals against 3 slots: the queue's length after each tick, recorded here, over
    the window's steps (from the first admission, tick 1, to the last finish), against the
    histogram's nearest-rank percentiles (numpy's inverted_cdf)."""
    rng = np.random.default_rng(7)
    scheduler = Scheduler(slots=3, max_waiting=20)
    scheduler.submit(jobs(3))
    after_tick: list[int] = []
    for _ in range(2000):
        scheduler.tick()
        after_tick.append(scheduler.waiting)
        for _ in range(int(rng.poisson(0.9))):
            scheduler.submit(jobs(int(rng.integers(1, 6))))
    while not scheduler.idle():
        scheduler.tick()
        after_tick.append(scheduler.waiting)
    window = after_tick[:-1]  # ticks 1 .. last finish - 1: one sample per step of the window
    stats = scheduler.stats()
    assert stats.window_ticks == len(window) == sum(stats.waiting_histogram.values())
    for percent in (50, 90, 99):
        expected = int(np.percentile(window, percent, method="inverted_cdf"))
        assert stats.waiting_percentile(percent) == expected
    assert stats.waiting_max == max(window) > 3  # the queue did build up
    assert stats.rejected == scheduler.rejected_total


@pytest.mark.parametrize("seed", range(5))
def test_histogram_percentile_is_nearest_rank(seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = rng.integers(0, 30, size=int(rng.integers(1, 500)))
    values, counts = np.unique(samples, return_counts=True)
    histogram = {int(v): int(c) for v, c in zip(values, counts, strict=True)}
    for percent in (0, 1, 25, 50, 90, 99, 99.9, 100):
        expected = int(np.percentile(samples, percent, method="inverted_cdf"))
        assert histogram_percentile(histogram, percent) == expected, percent


def test_percentile_of_nothing_is_zero() -> None:
    assert histogram_percentile({}, 99) == 0
    assert histogram_percentile({5: 100}, 50) == 5


# --- the tick driver on a fake loop ---------------------------------------------------------------


class FakeLoop:
    """``time()`` reads ``now``; ``call_at`` records timers; ``run_until(t)`` fires them in
    order, with ``now`` at each timer's time plus ``late``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now
        self.late = 0.0
        self.timers: list[tuple[float, Callable[[], object]]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> object:
        self.timers.append((when, callback))
        return None

    def run_until(self, until: float) -> None:
        while self.timers:
            self.timers.sort(key=lambda timer: timer[0])
            when, callback = self.timers[0]
            if when > until:
                break
            self.timers.pop(0)
            self.now = max(self.now, when + self.late)
            callback()
        self.now = max(self.now, until)


def test_the_driver_sleeps_while_idle_and_ticks_on_its_grid_when_work_arrives() -> None:
    loop = FakeLoop(now=100.0)
    scheduler = Scheduler(slots=2, max_waiting=0)
    driver = TickDriver(scheduler, 0.010, loop)
    assert loop.timers == []  # idle: no timer
    loop.now = 100.0253  # between grid points 2 and 3
    done: list[float] = []
    assert driver.submit([Job(3, lambda job: done.append(loop.now))])
    [(when, _)] = loop.timers
    assert when == pytest.approx(100.030)  # the next grid point
    assert scheduler.tick_index == 2  # ticks 1 and 2 skipped as idle
    loop.run_until(101.0)
    assert done == [pytest.approx(100.060)]  # admitted at 100.030, 3 steps of 10 ms
    assert loop.timers == []  # idle again: no more timers
    assert scheduler.tick_index == 6


def test_a_late_driver_catches_up_on_its_grid() -> None:
    loop = FakeLoop(now=0.0)
    scheduler = Scheduler(slots=1, max_waiting=0)
    driver = TickDriver(scheduler, 0.001, loop)
    loop.late = 0.0035  # every timer fires 3.5 steps late
    finished: list[int] = []
    driver.submit([Job(10, lambda job: finished.append(job.finished_tick))])
    loop.run_until(1.0)
    assert finished == [scheduler.tick_index]
    assert scheduler.tick_index == 11  # admitted at tick 1 + 10 steps: no tick lost
    assert driver.late_ticks > 0
    assert driver.lag_max_s == pytest.approx(0.0035, abs=1e-4)
    assert driver.dropped_ticks == 0


def test_a_driver_more_than_a_second_behind_drops_the_missed_ticks() -> None:
    loop = FakeLoop(now=0.0)
    scheduler = Scheduler(slots=1, max_waiting=0)
    driver = TickDriver(scheduler, 0.010, loop)
    driver.submit(jobs(2))
    loop.late = 5.0
    loop.run_until(100.0)
    assert driver.dropped_ticks >= 400
    assert scheduler.idle()


def test_idle_time_before_a_reset_is_not_counted_after_it() -> None:
    loop = FakeLoop(now=0.0)
    scheduler = Scheduler(slots=1, max_waiting=0)
    driver = TickDriver(scheduler, 0.010, loop)
    driver.submit(jobs(2))
    loop.run_until(10.0)  # done at 0.03, then asleep for ~10 s
    driver.settle()
    scheduler.reset_stats()
    loop.now += 0.0501
    driver.settle()
    assert scheduler.stats().ticks == 5
    driver.submit(jobs(1))
    loop.run_until(11.0)
    assert scheduler.stats().ticks == 7  # 5 idle, then admitted at one tick, done at the next


# --- HTTP parsing --------------------------------------------------------------------------------


def test_parse_pipelined_requests_one_at_a_time() -> None:
    first = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
    second = b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
    buffer = bytearray(first + second)
    parsed = parse_request(buffer)
    assert parsed is not None
    request, size = parsed
    assert (request.method, request.target, request.body, request.keep_alive) == (
        "POST",
        "/v1/completions",
        b"{}",
        True,
    )
    assert size == len(first)
    del buffer[:size]
    parsed = parse_request(buffer)
    assert parsed is not None
    assert (parsed[0].target, parsed[0].keep_alive, parsed[1]) == ("/health", False, len(second))


def test_parse_waits_for_the_whole_body() -> None:
    buffer = bytearray(b"POST /x HTTP/1.1\r\nContent-Length: 10\r\n\r\n12345")
    assert parse_request(buffer) is None
    buffer += b"67890"
    parsed = parse_request(buffer)
    assert parsed is not None
    assert parsed[0].body == b"1234567890"
    assert parse_request(bytearray(b"GET / HTTP/1.1\r\nHost")) is None


def test_http_1_0_closes_unless_asked_to_keep_alive() -> None:
    closed = parse_request(bytearray(b"GET / HTTP/1.0\r\n\r\n"))
    kept = parse_request(bytearray(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
    assert closed is not None and not closed[0].keep_alive
    assert kept is not None and kept[0].keep_alive


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", 411),
        (b"POST /x HTTP/1.1\r\nContent-Length: ten\r\n\r\n", 400),
        (b"NONSENSE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"X: " + b"y" * 70_000, 431),
    ],
)
def test_bad_requests(raw: bytes, status: int) -> None:
    with pytest.raises(HttpError) as error:
        parse_request(bytearray(raw))
    assert error.value.status == status


# --- the API, answered through a fake loop -------------------------------------------------------


Answer = tuple[int, bytes, bytes, bytes]


class Harness:
    def __init__(self, slots: int = 2, max_waiting: int = 1, tokens: int = 4) -> None:
        self.loop = FakeLoop(now=0.0)
        config = ServerConfig(slots=slots, step_ms=10.0, max_waiting=max_waiting, tokens=tokens)
        self.scheduler = Scheduler(slots, max_waiting)
        self.app = App(config, TickDriver(self.scheduler, 0.010, self.loop))
        self.answers: list[Answer] = []

    def call(self, method: str, path: str, body: object = None) -> None:
        raw = b"" if body is None else orjson.dumps(body)
        self.app.handle(method, path, raw, lambda *answer: self.answers.append(answer))

    def json(self, index: int = -1) -> dict[str, object]:
        loaded = orjson.loads(self.answers[index][1])
        assert isinstance(loaded, dict)
        return loaded


def test_chat_answers_after_its_tokens_in_the_openai_shape() -> None:
    h = Harness(tokens=16)
    h.call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "a" * 9}]})
    h.loop.run_until(0.040)  # admitted at 0.010, 3 of 16 tokens by 0.040
    assert h.answers == []
    h.loop.run_until(1.0)
    status, _, content_type, _ = h.answers[0]
    assert (status, content_type) == (200, b"application/json")
    answer = h.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "x" * 16},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert answer["usage"] == {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19}


def test_max_tokens_is_capped_by_the_servers_tokens() -> None:
    h = Harness(tokens=4)
    h.call("POST", "/v1/completions", {"prompt": "p", "max_tokens": 2})
    h.call("POST", "/v1/completions", {"prompt": "p", "max_tokens": 50})
    h.loop.run_until(1.0)
    texts = [orjson.loads(a[1])["choices"][0]["text"] for a in h.answers]
    assert texts == ["xx", "xxxx"]


def test_a_list_of_prompts_is_one_request_each_answered_together() -> None:
    h = Harness(slots=2, max_waiting=1, tokens=2)
    h.call("POST", "/v1/completions", {"prompt": ["abcd", "abcdefgh", "ab"]})
    h.loop.run_until(0.035)  # two ran in the slots, the third waits for one
    assert h.answers == []
    h.loop.run_until(1.0)
    answer = h.json()
    choices = answer["choices"]
    assert isinstance(choices, list)
    assert [(c["index"], c["text"]) for c in choices] == [(0, "xx"), (1, "xx"), (2, "xx")]
    assert answer["usage"] == {
        "prompt_tokens": 2 + 3 + 1,
        "completion_tokens": 6,
        "total_tokens": 12,
    }
    assert h.scheduler.served_total == 3


def test_a_full_queue_answers_429_with_retry_after() -> None:
    h = Harness(slots=1, max_waiting=1)
    for _ in range(3):
        h.call("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "q"}]})
    status, body, _, headers = h.answers[0]  # the third, at once
    assert (status, headers) == (429, b"Retry-After: 1\r\n")
    error = orjson.loads(body)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    h.loop.run_until(1.0)
    assert [a[0] for a in h.answers] == [429, 200, 200]


def test_embeddings_take_one_tick_and_are_deterministic() -> None:
    h = Harness(slots=4)
    h.call("POST", "/v1/embeddings", {"input": ["a", "b", "a"]})
    h.loop.run_until(0.0101)  # admitted at the first tick
    assert h.answers == []
    h.loop.run_until(0.0201)
    data = h.json()["data"]
    assert isinstance(data, list)
    vectors = [np.array(d["embedding"]) for d in data]
    assert [len(v) for v in vectors] == [8, 8, 8]
    assert np.allclose(vectors[0], vectors[2]) and not np.allclose(vectors[0], vectors[1])
    assert np.linalg.norm(vectors[0]) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/chat/completions", {"model": "other", "messages": [{"content": "x"}]}, 404),
        ("POST", "/v1/chat/completions", {"messages": []}, 400),
        ("POST", "/v1/chat/completions", {"messages": [{"content": "x"}], "stream": True}, 400),
        ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
        ("POST", "/v1/completions", {"prompt": []}, 400),
        ("POST", "/v1/completions", [1, 2], 400),
        ("GET", "/v1/chat/completions", None, 405),
        ("GET", "/v2/nothing", None, 404),
    ],
)
def test_errors_have_the_openai_shape(method: str, path: str, body: object, status: int) -> None:
    h = Harness()
    h.call(method, path, body)
    assert h.answers[0][0] == status
    error = h.json()["error"]
    assert isinstance(error, dict) and error["message"]
    assert h.scheduler.idle()


def test_metrics_parse_with_vllms_names() -> None:
    h = Harness(slots=1, max_waiting=1, tokens=3)
    for _ in range(3):
        h.call("POST", "/v1/completions", {"prompt": "x"})
    h.loop.run_until(0.015)  # one running, one waiting, one rejected
    h.call("GET", "/metrics")
    assert h.answers[-1][2].startswith(b"text/plain; version=0.0.4")
    samples = {
        (s.name, s.labels.get("model_name")): s.value
        for family in text_string_to_metric_families(h.answers[-1][1].decode())
        for s in family.samples
    }
    assert samples[("vllm:num_requests_running", "fixed-step")] == 1
    assert samples[("vllm:num_requests_waiting", "fixed-step")] == 1
    assert samples[("vllm:request_success_total", "fixed-step")] == 0
    assert samples[("rowbatch_fixed_step_rejected_total", "fixed-step")] == 1


def test_stats_report_occupancy_queue_and_counts_and_reset() -> None:
    h = Harness(slots=2, max_waiting=2, tokens=2)
    for _ in range(4):
        h.call("POST", "/v1/completions", {"prompt": "x"})
    h.loop.run_until(1.0)
    h.call("GET", "/stats")
    stats = h.json()
    assert stats["occupancy"] == 1.0
    assert (stats["window_ticks"], stats["occupied_slot_ticks"]) == (4, 8)
    assert stats["waiting_queue"] == {"p50": 0, "p90": 2, "p99": 2, "max": 2, "samples": 4}
    assert (stats["requests_served"], stats["http_served"], stats["rejected"]) == (4, 4, 0)
    h.call("POST", "/stats/reset")
    h.call("GET", "/stats")
    stats = h.json()
    assert (stats["ticks"], stats["requests_served"], stats["occupancy"]) == (0, 0, None)


class FakeTransport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def connect(h: Harness) -> tuple[HttpConnection, FakeTransport]:
    connection = HttpConnection(h.app)
    transport = FakeTransport()
    connection.connection_made(cast(asyncio.Transport, transport))
    return connection, transport


def test_pipelined_requests_are_answered_in_order_one_at_a_time() -> None:
    h = Harness(slots=4, tokens=3)
    connection, transport = connect(h)
    body = b'{"prompt": "p", "max_tokens": 2}'
    slow = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    connection.data_received(slow + slow[:30])
    connection.data_received(slow[30:] + b"GET /health HTTP/1.1\r\n\r\n")
    assert transport.written == b""  # the first waits for its ticks; the rest wait for it
    assert h.scheduler.waiting == 1
    h.loop.run_until(1.0)
    answers = bytes(transport.written).split(b"HTTP/1.1 ")[1:]
    assert [a[:3] for a in answers] == [b"200", b"200", b"200"]
    assert b"cmpl-1" in answers[0] and b"cmpl-2" in answers[1]
    assert answers[2].endswith(b"Content-Length: 0\r\n\r\n")
    assert not transport.closed


def test_a_half_closed_connection_gets_its_answers_then_closes() -> None:
    h = Harness(slots=4, tokens=3)
    connection, transport = connect(h)
    body = b'{"prompt": "p"}'
    connection.data_received(
        b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    assert connection.eof_received()  # keep the transport open for the answer
    h.loop.run_until(1.0)
    assert transport.written.startswith(b"HTTP/1.1 200 OK")
    assert transport.closed


def test_a_bad_request_is_answered_and_the_connection_closed() -> None:
    h = Harness()
    connection, transport = connect(h)
    connection.data_received(b"POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 411 Length Required")
    assert b"Connection: close\r\n" in transport.written
    assert transport.closed


def test_models_and_health() -> None:
    h = Harness()
    h.call("GET", "/v1/models")
    data = h.json()["data"]
    assert isinstance(data, list) and data[0]["id"] == "fixed-step"
    h.call("GET", "/health")
    assert h.answers[-1][0] == 200


def test_the_command_line() -> None:
    args = build_parser().parse_args(
        ["--port", "1", "--slots", "4", "--step-ms", "2.5", "--max-waiting", "0"]
    )
    assert (args.slots, args.step_ms, args.max_waiting, args.tokens, args.model, args.dim) == (
        4,
        2.5,
        0,
        16,
        "fixed-step",
        8,
    )
