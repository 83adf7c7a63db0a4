"""``model.url`` with several servers: the accepted forms and the errors naming a bad entry, DNS
names resolved (a failed lookup keeps the last addresses), and the spec check that refuses
endpoints serving different models, naming both."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from rowbatch.consumer.model.endpoints import (
    Address,
    DnsName,
    EndpointSpecError,
    Membership,
    SystemResolver,
    parse_endpoints,
)
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.model.spec_match import EndpointSpecMismatch, same_spec, spec_differences


@pytest.mark.parametrize(
    ("url", "targets"),
    [
        ("triton:8001", [Address("triton", 8001)]),
        ("a:1, b:2", [Address("a", 1), Address("b", 2)]),
        (["a:1", "b:2"], [Address("a", 1), Address("b", 2)]),
        ("[::1]:8001", [Address("::1", 8001)]),
        (
            "dns:///triton-headless.ml.svc.cluster.local:8001",
            [DnsName("triton-headless.ml.svc.cluster.local", 8001)],
        ),
        ("dns:triton:8001", [DnsName("triton", 8001)]),
        ("ipv4:127.0.0.1:1,127.0.0.1:2", [Address("127.0.0.1", 1), Address("127.0.0.1", 2)]),
        ("ipv6:[::1]:1,[::1]:2", [Address("::1", 1), Address("::1", 2)]),
        (
            ["ipv4:10.0.0.1:1,10.0.0.2:1", "dns:///t:2"],
            [Address("10.0.0.1", 1), Address("10.0.0.2", 1), DnsName("t", 2)],
        ),
    ],
)
def test_accepted_forms(url: str | list[str], targets: list[object]) -> None:
    assert list(parse_endpoints(url).targets) == targets


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("triton", "'triton': needs a port"),
        ("a:1,,b:2", "empty endpoint"),
        ("a:1,a:1", "'a:1' is named twice"),
        ("a:0", "port '0' is not 1-65535"),
        ("a:http", "port 'http' is not 1-65535"),
        ("http://a:1", "'http://a:1': not host:port"),
        ("unix:/tmp/sock", "'unix:/tmp/sock': not host:port"),
        ("dns://10.0.0.10/triton:8001", "a DNS server in the target ('10.0.0.10')"),
        ("dns:///triton", "'dns:///triton': needs a port"),
        ("ipv4:127.0.0.1:1,triton:2", "'triton' is not an IP address"),
        ("ipv4:[::1]:1", "not an ipv4 address"),
        ("::1:8001", "write an IPv6 address as [addr]:port"),
        ("tri ton:1", "'tri ton' is not a host name"),
        ([], "names no endpoint"),
    ],
)
def test_bad_entries_are_named(url: str | list[str], named: str) -> None:
    with pytest.raises(EndpointSpecError) as caught:
        parse_endpoints(url)
    assert named in str(caught.value)


def test_the_config_takes_a_list_and_a_json_list_from_the_environment() -> None:
    assert ModelSettings(name="m", url=["a:1", "b:2"]).url == "a:1,b:2"  # type: ignore[arg-type]
    assert ModelSettings(name="m", url='["a:1", "b:2"]').url == "a:1,b:2"
    single = ModelSettings(name="m", url="triton:8001")
    assert single.url == "triton:8001" and single.endpoints().targets == (Address("triton", 8001),)
    with pytest.raises(ValidationError, match=r"model.url|url") as caught:
        ModelSettings(name="m", url=["a:1", "b"])  # type: ignore[arg-type]
    assert "endpoint 'b': needs a port" in str(caught.value)


class Resolver:
    def __init__(self, answers: Sequence[Sequence[Address] | OSError]) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def resolve(self, name: str, port: int) -> Sequence[Address]:
        self.asked.append(f"{name}:{port}")
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer


async def test_dns_names_resolve_to_every_address_and_keep_them_when_lookups_fail() -> None:
    one, two = Address("10.0.0.1", 8001), Address("10.0.0.2", 8001)
    resolver = Resolver([[one, two], OSError("SERVFAIL"), [], [two]])
    membership = Membership(parse_endpoints("static:1,dns:///t.ns.svc:8001"), resolver)
    assert await membership.addresses() == ("static:1", "10.0.0.1:8001", "10.0.0.2:8001")
    assert membership.name_of("10.0.0.2:8001") == "t.ns.svc"
    assert membership.name_of("static:1") is None
    assert await membership.addresses() == ("static:1", "10.0.0.1:8001", "10.0.0.2:8001")
    assert await membership.addresses() == ("static:1", "10.0.0.1:8001", "10.0.0.2:8001")
    assert await membership.addresses() == ("static:1", "10.0.0.2:8001")
    assert resolver.asked == ["t.ns.svc:8001"] * 4


async def test_static_addresses_need_no_resolver() -> None:
    membership = Membership(parse_endpoints("ipv4:127.0.0.1:1,127.0.0.1:2"), Resolver([]))
    assert await membership.addresses() == ("127.0.0.1:1", "127.0.0.1:2")
    assert not membership.endpoints.dynamic


# --- the same model everywhere -----------------------------------------------------------------


def spec(dims: int = 16, max_batch: int = 256, out: str = "SCORE", version: str = "1") -> ModelSpec:
    return ModelSpec(
        name="fixed_latency",
        version=version,
        inputs=(TensorSpec("FEATURES", "FP32", (dims,)), TensorSpec("COUNT", "INT64", (1,))),
        outputs=(TensorSpec(out, "FP32", (1,)),),
        max_batch_size=max_batch,
    )


def test_spec_differences_name_what_differs() -> None:
    assert spec_differences(spec(), spec(version="2")) == []
    assert spec_differences(spec(), spec(dims=8, max_batch=128, out="LOGIT")) == [
        "input FEATURES: FEATURES (FP32 [16]) vs FEATURES (FP32 [8])",
        "output SCORE: SCORE (FP32 [1]) vs absent",
        "output LOGIT: absent vs LOGIT (FP32 [1])",
        "max_batch_size: 256 vs 128",
    ]


def test_a_mismatch_names_both_endpoints() -> None:
    ok = {"a:1": spec(), "b:2": spec(version="2")}
    assert same_spec(ok) == spec()
    with pytest.raises(EndpointSpecMismatch) as caught:
        same_spec({"a:1": spec(), "b:2": spec(), "c:3": spec(max_batch=64)})
    message = str(caught.value)
    assert "between inference endpoints a:1 and c:3" in message
    assert "max_batch_size: 256 vs 64" in message


async def test_the_system_resolver_reads_the_hosts_file() -> None:
    assert Address("127.0.0.1", 8001) in await SystemResolver().resolve("localhost", 8001)
