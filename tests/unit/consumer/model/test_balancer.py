"""Balancing over several model servers, against fake servers and a fake clock (no sleeping):
least outstanding requests with per-endpoint limits, failover at once on UNAVAILABLE without
an error reaching the caller, probes with backoff bringing an endpoint back, RESOURCE_EXHAUSTED
slowing one endpoint, and the caller seeing an error only when no endpoint is left."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.balancer import Balancer
from rowbatch.consumer.model.discovery import ModelServerUnavailable
from rowbatch.consumer.model.endpoint_probe import HealthTiming
from rowbatch.consumer.model.endpoint_state import Endpoint, Health
from rowbatch.consumer.model.inference.errors import (
    InferenceError,
    PoisonInferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.timing import Backoff, Clocks

SPEC = ModelSpec(
    name="m",
    version="1",
    inputs=(TensorSpec("X", "FP32", (4,)),),
    outputs=(TensorSpec("Y", "FP32", (1,)),),
    max_batch_size=8,
)


def error(status: str) -> RetryableInferenceError:
    return RetryableInferenceError(f"model 'm': {status}", model="m", status=status)


async def settle() -> None:
    for _ in range(30):
        await asyncio.sleep(0)


class FakeTime:
    """A clock and a sleep that returns only when the test advances the clock past it."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[tuple[float, asyncio.Future[None]]] = []
        self.asked: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sleeps.append((self.now + seconds, future))
        await future

    async def advance(self, seconds: float) -> None:
        target = self.now + seconds
        await settle()
        while True:
            due = [s for s in self.sleeps if s[0] <= target and not s[1].done()]
            if not due:
                break
            when, future = min(due, key=lambda s: s[0])
            self.now = when
            future.set_result(None)
            await settle()
        self.sleeps = [s for s in self.sleeps if not s[1].done()]
        self.now = target
        await settle()


class FakeServer:
    """One endpoint's client: ``errors`` are raised by the next requests in turn; while
    ``hold`` is clear, requests wait; ``ready`` and ``up`` steer probes and discovery."""

    def __init__(self, url: str, spec: ModelSpec = SPEC) -> None:
        self.url = url
        self.spec = spec
        self.errors: list[InferenceError] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.requests = 0
        self.ready_answer = True
        self.up = True
        self.probes = 0
        self.closed = False

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        self.requests += 1
        failure = self.errors.pop(0) if self.errors else None
        await self.hold.wait()
        if failure is not None:
            raise failure
        return Answer({"Y": np.zeros((int(inputs[0]) if inputs else 1, 1), np.float32)})

    async def ready(self, client_timeout: float = 1.0) -> bool:
        self.probes += 1
        return self.ready_answer

    async def discover(self, client_timeout: float | None = 30.0) -> ModelSpec:
        if not self.up:
            raise ModelServerUnavailable(f"cannot reach {self.url}")
        return self.spec

    async def close(self) -> None:
        self.closed = True


class RecordingMeter:
    """Per-endpoint metrics as plain numbers."""

    def __init__(self) -> None:
        self.requests = 0
        self.rows = 0
        self.errors: list[str] = []
        self.up: bool | None = None
        self.inflight = 0
        self.forgotten = False
        self.windows: list[int] = []
        self.waiting = self.queue_s = 0.0
        self.full = False

    def sent(self) -> None:
        self.requests += 1

    def answered(self, rows: int) -> None:
        self.rows += rows

    def failed(self, kind: str) -> None:
        self.errors.append(kind)

    def in_flight(self, requests: int) -> None:
        self.inflight = requests

    def healthy(self, up: bool) -> None:
        self.up = up

    def forget(self) -> None:
        self.forgotten = True

    def window(self, requests: int) -> None:
        self.windows.append(requests)

    def server_waiting(self, requests: float) -> None:
        self.waiting = requests

    def server_queue_seconds(self, seconds: float) -> None:
        self.queue_s = seconds

    def saturated(self, full: bool) -> None:
        self.full = full


NO_JITTER = HealthTiming(
    probe=Backoff(0.1, 1.0, jitter=0.0),
    flap=Backoff(0.1, 10.0, jitter=0.0),
    cooldown=Backoff(0.5, 1.0, jitter=0.0),
)


