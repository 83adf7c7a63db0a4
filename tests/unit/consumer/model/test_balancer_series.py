"""A model-server endpoint's Prometheus series live exactly as long as the balancer keeps the
endpoint: once DNS no longer names it and its last request is answered, every series labelled
with it is gone from the consumer's registry (a series left at 0 would keep
``RowbatchModelEndpointOut`` firing after every model-server rollout, and dead series would pile
up with each one); an endpoint that comes back starts its series again at 0."""

from __future__ import annotations

import asyncio
import random

from rowbatch.consumer.model.balancer import Balancer
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.timing import Clocks
from tests.unit.consumer.model.test_balancer import (
    NO_JITTER,
    SPEC,
    FakeServer,
    FakeTime,
    error,
    settle,
)

#: Every metric family with a series per model-server endpoint (rowbatch/consumer/observe/
#: metrics.py): the test below finds them by their ``endpoint`` label, this names them so a
#: family that stops carrying the label fails here rather than passing vacuously.
ENDPOINT_FAMILIES = {
    "rowbatch_endpoint_requests",
    "rowbatch_endpoint_errors",
    "rowbatch_endpoint_inflight_batches",
    "rowbatch_endpoint_healthy",
    "rowbatch_endpoint_rows",
    "rowbatch_endpoint_window",
    "rowbatch_endpoint_server_waiting",
    "rowbatch_endpoint_server_queue_seconds",
    "rowbatch_server_saturated",
}


def series_of(metrics: Metrics, address: str) -> set[str]:
    """The samples (``name{labels}``) labelled ``endpoint=address`` in the registry."""
    return {
        f"{sample.name}{sorted(sample.labels.items())}"
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.labels.get("endpoint") == address
    }


def sample(metrics: Metrics, name: str, address: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"endpoint": address, **labels})


def families_of(metrics: Metrics, address: str) -> set[str]:
    return {
        family.name
        for family in metrics.registry.collect()
        if any(s.labels.get("endpoint") == address for s in family.samples)
    }


class Servers:
    def __init__(self) -> None:
        self.by_address: dict[str, FakeServer] = {}

    def connect(self, address: str) -> FakeServer:
        return self.by_address.setdefault(address, FakeServer(address))


def balancer(metrics: Metrics, servers: Servers, time: FakeTime) -> Balancer:
    return Balancer(
        "m",
        servers.connect,
        meter=metrics.endpoint,
        on_error=lambda _: None,
        timing=NO_JITTER,
        clocks=Clocks(monotonic=time.clock, sleep=time.sleep, rng=random.Random(0)),
    )


async def test_a_retired_endpoint_leaves_no_series_behind() -> None:
    metrics, servers, time = Metrics(), Servers(), FakeTime()
    fleet = balancer(metrics, servers, time)
    fleet.track(["a", "b"])
    fleet.start(SPEC, lambda _: 2, {"a": SPEC, "b": SPEC})
    # Traffic to both, one failure on b: every family has a series for b.
    for _ in range(4):
        await fleet.infer([1], ["Y"])
    servers.by_address["b"].errors = [error("RESOURCE_EXHAUSTED")]
    for _ in range(4):
        await fleet.infer([1], ["Y"])
    assert families_of(metrics, "b") == ENDPOINT_FAMILIES
    assert sample(metrics, "rowbatch_endpoint_errors_total", "b", kind="resource-exhausted") == 1
    kept = series_of(metrics, "a")

    fleet.update(["a"])  # b's pod left DNS (a rollout): nothing outstanding, dropped at once
    await settle()

    assert series_of(metrics, "b") == set(), "the retired endpoint's series remain"
    assert series_of(metrics, "a") == kept, "the other endpoint's series are untouched"
    await fleet.close()


async def test_series_stay_until_the_retired_endpoints_last_answer() -> None:
    metrics, servers, time = Metrics(), Servers(), FakeTime()
    fleet = balancer(metrics, servers, time)
    fleet.track(["a", "b"])
    fleet.start(SPEC, lambda _: 2, {"a": SPEC, "b": SPEC})
    for server in servers.by_address.values():
        server.hold.clear()
    tasks = [asyncio.create_task(fleet.infer([1], ["Y"])) for _ in range(2)]
    await settle()
    assert servers.by_address["b"].requests == 1

    fleet.update(["a"])
    # Retired while a request is in flight: its series still count that request...
    assert sample(metrics, "rowbatch_endpoint_inflight_batches", "b") == 1
    for server in servers.by_address.values():
        server.hold.set()
    await asyncio.gather(*tasks)
    await settle()
    # ...and go with its last answer.
    assert series_of(metrics, "b") == set()
    assert families_of(metrics, "a") == ENDPOINT_FAMILIES
    await fleet.close()


async def test_an_endpoint_that_comes_back_starts_its_series_again() -> None:
    metrics, servers, time = Metrics(), Servers(), FakeTime()
    fleet = balancer(metrics, servers, time)
    fleet.track(["a", "b"])
    fleet.start(SPEC, lambda _: 2, {"a": SPEC, "b": SPEC})
    fleet.update(["a"])
    await settle()
    assert series_of(metrics, "b") == set()

    fleet.update(["a", "b"])  # the same address again (a StatefulSet pod, a static IP)
    # pending (discovered again before it takes requests), every series back at 0
    assert families_of(metrics, "b") == ENDPOINT_FAMILIES
    assert sample(metrics, "rowbatch_endpoint_healthy", "b") == 0
    assert sample(metrics, "rowbatch_endpoint_requests_total", "b") == 0
    await time.advance(0.1)
    assert sample(metrics, "rowbatch_endpoint_healthy", "b") == 1
    await fleet.close()
