"""Building the model side from the configuration: clients for the model-server endpoints,
discovering the model on each (waiting while none is up yet) and the in-flight limit per
endpoint. The model handler the engine calls is
:class:`rowbatch.consumer.model.handler.OipHandler`, built by the runner."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from rowbatch.consumer.model.balancer import Balancer
from rowbatch.consumer.model.discovery import ModelServerUnavailable
from rowbatch.consumer.model.endpoint_probe import HealthTiming
from rowbatch.consumer.model.endpoints import Membership
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.model.server_kind import default_in_flight, describe_defaults
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import SOURCE_NAMES, ModelSpec
from rowbatch.consumer.model.spec_match import same_spec
from rowbatch.consumer.service.startup import wait_for
from rowbatch.timing import SYSTEM_CLOCKS, Clocks


def connector(settings: ModelSettings, membership: Membership) -> Callable[[str], InferenceClient]:
    """A client for one endpoint address. With TLS and no ``tls_server_name``, an address
    found under a DNS name checks the server's certificate against that name."""
    tls = settings.tls_options()
    configured = settings.configured_spec()

    def connect(address: str) -> InferenceClient:
        own = tls
        name = membership.name_of(address)
        if tls is not None and tls.server_name is None and name is not None:
            own = replace(tls, server_name=name)
        return InferenceClient(
            address, settings.name, settings.version, tls=own, configured=configured
        )

    return connect


async def discover_endpoints_waiting(
    balancer: Balancer,
    membership: Membership,
    settings: ModelSettings,
    *,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> dict[str, ModelSpec]:
    """Endpoint address -> the model spec it serves, for every endpoint that answered (in
    configured order), waiting with backoff (up to ``model.startup_wait_s``) while none does.
    An endpoint that does not serve the model, or fails the TLS handshake, fails at once."""

    async def attempt() -> dict[str, ModelSpec]:
        addresses = await membership.addresses()
        if not addresses:
            raise ModelServerUnavailable(f"{membership.endpoints} resolves to no address")
        balancer.track(addresses)
        endpoints = [ep for ep in balancer.endpoints if ep.address in addresses]
        answers = await asyncio.gather(
            *(ep.client.discover() for ep in endpoints), return_exceptions=True
        )
        specs: dict[str, ModelSpec] = {}
        down: list[str] = []
        for ep, answer in zip(endpoints, answers, strict=True):
            if isinstance(answer, ModelServerUnavailable):
                down.append(str(answer))
            elif isinstance(answer, BaseException):
                raise answer
            else:
                specs[ep.address] = answer
        if not specs:
            raise ModelServerUnavailable("; ".join(down))
        return specs

    return await wait_for(
        attempt,
        what=f"inference server {settings.url}",
        unavailable=ModelServerUnavailable,
        wait_s=settings.startup_wait_s,
        backoff=settings.backoff,
        setting="model.startup_wait_s",
        clocks=clocks,
    )


async def check_endpoints(settings: ModelSettings) -> dict[str, ModelSpec]:
    """Each endpoint's spec, asked once without waiting (``rowbatch-consumer check``); raises
    :class:`StartupError` when none answers, and
    :class:`rowbatch.consumer.model.spec_match.EndpointSpecMismatch` when two differ."""
    membership = Membership(settings.endpoints())
    balancer = Balancer(settings.name, connector(settings, membership))
    try:
        once = settings.model_copy(update={"startup_wait_s": 0.0})
        specs = await discover_endpoints_waiting(balancer, membership, once)
    finally:
        await balancer.close()
    same_spec(specs)
    return specs


def health_timing(settings: ModelSettings) -> HealthTiming:
    """Probes of endpoints that are out: readiness every 0.1 s doubling to 1 s; one that keeps
    failing once ready is probed later each time, from ``model.backoff_initial_s`` up to
    ``model.backoff_max_s``."""
    return HealthTiming(flap=settings.backoff)


def per_endpoint_limit(settings: ModelSettings, target: int) -> Callable[[ModelSpec], int]:
    """Requests in flight per endpoint: ``model.max_in_flight``, else what the endpoint's own
    model config or its server kind calls for
    (:func:`rowbatch.consumer.model.server_kind.default_in_flight`,
    :mod:`rowbatch.consumer.model.server_kind`)."""

    def limit(spec: ModelSpec) -> int:
        return settings.max_in_flight or default_in_flight(spec, target)

    return limit


def describe_origin(spec: ModelSpec) -> str:
    """Where the spec came from, for ``rowbatch-consumer check``: ``server mlserver 1.7.1;
    spec from its ModelMetadata``."""
    source = SOURCE_NAMES[spec.source]
    return f"server {spec.server}; spec from " + (
        source if spec.source == "configured" else f"its {source}"
    )


def describe_batching(spec: ModelSpec, settings: ModelSettings) -> str:
    """The batch size and requests in flight per server, each with where it comes from
    (configured, the model config, or the server kind's default)."""
    return describe_defaults(spec, settings.batch_size, settings.max_in_flight)