class Fleet:
    """A started balancer over fake servers ``a``, ``b``, ... (all up unless told)."""

    def __init__(self, names: str = "ab", limit: int = 2, down: str = "") -> None:
        self.time = FakeTime()
        self.servers = {n: FakeServer(n) for n in names}
        self.meters = {n: RecordingMeter() for n in names}
        self.errors: list[InferenceError] = []
        self.balancer = Balancer(
            "m",
            self.connect,
            meter=self.meters.__getitem__,
            on_error=self.errors.append,
            timing=NO_JITTER,
            clocks=Clocks(monotonic=self.time.clock, sleep=self.time.sleep, rng=random.Random(0)),
        )
        self.balancer.track(names)
        for n in down:
            self.servers[n].up = False
        self.limit = limit

    def connect(self, address: str) -> FakeServer:
        if address not in self.servers:
            self.servers[address] = FakeServer(address)
            self.meters[address] = RecordingMeter()
        return self.servers[address]

    def start(self) -> None:
        specs = {n: s.spec for n, s in self.servers.items() if s.up}
        self.balancer.start(SPEC, lambda _: self.limit, specs)

    def ep(self, name: str) -> Endpoint:
        return next(e for e in self.balancer.endpoints if e.address == name)

    def request(self, rows: int = 1) -> asyncio.Task[Answer]:
        return asyncio.create_task(self.balancer.infer([rows], ["Y"]))

    def held(self, *names: str) -> None:
        for n in names:
            self.servers[n].hold.clear()

    def release(self, *names: str) -> None:
        for n in names:
            self.servers[n].hold.set()


@pytest.fixture
async def fleet() -> Any:
    f = Fleet()
    f.start()
    yield f
    await f.balancer.close()


async def fail_once(fleet: Fleet, name: str, status: str = "UNAVAILABLE") -> None:
    """Requests (all answered) until one went to ``name``, which failed it with ``status``."""
    server = fleet.servers[name]
    server.errors = [error(status)]
    before = server.requests
    while server.requests == before:
        await fleet.request()


async def reaches(fleet: Fleet, name: str, tries: int = 2) -> bool:
    """Whether one of ``tries`` requests (all answered) went to ``name``."""
    before = fleet.servers[name].requests
    for _ in range(tries):
        await fleet.request()
    return fleet.servers[name].requests > before


# --- balancing ---------------------------------------------------------------------------------


async def test_requests_go_to_the_endpoint_with_fewest_outstanding(fleet: Fleet) -> None:
    fleet.held("a", "b")
    first = [fleet.request() for _ in range(2)]
    await settle()
    assert (fleet.servers["a"].requests, fleet.servers["b"].requests) == (1, 1)
    fleet.release("b")
    await settle()
    fleet.held("b")
    fleet.request()
    await settle()
    assert (fleet.servers["a"].requests, fleet.servers["b"].requests) == (1, 2)
    fleet.release("a", "b")
    await asyncio.gather(*first)


async def test_each_endpoint_has_its_own_in_flight_limit(fleet: Fleet) -> None:
    fleet.held("a", "b")
    tasks = [fleet.request() for _ in range(5)]
    await settle()
    assert (fleet.ep("a").outstanding, fleet.ep("b").outstanding) == (2, 2)
    assert fleet.servers["a"].requests + fleet.servers["b"].requests == 4
    assert fleet.balancer.capacity == 4
    fleet.release("b")
    await settle()
    assert fleet.servers["b"].requests == 3  # the waiting request took a freed slot of b
    fleet.release("a")
    await asyncio.gather(*tasks)
    assert fleet.meters["a"].inflight == fleet.meters["b"].inflight == 0
    assert fleet.meters["a"].rows + fleet.meters["b"].rows == 5


async def test_a_slow_endpoint_gets_fewer_requests(fleet: Fleet) -> None:
    fleet.held("b")  # b does not answer during the run
    tasks = []
    for _ in range(10):
        tasks.append(fleet.request())
        await settle()
    assert (fleet.servers["a"].requests, fleet.servers["b"].requests) == (9, 1)
    fleet.release("b")
    await asyncio.gather(*tasks)


# --- failover ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        ("UNAVAILABLE", "unavailable"),
        ("ConnectionRefusedError", "connection"),
        ("NOT_FOUND", "not-found"),  # a served model gone: the server is restarting
        ("DEADLINE_EXCEEDED", "deadline-exceeded"),
    ],
)
async def test_a_failing_endpoint_is_taken_out_and_the_batch_goes_elsewhere(
    fleet: Fleet, status: str, kind: str
) -> None:
    await fail_once(fleet, "a", status)
    assert fleet.ep("a").health is Health.DOWN and fleet.meters["a"].up is False
    assert [e.status for e in fleet.errors] == [status]  # counted, not raised
    assert fleet.meters["a"].errors == [kind]
    assert fleet.meters["a"].rows == 0
    assert fleet.meters["b"].rows == fleet.servers["b"].requests
    assert not await reaches(fleet, "a", tries=4)  # out until it answers ready


