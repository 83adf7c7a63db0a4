"""One model server as the balancer sees it (its client, health, requests outstanding, in-flight
limit and cool-down), and the choice among several: the healthy endpoint with the fewest
requests outstanding, ties taken in turn."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rowbatch.consumer.model.admission import QueueFollower
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.model.window import Window


class EndpointClient(Protocol):
    """One server's client (an
    :class:`~rowbatch.consumer.model.inference.client.InferenceClient`)."""

    url: str

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer: ...

    async def ready(self, client_timeout: float = 1.0) -> bool: ...

    async def discover(self, client_timeout: float | None = 30.0) -> ModelSpec: ...

    async def close(self) -> None: ...


class EndpointMeter(Protocol):
    """Per-endpoint metrics (:class:`rowbatch.consumer.observe.metrics.EndpointMetrics`)."""

    def sent(self) -> None: ...

    def answered(self, rows: int) -> None: ...

    def failed(self, kind: str) -> None: ...

    def in_flight(self, requests: int) -> None: ...

    def healthy(self, up: bool) -> None: ...

    def window(self, requests: int) -> None:
        """Requests this endpoint's window allows in flight now."""

    def server_waiting(self, requests: float) -> None:
        """Requests waiting in the server's queue, as its last reading said."""

    def server_queue_seconds(self, seconds: float) -> None:
        """Mean queue time per request at the server, as its last reading said."""

    def saturated(self, full: bool) -> None:
        """Whether the server runs full with requests waiting (it limits the flow)."""

    def forget(self) -> None:
        """Remove every series labelled with the endpoint: called once it is dropped (gone from
        DNS, its last request answered), so a model server that left is not reported out for
        ever."""


class NoMeter:
    """Counts nothing."""

    def sent(self) -> None:
        return None

    def answered(self, rows: int) -> None:
        return None

    def failed(self, kind: str) -> None:
        return None

    def in_flight(self, requests: int) -> None:
        return None

    def healthy(self, up: bool) -> None:
        return None

    def window(self, requests: int) -> None:
        return None

    def server_waiting(self, requests: float) -> None:
        return None

    def server_queue_seconds(self, seconds: float) -> None:
        return None

    def saturated(self, full: bool) -> None:
        return None

    def forget(self) -> None:
        return None


class Health(enum.Enum):
    PENDING = "pending"
    """Not discovered yet (down at start, or new from DNS): probed with model discovery."""
    HEALTHY = "healthy"
    """Takes requests."""
    DOWN = "down"
    """Answered UNAVAILABLE, a connection error, NOT_FOUND for its served model or a timeout:
    probed with its readiness RPC until it answers ready."""
    MISMATCHED = "mismatched"
    """Serves the model with another spec: never sent requests; discovered again now and
    then, in case it was fixed."""
    RETIRED = "retired"
    """Gone from DNS: no new requests; closed once its last one is answered."""


@dataclass(eq=False)
class Endpoint:
    """Mutable state of one server, owned by the balancer."""

    address: str
    client: EndpointClient
    meter: EndpointMeter
    limit: int = 1
    """Requests in flight at most (its share of the consumer's ``max_in_flight``)."""
    health: Health = Health.PENDING
    spec: ModelSpec | None = None
    """Its model's spec once discovered."""
    outstanding: int = 0
    allowed: int = 1
    """The limit in effect: halved on each RESOURCE_EXHAUSTED, one more per answer."""
    cool_until: float = 0.0
    """No new request before this (clock seconds) after a RESOURCE_EXHAUSTED."""
    strikes: int = 0
    """Times taken out since its last answer: an endpoint that answers ready but keeps
    failing is probed later each time."""
    exhaustions: int = 0
    """RESOURCE_EXHAUSTED answers since its last answer: each cool-down is longer."""
    probe: asyncio.Task[None] | None = field(default=None, repr=False)
    window: Window | None = field(default=None, repr=False)
    """With admission from the server's queue: what sets ``allowed`` (its ceiling ``limit``)."""
    follower: QueueFollower | None = field(default=None, repr=False)
    watch: asyncio.Task[None] | None = field(default=None, repr=False)
    """Reads the server's statistics for ``follower``."""

    def set_limit(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.allow(self.limit)
        if self.window is not None:
            self.window.reset(self.limit)

    def allow(self, requests: int) -> None:
        """``requests`` in flight at most from now (``rowbatch_endpoint_window``)."""
        self.allowed = requests
        self.meter.window(requests)


@dataclass(frozen=True)
class Wait:
    """No endpoint can take a request now, but one will: when an answer frees a slot
    (``full``) or at ``until`` (clock seconds), when a cool-down ends."""

    until: float | None
    full: bool


def choose(
    endpoints: Sequence[Endpoint], exclude: Collection[Endpoint], now: float, turn: int
) -> Endpoint | Wait | None:
    """The healthy endpoint not in ``exclude``, not cooling down and under its limit with the
    fewest requests outstanding (ties: the first from position ``turn``, so equals take turns);
    else how to wait for one; ``None`` when no healthy endpoint is left."""
    best: Endpoint | None = None
    full = False
    until: float | None = None
    count = len(endpoints)
    for i in range(count):
        ep = endpoints[(turn + i) % count]
        if ep.health is not Health.HEALTHY or ep in exclude:
            continue
        if ep.cool_until > now:
            until = ep.cool_until if until is None else min(until, ep.cool_until)
        elif ep.outstanding >= ep.allowed:
            full = True
        elif best is None or ep.outstanding < best.outstanding:
            best = ep
    if best is not None:
        return best
    if full or until is not None:
        return Wait(until, full)
    return None
