"""Where the model servers are: ``model.url`` parsed into targets (``host:port`` entries, grpc's
static ``ipv4:``/``ipv6:`` address lists, and ``dns:///name:port`` names that stand for every
address of a Kubernetes headless Service), and the resolution of those targets into the
addresses the balancer sends requests to, repeated while the consumer runs."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Protocol

log = logging.getLogger(__name__)

_PORT: Final = re.compile(r"^[0-9]{1,5}$")
_HOST: Final = re.compile(r"^[A-Za-z0-9._-]+$")
_IP_LISTS: Final = ("ipv4:", "ipv6:")


class EndpointSpecError(ValueError):
    """``model.url`` names an endpoint that cannot be used; the message names the entry."""


@dataclass(frozen=True, order=True)
class Address:
    """One server address, as a gRPC channel target: ``host:port`` (``[v6]:port``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class DnsName:
    """A name resolved to all its addresses, each one an endpoint (a headless Service)."""

    name: str
    port: int

    def __str__(self) -> str:
        return f"dns:///{self.name}:{self.port}"


Target = Address | DnsName


@dataclass(frozen=True)
class Endpoints:
    """The parsed ``model.url``: targets in configured order, none twice."""

    targets: tuple[Target, ...]

    @property
    def dynamic(self) -> bool:
        """Whether some target is a DNS name (resolved again while the consumer runs)."""
        return any(isinstance(t, DnsName) for t in self.targets)

    def __str__(self) -> str:
        return ", ".join(str(t) for t in self.targets)


def parse_endpoints(url: str | Sequence[str]) -> Endpoints:
    """``model.url`` as targets. A string is one entry, or several separated by commas; a
    sequence holds entries. An entry is ``host:port``, ``[v6addr]:port``, ``dns:///name:port``,
    or grpc's ``ipv4:a:p,b:p`` / ``ipv6:[a]:p,[b]:p`` list (its scheme covers the whole
    string). Raises :class:`EndpointSpecError` naming the bad entry."""
    entries = [url] if isinstance(url, str) else list(url)
    targets: list[Target] = []
    for entry in entries:
        for target in _parse_entry(entry.strip()):
            if target in targets:
                raise EndpointSpecError(f"endpoint {str(target)!r} is named twice in model.url")
            targets.append(target)
    if not targets:
        raise EndpointSpecError("model.url names no endpoint")
    return Endpoints(tuple(targets))


def _parse_entry(entry: str) -> list[Target]:
    scheme = next((s for s in _IP_LISTS if entry.startswith(s)), None)
    if scheme is not None:
        items = entry.removeprefix(scheme).split(",")
        return [_ip_address(item.strip(), scheme, entry) for item in items]
    return [_parse_one(item.strip(), entry) for item in entry.split(",")]


def _parse_one(item: str, entry: str) -> Target:
    if not item:
        raise EndpointSpecError(f"empty endpoint in model.url entry {entry!r}")
    if item.startswith("dns:"):
        rest = item.removeprefix("dns:")
        if rest.startswith("//"):
            authority, _, rest = rest[2:].partition("/")
            if authority:
                raise EndpointSpecError(
                    f"endpoint {item!r}: a DNS server in the target ({authority!r}) is not "
                    "supported; use dns:///name:port (the system's resolver)"
                )
        host, port = _host_port(rest, item)
        return DnsName(host, port)
    scheme = next((s for s in _IP_LISTS if item.startswith(s)), None)
    if scheme is not None:
        return _ip_address(item.removeprefix(scheme), scheme, entry)
    if "://" in item or item.split(":", 1)[0] in ("unix", "unix-abstract", "vsock", "xds"):
        raise EndpointSpecError(
            f"endpoint {item!r}: not host:port, dns:///name:port or an ipv4:/ipv6: list"
        )
    host, port = _host_port(item, item)
    return Address(host, port)


def _ip_address(item: str, scheme: str, entry: str) -> Address:
    host, port = _host_port(item, f"{item} (in {entry!r})")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise EndpointSpecError(
            f"endpoint {item!r} in {entry!r}: {host!r} is not an IP address"
        ) from None
    if ip.version != int(scheme[3]):
        raise EndpointSpecError(f"endpoint {item!r} in {entry!r}: not an {scheme[:-1]} address")
    return Address(str(ip), port)


def _host_port(text: str, named: str) -> tuple[str, int]:
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or not rest.startswith(":"):
            raise EndpointSpecError(f"endpoint {named!r}: needs [ipv6-address]:port")
        port_text = rest[1:]
    else:
        host, colon, port_text = text.rpartition(":")
        if not colon:
            raise EndpointSpecError(f"endpoint {named!r}: needs a port (host:port)")
        if ":" in host:
            raise EndpointSpecError(f"endpoint {named!r}: write an IPv6 address as [addr]:port")
    if not host:
        raise EndpointSpecError(f"endpoint {named!r}: the host is empty")
    if not text.startswith("[") and not _HOST.match(host):
        raise EndpointSpecError(f"endpoint {named!r}: {host!r} is not a host name or address")
    if not _PORT.match(port_text) or not 0 < int(port_text) < 65536:
        raise EndpointSpecError(f"endpoint {named!r}: port {port_text!r} is not 1-65535")
    return host, int(port_text)


# --- resolution ------------------------------------------------------------------------------


class Resolver(Protocol):
    """Looks a name up: every address it has (raises ``OSError`` when the lookup fails)."""

    async def resolve(self, name: str, port: int) -> Sequence[Address]: ...


class SystemResolver:
    """The system's resolver (``getaddrinfo``: /etc/hosts, then DNS), off the event loop."""

    async def resolve(self, name: str, port: int) -> Sequence[Address]:
        infos = await asyncio.get_running_loop().getaddrinfo(name, port, type=socket.SOCK_STREAM)
        return sorted({Address(str(info[4][0]), port) for info in infos})


class Membership:
    """The current addresses of the configured targets. Static addresses are always there; a
    DNS name is looked up on every :meth:`addresses` call, and one whose lookup fails or comes
    back empty keeps the addresses it had (a resolver hiccup does not drop servers)."""

    def __init__(self, endpoints: Endpoints, resolver: Resolver | None = None) -> None:
        self.endpoints = endpoints
        self._resolver = resolver or SystemResolver()
        self._last: dict[DnsName, tuple[Address, ...]] = {}
        self._names: dict[str, str] = {}

    async def addresses(self) -> tuple[str, ...]:
        """Every address, in configured order (a name's addresses sorted), each once."""
        found: dict[str, None] = {}
        for target in self.endpoints.targets:
            if isinstance(target, Address):
                found.setdefault(str(target))
                continue
            for address in await self._lookup(target):
                found.setdefault(str(address))
                self._names[str(address)] = target.name
        return tuple(found)

    def name_of(self, address: str) -> str | None:
        """The DNS name ``address`` was found under (for TLS host checks), if any."""
        return self._names.get(address)

    async def _lookup(self, target: DnsName) -> tuple[Address, ...]:
        previous = self._last.get(target, ())
        try:
            addresses = tuple(await self._resolver.resolve(target.name, target.port))
        except OSError as exc:
            log.warning(
                "cannot resolve %s (%s); keeping %d address(es)", target, exc, len(previous)
            )
            return previous
        if not addresses:
            log.warning("%s resolves to no address; keeping %d", target, len(previous))
            return previous
        if addresses != previous and previous:
            log.info("%s now resolves to %s", target, ", ".join(str(a) for a in addresses))
        self._last[target] = addresses
        return addresses
