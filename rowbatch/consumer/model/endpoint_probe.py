"""Bringing a model-server endpoint that is out back: its readiness RPC with backoff when it was
taken out, model discovery and the spec check when it never served (down at start, new from
DNS) or served another spec; and the timings of that and of an overloaded endpoint's cool-down.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from rowbatch.consumer.model.endpoint_state import Endpoint, EndpointClient, Health
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.model.spec_match import describe_mismatch, spec_differences
from rowbatch.timing import Backoff, Sleep

log = logging.getLogger(__name__)


_PROBE = Backoff(0.1, 1.0)
_FLAP = Backoff(0.1, 10.0)
_COOLDOWN = Backoff(0.05, 1.0)


@dataclass(frozen=True)
class HealthTiming:
    """How endpoints that are out are probed, and how long an overloaded one cools down."""

    probe: Backoff = _PROBE
    """Waits between readiness probes of an endpoint that is out (so a restarted server is
    used again within about a second of answering ready)."""
    flap: Backoff = _FLAP
    """Wait before the first probe after an endpoint was taken out the n-th time without an
    answer in between: one that answers ready but keeps failing is tried less and less often.
    Its maximum is also the wait between discoveries of an endpoint serving another spec."""
    cooldown: Backoff = _COOLDOWN
    """No new request to an endpoint for this long after its n-th RESOURCE_EXHAUSTED in a row."""
    probe_timeout_s: float = 1.0
    discover_timeout_s: float = 10.0


@dataclass(frozen=True)
class Reference:
    """What a joining endpoint must serve, and the in-flight limit for what it serves."""

    spec: ModelSpec
    address: str
    """An endpoint that serves ``spec`` (named in mismatch messages)."""
    limit_for: Callable[[ModelSpec], int]


class Prober:
    """Runs one endpoint's probe until it takes requests again; ``set_health`` (the
    balancer's) is told of every change, ``MISMATCHED`` and finally ``HEALTHY``."""

    def __init__(
        self,
        timing: HealthTiming,
        set_health: Callable[[Endpoint, Health], None],
        *,
        sleep: Sleep = asyncio.sleep,
        rng: random.Random,
    ) -> None:
        self.timing = timing
        self.reference: Reference | None = None
        self._set_health = set_health
        self._sleep = sleep
        self._rng = rng

    async def run(self, ep: Endpoint) -> None:
        attempt = 0
        problem: str | None = None
        while True:
            attempt += 1
            await self._sleep(self._wait(ep, attempt))
            if ep.health is Health.DOWN:
                if await _ready(ep.client, self.timing.probe_timeout_s):
                    log.info("inference endpoint %s answers ready; sending it requests", ep.address)
                    break
                continue
            found = await self._discover(ep)
            if found is None:
                break
            if found != problem:
                problem = found
                log.warning("inference endpoint %s not used: %s", ep.address, found)
        ep.probe = None
        self._set_health(ep, Health.HEALTHY)

    def _wait(self, ep: Endpoint, attempt: int) -> float:
        if ep.health is Health.MISMATCHED:
            return self.timing.flap.max_s
        if ep.health is Health.DOWN and attempt == 1:
            return self.timing.flap.wait(ep.strikes, self._rng)
        return self.timing.probe.wait(attempt, self._rng)

    async def _discover(self, ep: Endpoint) -> str | None:
        """``None`` once ``ep`` serves the reference spec (its limit set); else why not."""
        reference = self.reference
        if reference is None:
            raise RuntimeError("no reference spec to check a joining endpoint against")
        try:
            spec = await ep.client.discover(self.timing.discover_timeout_s)
        except Exception as exc:  # noqa: BLE001 (any failure: not yet)
            return str(exc)
        differences = spec_differences(reference.spec, spec)
        if differences:
            self._set_health(ep, Health.MISMATCHED)
            return describe_mismatch(
                reference.spec.name, reference.address, ep.address, differences
            )
        ep.spec = spec
        ep.set_limit(reference.limit_for(spec))
        log.info(
            "inference endpoint %s serves model %r; sending it requests", ep.address, spec.name
        )
        return None


async def _ready(client: EndpointClient, timeout_s: float) -> bool:
    try:
        return await client.ready(timeout_s)
    except Exception:  # noqa: BLE001 (a probe failing means "not ready")
        return False