async def test_a_probe_with_backoff_brings_an_endpoint_back(fleet: Fleet) -> None:
    fleet.servers["a"].ready_answer = False
    await fail_once(fleet, "a")
    await fleet.time.advance(3.0)
    assert fleet.time.asked == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]  # the last one still running
    assert fleet.ep("a").probe is not None and fleet.servers["a"].probes == 5
    assert fleet.ep("a").health is Health.DOWN
    fleet.servers["a"].ready_answer = True
    await fleet.time.advance(1.0)
    assert fleet.ep("a").health is Health.HEALTHY and fleet.meters["a"].up is True
    assert await reaches(fleet, "a")


async def test_an_endpoint_that_keeps_failing_is_probed_later_each_time(fleet: Fleet) -> None:
    for strike in (1, 2, 3):
        await fail_once(fleet, "a")
        assert fleet.ep("a").strikes == strike
        await fleet.time.advance(20.0)
        assert fleet.ep("a").health is Health.HEALTHY
    assert fleet.time.asked == [0.1, 0.2, 0.4]


async def test_rows_the_server_rejects_are_not_retried_elsewhere(fleet: Fleet) -> None:
    poison = PoisonInferenceError("bad rows", model="m", status="INVALID_ARGUMENT")
    fleet.servers["a"].errors = fleet.servers["b"].errors = [poison]
    with pytest.raises(PoisonInferenceError):
        await fleet.request()
    assert fleet.servers["a"].requests + fleet.servers["b"].requests == 1
    assert fleet.ep("a").health is fleet.ep("b").health is Health.HEALTHY


async def test_the_caller_sees_an_error_only_when_no_endpoint_is_left(fleet: Fleet) -> None:
    fleet.servers["a"].errors = [error("UNAVAILABLE")]
    fleet.servers["b"].errors = [error("UNAVAILABLE")]
    fleet.servers["a"].ready_answer = fleet.servers["b"].ready_answer = False
    with pytest.raises(RetryableInferenceError):
        await fleet.request()
    assert not await fleet.balancer.any_healthy()
    # the caller's retry goes to an endpoint that is out (it may be back already)
    answer = await fleet.request()
    assert answer.outputs["Y"].shape == (1, 1)
    assert await fleet.balancer.any_healthy()


async def test_one_endpoint_behaves_as_one_server_did() -> None:
    fleet = Fleet("a")
    fleet.start()
    fleet.servers["a"].errors = [error("UNAVAILABLE"), error("UNAVAILABLE")]
    fleet.servers["a"].ready_answer = False
    for _ in range(2):
        with pytest.raises(RetryableInferenceError, match="UNAVAILABLE"):
            await fleet.request()
    assert (await fleet.request()).outputs["Y"].shape == (1, 1)
    assert fleet.servers["a"].requests == 3
    assert fleet.ep("a").health is Health.HEALTHY and fleet.ep("a").strikes == 0
    await fleet.balancer.close()
    assert fleet.servers["a"].closed


async def test_backoff_and_pause_only_when_every_endpoint_is_out(fleet: Fleet) -> None:
    pauses: list[str] = []
    retrying = RetryingInferencer(
        fleet.balancer,
        InferenceRetry(Backoff(0.1, 10.0, jitter=0.0)),
        on_backoff_start=lambda: pauses.append("start"),
        on_backoff_end=lambda: pauses.append("end"),
        clocks=Clocks(sleep=fleet.time.sleep),
    )
    fleet.servers["a"].errors = [error("UNAVAILABLE")]
    for _ in range(2):
        await retrying.infer([1], ["Y"])
    assert fleet.ep("a").health is Health.DOWN
    assert pauses == []
    fleet.servers["b"].errors = [error("UNAVAILABLE")]
    fleet.servers["a"].ready_answer = False
    task = asyncio.create_task(retrying.infer([1], ["Y"]))
    await settle()
    assert pauses == ["start"]
    await fleet.time.advance(1.0)
    await task
    assert pauses == ["start", "end"]


