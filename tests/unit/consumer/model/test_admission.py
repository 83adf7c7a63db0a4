"""Admission from the server's own queue (issue 48): Triton's statistics read as a queue, one
endpoint's window following it in the balancer, and several consumers sharing one server
converging on its slots plus the target without a coordinator, reconverging when one joins or
leaves. The server here is a fluid model on an injected clock: ``slots`` requests run, the rest
wait, and its statistics accumulate queue and compute time exactly as Triton's do."""

from __future__ import annotations

import asyncio
import random
from dataclasses import astuple, dataclass, field
from typing import Any

import pytest

from rowbatch.consumer.model.admission import AdmissionSettings, QueueFollower
from rowbatch.consumer.model.balancer import UNREAD_RESET, Balancer
from rowbatch.consumer.model.server_stats import QueueReading, QueueTotals, queue_totals
from rowbatch.consumer.model.window import Window
from rowbatch.timing import Clocks
from tests.unit.consumer.model.test_balancer import (
    NO_JITTER,
    SPEC,
    FakeServer,
    FakeTime,
    RecordingMeter,
    settle,
)

# --- Triton's statistics ------------------------------------------------------------------------

STATS: dict[str, Any] = {
    "model_stats": [
        {
            "name": "m",
            "version": "1",
            "inference_stats": {
                "queue": {"count": "10", "ns": "5000000000"},
                "compute_input": {"count": "10", "ns": "1000"},
                "compute_infer": {"count": "10", "ns": "2000000000"},
                "compute_output": {},
            },
        },
        {"name": "m", "version": "2", "inference_stats": {"queue": {"count": "2", "ns": "7"}}},
        {"name": "other", "inference_stats": {"queue": {"count": "99", "ns": "99"}}},
    ]
}


def test_totals_sum_the_versions_of_the_model_and_skip_zeros_left_out() -> None:
    totals = queue_totals(STATS, "m", 3.0)
    assert totals == QueueTotals(3.0, 12, 5_000_000_007, 2_000_001_000)
    assert queue_totals(STATS, "absent", 3.0) is None


def test_a_reading_is_the_mean_queue_and_compute_by_littles_law() -> None:
    before = QueueTotals(0.0, 0, 0, 0)
    after = QueueTotals(2.0, 10, 6_000_000_000, 4_000_000_000)
    reading = QueueReading.between(before, after)
    assert reading is not None
    assert (reading.waiting, reading.running) == (3.0, 2.0)
    assert reading.queue_s == pytest.approx(0.6)  # 6 s of waiting over 10 requests
    # A restarted server's counters start over: no reading spans it.
    assert QueueReading.between(after, QueueTotals(3.0, 1, 1, 1)) is None
    assert QueueReading.between(after, after) is None


# --- a server several consumers share -----------------------------------------------------------


@dataclass
class FluidServer:
    """``slots`` requests run at once, each for ``service_s``; the rest wait in its queue."""

    slots: int
    service_s: float = 0.01
    at: float = 0.0
    requests: float = 0.0
    queue_ns: float = 0.0
    compute_ns: float = 0.0

    def run(self, in_flight: int, seconds: float) -> None:
        running = min(in_flight, self.slots)
        waiting = in_flight - running
        self.at += seconds
        self.requests += running * seconds / self.service_s
        self.queue_ns += waiting * seconds * 1e9
        self.compute_ns += running * seconds * 1e9

    def totals(self) -> QueueTotals:
        return QueueTotals(self.at, int(self.requests), int(self.queue_ns), int(self.compute_ns))


@dataclass
class Consumer:
    """One replica's window on the shared server, always with work to send."""

    ceiling: int
    seed: int = 0
    window: Window = field(init=False)
    follower: QueueFollower = field(init=False)

    def __post_init__(self) -> None:
        self.window = Window(self.ceiling, self.ceiling, rng=random.Random(self.seed))
        self.window.in_use = self.window.limit
        self.follower = QueueFollower(self.window, RecordingMeter())


