"""Start-up with several model servers: every endpoint is discovered, start-up waits only while
none answers, an endpoint that does not serve the model fails it at once, and the clients of
addresses found under a DNS name check TLS certificates against that name."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from rowbatch.consumer.model.balancer import Balancer
from rowbatch.consumer.model.discovery import ModelNotFound
from rowbatch.consumer.model.endpoints import Address, Membership, parse_endpoints
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.service.build_model import (
    check_endpoints,
    connector,
    discover_endpoints_waiting,
    per_endpoint_limit,
)
from rowbatch.consumer.service.startup import StartupError
from rowbatch.timing import Clocks
from tests.unit.consumer.model.test_balancer import SPEC, FakeServer
from tests.virtual_time import VirtualTime


class Servers:
    def __init__(self, *names: str) -> None:
        self.servers = {n: FakeServer(n) for n in names}

    def connect(self, address: str) -> FakeServer:
        return self.servers[address]


def settings(url: str, **extra: Any) -> ModelSettings:
    return ModelSettings(name="m", url=url, backoff_initial_s=1.0, backoff_max_s=1.0, **extra)


async def discover(
    url: str, servers: Servers, clock: VirtualTime, **extra: Any
) -> tuple[dict[str, ModelSpec], Balancer]:
    balancer = Balancer("m", servers.connect, clocks=Clocks(rng=random.Random(0)))
    config = settings(url, **extra)
    membership = Membership(parse_endpoints(url))
    found = await discover_endpoints_waiting(
        balancer, membership, config, clocks=Clocks(monotonic=clock.clock, sleep=clock.sleep)
    )
    return found, balancer


async def test_endpoints_down_at_start_do_not_hold_it_up() -> None:
    servers = Servers("a:1", "b:2")
    servers.servers["a:1"].up = False
    found, balancer = await discover("a:1,b:2", servers, VirtualTime(0.0))
    assert found == {"b:2": SPEC}
    assert [e.address for e in balancer.endpoints] == ["a:1", "b:2"]
    balancer.start(SPEC, per_endpoint_limit(settings("a:1,b:2"), 8), found)
    assert balancer.capacity == 4  # two per endpoint (SPEC batches 8), counted for both
    await balancer.close()


async def test_start_up_waits_while_no_endpoint_answers() -> None:
    servers = Servers("a:1", "b:2")
    for server in servers.servers.values():
        server.up = False
    clock = VirtualTime(0.0)
    attempts: list[int] = []
    original = servers.servers["b:2"].discover

    async def comes_up(client_timeout: float | None = 30.0) -> ModelSpec:
        attempts.append(1)
        if len(attempts) == 3:
            servers.servers["b:2"].up = True
        return await original(client_timeout)

    servers.servers["b:2"].discover = comes_up  # type: ignore[method-assign]
    found, balancer = await discover("a:1,b:2", servers, clock)
    assert found == {"b:2": SPEC}
    assert len(clock.slept) == 2
    await balancer.close()


async def test_nobody_answering_for_the_whole_wait_names_the_setting() -> None:
    servers = Servers("a:1", "b:2")
    for server in servers.servers.values():
        server.up = False
    with pytest.raises(StartupError, match=r"model.startup_wait_s.*cannot reach a:1.*b:2"):
        await discover("a:1,b:2", servers, VirtualTime(0.0), startup_wait_s=3)


async def test_an_endpoint_without_the_model_fails_start_up_at_once() -> None:
    servers = Servers("a:1", "b:2")

    async def not_found(client_timeout: float | None = 30.0) -> ModelSpec:
        raise ModelNotFound("inference server b:2 does not serve model 'm'")

    servers.servers["b:2"].discover = not_found  # type: ignore[method-assign]
    clock = VirtualTime(0.0)
    with pytest.raises(ModelNotFound, match="b:2"):
        await discover("a:1,b:2", servers, clock)
    assert clock.slept == []


class Resolver:
    async def resolve(self, name: str, port: int) -> Sequence[Address]:
        return [Address("10.0.0.1", port)]


async def test_tls_checks_an_address_found_under_a_name_against_that_name() -> None:
    plain = settings("dns:///triton.ns.svc:8001,10.0.0.9:8001")
    membership = Membership(plain.endpoints(), Resolver())
    await membership.addresses()
    assert connector(plain, membership)("10.0.0.1:8001").tls is None
    tls = settings("dns:///triton.ns.svc:8001,10.0.0.9:8001", tls=True)
    connect = connector(tls, membership)
    resolved, static = connect("10.0.0.1:8001"), connect("10.0.0.9:8001")
    assert resolved.tls is not None and resolved.tls.server_name == "triton.ns.svc"
    assert static.tls is not None and static.tls.server_name is None
    named = connector(settings("dns:///t:1", tls=True, tls_server_name="x"), membership)
    client = named("10.0.0.1:8001")
    assert client.tls is not None and client.tls.server_name == "x"
    for c in (resolved, static, client):
        await c.close()


async def test_check_asks_every_endpoint_once_without_waiting() -> None:
    with pytest.raises(StartupError, match=r"127\.0\.0\.1:1.*127\.0\.0\.1:2"):
        await check_endpoints(ModelSettings(name="m", url="127.0.0.1:1,127.0.0.1:2"))
