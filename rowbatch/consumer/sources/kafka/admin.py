"""Creating and checking what a Kafka consumer needs: its topic and its dead-letter topic, with
their partition count, replication factor and ``retention.ms``. ``plan`` is pure; ``ensure``
observes, plans and creates through the ``KafkaAdmin`` protocol; ``AioKafkaAdmin`` is the real
one (aiokafka's admin client, with the consumer's own address, SASL and TLS options)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from rowbatch.consumer.sources.admin_plan import (
    AdminFailed,
    AdminUnreachable,
    Outcome,
    Plan,
    Step,
    compare,
    step,
)
from rowbatch.timing import Backoff, Sleep

RETENTION = "retention.ms"
_UNKNOWN_TOPIC = 3
_CONNECT_BACKOFF = Backoff(0.2, 2.0, jitter=0.0)
"""The waits between tries to connect."""


@dataclass(frozen=True)
class TopicSpec:
    """A topic as the config wants it."""

    name: str
    partitions: int
    replication_factor: int
    retention_ms: int

    def settings(self) -> str:
        return (
            f"{self.partitions} partitions, replication factor {self.replication_factor}, "
            f"{RETENTION}={self.retention_ms}"
        )


@dataclass(frozen=True)
class TopicState:
    """An existing topic, as the brokers describe it."""

    name: str
    partitions: int
    replication_factor: int
    """The smallest replica count over its partitions."""
    retention_ms: int | None


class KafkaAdmin(Protocol):
    """The administrative calls ``ensure`` makes."""

    @property
    def address(self) -> str: ...

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        """The topics of ``names`` that exist."""
        ...

    async def create(self, spec: TopicSpec) -> None: ...


def plan(
    specs: Sequence[tuple[str, TopicSpec]], observed: Mapping[str, TopicState], *, address: str
) -> Plan:
    """One step per ``(kind, spec)``, in order: created when absent, compared when present."""
    steps: list[Step] = []
    for kind, spec in specs:
        have = observed.get(spec.name)
        if have is None:
            steps.append(Step(kind, spec.name, Outcome.CREATE, spec.settings()))
            continue
        differences = [
            compare("partitions", spec.partitions, have.partitions),
            compare("replication factor", spec.replication_factor, have.replication_factor),
            compare(RETENTION, spec.retention_ms, have.retention_ms),
        ]
        steps.append(step(kind, spec.name, spec.settings(), differences))
    return Plan(f"Kafka at {address}", tuple(steps))


async def ensure(
    admin: KafkaAdmin, specs: Sequence[tuple[str, TopicSpec]], *, dry_run: bool = False
) -> Plan:
    """Observe, plan, and (unless ``dry_run``) create what is absent; returns the plan."""
    observed = await admin.describe([spec.name for _, spec in specs])
    planned = plan(specs, observed, address=admin.address)
    if not dry_run:
        by_name = {spec.name: spec for _, spec in specs}
        for s in planned.to_create:
            await admin.create(by_name[s.name])
    return planned


class AioKafkaAdmin:
    """``KafkaAdmin`` on real brokers. ``client_options``: what the consumer's clients take
    (``bootstrap_servers``, ``client_id``, SASL and TLS). Use as ``async with``; connecting
    is retried for up to ``timeout_s`` (waiting with ``sleep``)."""

    def __init__(
        self,
        client_options: Mapping[str, Any],
        timeout_s: float = 30.0,
        *,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._options = dict(client_options)
        self._timeout_s = timeout_s
        self._sleep = sleep
        self._client: Any = None

    @property
    def address(self) -> str:
        return str(self._options["bootstrap_servers"])

    async def __aenter__(self) -> AioKafkaAdmin:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        failures = 0
        while True:
            client = AIOKafkaAdminClient(
                **self._options, request_timeout_ms=int(min(self._timeout_s, 10) * 1000)
            )
            try:
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    await client.start()
            except (KafkaError, OSError, TimeoutError) as exc:
                await client.close()
                failures += 1
                delay = _CONNECT_BACKOFF.wait(failures)
                if loop.time() + delay >= deadline:
                    raise AdminUnreachable(
                        f"Kafka at {self.address} did not answer within {self._timeout_s:g} s: "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                await self._sleep(delay)
                continue
            self._client = client
            return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def describe(self, names: Sequence[str]) -> dict[str, TopicState]:
        # Metadata for named topics would let a broker with auto.create.topics.enable create
        # them (aiokafka asks for that): list every topic first, describe only those present.
        listed = set(await self._call("listing topics", self._client.list_topics()))
        present = [name for name in names if name in listed]
        found: dict[str, TopicState] = {}
        if not present:
            return found
        for topic in await self._call("describing topics", self._client.describe_topics(present)):
            name, code = topic["topic"], int(topic["error_code"])
            if code == _UNKNOWN_TOPIC:
                continue  # deleted since it was listed
            if code != 0:
                reason = for_code(code).__name__
                raise AdminFailed(f"Kafka at {self.address}: topic {name}: {reason}")
            parts = topic["partitions"]
            replicas = min((len(p["replicas"]) for p in parts), default=0)
            found[name] = TopicState(name, len(parts), replicas, None)
        if found:
            retention = await self._retention(list(found))
            for name, state in found.items():
                found[name] = TopicState(
                    name, state.partitions, state.replication_factor, retention.get(name)
                )
        return found

    async def _retention(self, names: list[str]) -> dict[str, int]:
        resources = [
            ConfigResource(ConfigResourceType.TOPIC, name, configs={RETENTION: None})
            for name in names
        ]
        responses = await self._call(
            "describing topic configs", self._client.describe_configs(resources)
        )
        out: dict[str, int] = {}
        for response in responses:
            for resource in response.to_object()["resources"]:
                code = int(resource["error_code"])
                if code != 0:
                    raise AdminFailed(
                        f"Kafka at {self.address}: configs of topic {resource['resource_name']}: "
                        f"{for_code(code).__name__} {resource['error_message'] or ''}".rstrip()
                    )
                for entry in resource["config_entries"]:
                    if entry["config_names"] == RETENTION:
                        out[resource["resource_name"]] = int(entry["config_value"])
        return out

    async def create(self, spec: TopicSpec) -> None:
        topic = NewTopic(
            spec.name,
            spec.partitions,
            spec.replication_factor,
            topic_configs={RETENTION: str(spec.retention_ms)},
        )
        timeout_ms = int(self._timeout_s * 1000)
        response = await self._call(
            f"creating topic {spec.name}", self._client.create_topics([topic], timeout_ms)
        )
        for entry in response.topic_errors:
            code = int(entry[1])
            if code in (0, TopicAlreadyExistsError.errno):
                continue
            message = entry[2] if len(entry) > 2 and entry[2] else ""
            raise AdminFailed(
                f"Kafka at {self.address} refused to create topic {spec.name} "
                f"({spec.settings()}): {for_code(code).__name__} {message}".rstrip()
            )
        await self._wait_led(spec.name)

    async def _wait_led(self, name: str) -> None:
        """Wait until the brokers' metadata shows every partition of ``name`` with a leader,
        so what runs next (a consumer, another ``ensure``) sees the topic."""
        try:
            async with asyncio.timeout(self._timeout_s):
                while True:
                    for topic in await self._client.describe_topics([name]):
                        parts = topic["partitions"]
                        if (
                            topic["error_code"] == 0
                            and parts
                            and all(p["error_code"] == 0 and p["leader"] >= 0 for p in parts)
                        ):
                            return
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise AdminFailed(
                f"Kafka at {self.address}: topic {name} has partitions without a leader "
                f"{self._timeout_s:g} s after its creation"
            ) from None

    async def _call(self, what: str, call: Any) -> Any:
        try:
            async with asyncio.timeout(self._timeout_s):
                return await call
        except (KafkaError, OSError, TimeoutError) as exc:
            raise AdminUnreachable(
                f"Kafka at {self.address} did not answer ({what}): {type(exc).__name__}: {exc}"
            ) from exc