def step(server: FluidServer, consumers: list[Consumer], interval_s: float = 0.5) -> int:
    """One reading interval: every consumer fills its window, the server runs, each reads."""
    for c in consumers:
        c.window.in_use = c.window.limit
    total = sum(c.window.limit for c in consumers)
    server.run(total, interval_s)
    for c in consumers:
        c.follower.totals(server.totals())
        c.window.in_use = min(c.window.in_use, c.window.limit)
    return sum(c.window.limit for c in consumers)


def run_for(server: FluidServer, consumers: list[Consumer], readings: int) -> list[int]:
    return [step(server, consumers) for _ in range(readings)]


SLOTS = 4
TARGET = SLOTS  # target_queue_ratio 1.0: one execution's worth waiting per slot


def test_three_consumers_settle_at_the_slots_plus_the_target_without_oscillating() -> None:
    server = FluidServer(SLOTS)
    consumers = [Consumer(ceiling=8, seed=i) for i in range(3)]  # fixed: 24 in flight
    sums = run_for(server, consumers, 60)
    settled = sums[-20:]
    assert max(settled) - min(settled) <= 2  # no oscillation
    assert min(settled) >= SLOTS + TARGET - 2 and max(settled) <= SLOTS + TARGET + 2
    shares = [c.window.limit for c in consumers]
    assert max(shares) - min(shares) <= 2  # each its share, no coordinator
    assert all(c.window.saturated for c in consumers)  # the server is the bottleneck


def test_readings_that_lag_a_step_still_settle_without_lockstep() -> None:
    """Triton counts a request's queue time once it ran, so a reading tells of the interval
    before: the windows still settle (each consumer's share of a step is rounded at random,
    so three that read the same queue at once do not all step together)."""
    server = FluidServer(2, service_s=0.08)
    consumers = [Consumer(ceiling=4, seed=i) for i in range(3)]
    late: list[QueueTotals] = []
    sums = []
    for _ in range(120):
        for c in consumers:
            c.window.in_use = c.window.limit
        total = sum(c.window.limit for c in consumers)
        server.run(total, 0.25)
        late.append(server.totals())
        if len(late) > 1:
            told = late.pop(0)
            for c in consumers:
                c.follower.totals(QueueTotals(server.at, *astuple(told)[1:]))
        sums.append(total)
    assert sum(sums[-80:]) / 80 <= 2 + 2 + 1  # slots + target, give or take a place
    assert max(sums[-80:]) - min(sums[-80:]) <= 2


def test_the_fixed_window_keeps_the_whole_excess_in_the_servers_queue() -> None:
    """The contrast: without the readings, 3 x 8 in flight on 4 slots wait 20 deep."""
    server = FluidServer(SLOTS)
    server.run(3 * 8, 1.0)
    assert server.queue_ns / 1e9 == pytest.approx(20.0)  # 20 requests waiting for 1 s


def test_a_consumer_that_joins_gets_its_share_and_one_that_leaves_frees_it() -> None:
    server = FluidServer(SLOTS)
    consumers = [Consumer(ceiling=8, seed=i) for i in range(2)]
    run_for(server, consumers, 60)
    before = sum(c.window.limit for c in consumers)
    newcomer = Consumer(ceiling=8, seed=7)
    consumers.append(newcomer)
    sums = run_for(server, consumers, 40)
    assert abs(sums[-1] - before) <= 2  # the total reconverged (within 40 readings: 20 s)
    assert newcomer.window.limit >= 2  # the newcomer holds a share
    consumers.remove(newcomer)
    sums = run_for(server, consumers, 40)
    assert abs(sums[-1] - before) <= 2  # the two left grew back into the freed places


def test_a_consumer_alone_below_the_servers_slots_keeps_its_ceiling() -> None:
    """A server that is not full (its queue below the target) leaves the window where it is:
    no admission cost when the consumer, not the server, limits the flow."""
    server = FluidServer(slots=16)
    consumer = Consumer(ceiling=6)
    sums = run_for(server, [consumer], 20)
    assert sums[-1] == 6 and not consumer.window.saturated


# --- in the balancer ----------------------------------------------------------------------------