# --- RESOURCE_EXHAUSTED ------------------------------------------------------------------------


async def test_resource_exhausted_slows_that_endpoint_only(fleet: Fleet) -> None:
    await fail_once(fleet, "a", "RESOURCE_EXHAUSTED")
    a = fleet.ep("a")
    assert a.health is Health.HEALTHY and a.allowed == 1 and a.cool_until == 0.5
    assert fleet.meters["a"].errors == ["resource-exhausted"] and fleet.meters["a"].rows == 0
    fleet.held("b")
    tasks = [fleet.request() for _ in range(2)]
    await settle()
    assert fleet.ep("b").outstanding == 2  # a cools down: b takes both
    fleet.release("b")
    await asyncio.gather(*tasks)
    await fleet.time.advance(0.5)
    assert await reaches(fleet, "a")
    assert a.allowed == 2  # one more per answer, up to its limit


async def test_exhausted_everywhere_reaches_the_caller(fleet: Fleet) -> None:
    fleet.servers["a"].errors = [error("RESOURCE_EXHAUSTED")]
    fleet.servers["b"].errors = [error("RESOURCE_EXHAUSTED")]
    with pytest.raises(RetryableInferenceError, match="RESOURCE_EXHAUSTED"):
        await fleet.request()
    task = fleet.request()  # the caller's retry waits out the cool-down
    await settle()
    assert not task.done()
    await fleet.time.advance(0.5)
    await task


# --- membership --------------------------------------------------------------------------------


async def test_an_endpoint_down_at_start_joins_once_it_serves_the_model() -> None:
    fleet = Fleet("ab", down="b")
    fleet.start()
    assert fleet.ep("b").health is Health.PENDING and fleet.balancer.capacity == 4
    assert not await reaches(fleet, "b", tries=3)
    fleet.servers["b"].up = True
    await fleet.time.advance(0.2)
    assert fleet.ep("b").health is Health.HEALTHY
    assert await reaches(fleet, "b")
    await fleet.balancer.close()


async def test_an_endpoint_serving_another_spec_is_not_used() -> None:
    fleet = Fleet("ab", down="b")
    fleet.start()
    fleet.servers["b"].spec = ModelSpec("m", "1", SPEC.inputs, SPEC.outputs, max_batch_size=4)
    fleet.servers["b"].up = True
    await fleet.time.advance(1.0)
    assert fleet.ep("b").health is Health.MISMATCHED and fleet.meters["b"].up is False
    assert not await reaches(fleet, "b", tries=3)
    fleet.servers["b"].spec = SPEC  # redeployed with the right config
    await fleet.time.advance(10.0)
    assert fleet.ep("b").health is Health.HEALTHY
    await fleet.balancer.close()


async def test_dns_changes_add_and_retire_endpoints(fleet: Fleet) -> None:
    fleet.held("a", "b")
    tasks = [fleet.request() for _ in range(2)]
    await settle()
    assert fleet.ep("b").outstanding == 1
    fleet.balancer.update(["a", "c"])
    assert fleet.ep("b").health is Health.RETIRED and not fleet.servers["b"].closed
    assert not fleet.meters["b"].forgotten, "its request in flight is still counted"
    assert fleet.ep("c").health is Health.PENDING
    await fleet.time.advance(0.1)
    assert fleet.ep("c").health is Health.HEALTHY
    fleet.release("a", "b")
    await asyncio.gather(*tasks)
    await settle()
    assert fleet.servers["b"].closed
    assert fleet.meters["b"].forgotten
    assert not fleet.meters["a"].forgotten and not fleet.meters["c"].forgotten
    assert [e.address for e in fleet.balancer.endpoints] == ["a", "c"]


async def test_following_dns_updates_every_interval(fleet: Fleet) -> None:
    answers = [["a"], [], ["a", "b"]]

    async def resolve() -> list[str]:
        return answers.pop(0)

    fleet.balancer.follow(resolve, 10.0)
    await fleet.time.advance(10.0)
    assert [e.address for e in fleet.balancer.endpoints] == ["a"]
    await fleet.time.advance(10.0)  # an empty answer changes nothing
    assert [e.address for e in fleet.balancer.endpoints] == ["a"]
    await fleet.time.advance(10.0)
    assert [e.address for e in fleet.balancer.endpoints] == ["a", "b"]
    assert fleet.ep("b").health is Health.PENDING
    await fleet.time.advance(0.1)
    assert fleet.ep("b").health is Health.HEALTHY