class StatsServer(FakeServer):
    """A fake endpoint that also answers its statistics (``totals``; None: UNIMPLEMENTED)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.totals: QueueTotals | None = QueueTotals(0.0, 0, 0, 0)
        self.reads = 0

    async def queue_totals(self, at: float, client_timeout: float = 2.0) -> QueueTotals | None:
        self.reads += 1
        if self.totals is None:
            return None
        return QueueTotals(at, self.totals.requests, self.totals.queue_ns, self.totals.compute_ns)


@pytest.fixture
async def admitted() -> Any:
    time = FakeTime()
    server = StatsServer("a")
    meter = RecordingMeter()
    balancer = Balancer(
        "m",
        lambda _: server,
        meter=lambda _: meter,
        timing=NO_JITTER,
        clocks=Clocks(monotonic=time.clock, sleep=time.sleep, rng=random.Random(0)),
        admission=AdmissionSettings(interval_s=0.5),
    )
    balancer.track(["a"])
    balancer.start(SPEC, lambda _: 8, {"a": SPEC})
    yield time, server, meter, balancer
    await balancer.close()


async def test_the_balancer_sends_no_more_than_the_window_its_server_queue_allows(
    admitted: Any,
) -> None:
    time, server, meter, balancer = admitted
    [ep] = balancer.endpoints
    assert ep.window is not None and ep.allowed == 8
    server.hold.clear()
    requests = [asyncio.create_task(balancer.infer([1], ["Y"])) for _ in range(12)]
    await settle()
    assert ep.outstanding == 8  # the ceiling: model.max_in_flight or the model's own
    queue_ns = compute_ns = 0
    for _ in range(6):  # 8 in flight on 2 slots: 6 waiting at every reading
        queue_ns += int(6 * 0.5e9)
        compute_ns += int(2 * 0.5e9)
        server.totals = QueueTotals(0.0, 100, queue_ns, compute_ns)
        await time.advance(0.5)
    assert ep.allowed < 8 and meter.windows[-1] == ep.allowed
    assert meter.waiting > 4 and meter.full and balancer.saturated
    cut = ep.allowed
    server.hold.set()
    await asyncio.gather(*requests)
    assert server.requests == 12
    # The answers do not grow it back (as after an overload): the readings move it now.
    assert ep.allowed == cut


async def test_a_server_without_statistics_keeps_the_fixed_limit(admitted: Any) -> None:
    time, server, _, balancer = admitted
    server.totals = None
    await time.advance(0.5)
    [ep] = balancer.endpoints
    assert ep.watch is None and server.reads == 1  # read once, then never again
    await time.advance(5.0)
    assert server.reads == 1 and ep.allowed == 8 and not balancer.saturated


async def test_readings_that_keep_failing_put_the_window_back_at_the_limit(admitted: Any) -> None:
    time, server, _, balancer = admitted
    [ep] = balancer.endpoints
    server.hold.clear()
    requests = [asyncio.create_task(balancer.infer([1], ["Y"])) for _ in range(8)]
    await settle()
    queue_ns = compute_ns = 0
    for _ in range(6):  # 8 in flight on 2 slots: the window is cut
        queue_ns += int(6 * 0.5e9)
        compute_ns += int(2 * 0.5e9)
        server.totals = QueueTotals(0.0, 100, queue_ns, compute_ns)
        await time.advance(0.5)
    assert ep.allowed < 8

    async def broken(at: float, client_timeout: float = 2.0) -> QueueTotals | None:
        server.reads += 1
        raise RuntimeError("an error no one expected")

    server.queue_totals = broken
    reads = server.reads
    for _ in range(UNREAD_RESET - 1):
        await time.advance(0.5)
    assert ep.allowed < 8  # not yet
    await time.advance(0.5)
    assert ep.allowed == 8 and server.reads == reads + UNREAD_RESET
    await time.advance(5.0)  # the reading goes on (it did not end with the error)
    assert ep.watch is not None and not ep.watch.done() and server.reads > reads + UNREAD_RESET
    server.hold.set()
    await asyncio.gather(*requests)
