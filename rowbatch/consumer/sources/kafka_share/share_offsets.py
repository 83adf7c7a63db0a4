"""Where a share group stands on each partition: DescribeShareGroupOffsets v1 (API key 90;
KIP-932, with the partition's lag from KIP-1226, Kafka >= 4.2), over aiokafka's client.

Neither confluent-kafka nor aiokafka has this admin call, so its request and response are
declared here with aiokafka's protocol classes, field for field as Kafka's own message
definitions (clients/src/main/resources/common/message/DescribeShareGroupOffsetsRequest.json
and ...Response.json, ``validVersions`` 0-1, flexible from 0): aiokafka negotiates the version
with the broker, frames the request (header v2) and decodes the response. The request goes to
the group's coordinator (a share group's coordinator is its group coordinator: FindCoordinator
with the GROUP key type), looked up on every read, so any broker of a cluster can be the
bootstrap; SASL and TLS are the client's (:meth:`ShareOffsetsReader.for_settings`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import Any, Final, Protocol

from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.errors import IncompatibleBrokerVersion, KafkaError, for_code
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)

from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings

_LOG = logging.getLogger(__name__)

API_KEY: Final = 90
"""DescribeShareGroupOffsets."""
UNKNOWN: Final = -1
"""A start offset or lag the broker does not know (the group has written no state for the
partition yet, or the broker could not compute the lag)."""

Topics = Mapping[str, Sequence[int]]
"""``{topic: [partitions]}`` to describe."""


class Uuid(AbstractType[bytes]):  # type: ignore[misc]  # aiokafka is untyped
    """Kafka's ``uuid`` field (a topic id): 16 bytes as they are on the wire (aiokafka's
    protocol types have none)."""

    SIZE: Final = 16

    @classmethod
    def encode(cls, value: bytes) -> bytes:
        if len(value) != cls.SIZE:
            raise ValueError(f"a Uuid is {cls.SIZE} bytes, not {len(value)}")
        return value

    @classmethod
    def decode(cls, data: BytesIO) -> bytes:
        value = data.read(cls.SIZE)
        if len(value) != cls.SIZE:
            raise ValueError("Buffer underrun decoding Uuid")
        return value


class DescribeShareGroupOffsetsResponse_v1(Response):  # type: ignore[misc]  # noqa: N801
    API_KEY = API_KEY
    API_VERSION = 1
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "groups",
            CompactArray(
                ("group_id", CompactString("utf-8")),
                (
                    "topics",
                    CompactArray(
                        ("topic_name", CompactString("utf-8")),
                        ("topic_id", Uuid),
                        (
                            "partitions",
                            CompactArray(
                                ("partition_index", Int32),
                                ("start_offset", Int64),
                                ("leader_epoch", Int32),
                                ("lag", Int64),  # v1+ (KIP-1226)
                                ("error_code", Int16),
                                ("error_message", CompactString("utf-8")),
                                ("tags", TaggedFields),
                            ),
                        ),
                        ("tags", TaggedFields),
                    ),
                ),
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class DescribeShareGroupOffsetsRequest_v1(RequestStruct):  # type: ignore[misc]  # noqa: N801
    FLEXIBLE_VERSION = True
    API_KEY = API_KEY
    API_VERSION = 1
    RESPONSE_TYPE = DescribeShareGroupOffsetsResponse_v1
    SCHEMA = Schema(
        (
            "groups",
            CompactArray(
                ("group_id", CompactString("utf-8")),
                (
                    "topics",  # nullable: null asks for every partition of the group
                    CompactArray(
                        ("topic_name", CompactString("utf-8")),
                        ("partitions", CompactArray(Int32)),
                        ("tags", TaggedFields),
                    ),
                ),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class DescribeShareGroupOffsetsRequest(Request[DescribeShareGroupOffsetsRequest_v1]):  # type: ignore[misc]
    """One group's offsets; ``topics`` None: every partition the group has (aiokafka picks the
    struct of the version the broker serves: v1 only, as v0 has no lag)."""

    API_KEY = API_KEY

    def __init__(self, group: str, topics: Topics | None = None) -> None:
        self._group = group
        self._topics = topics

    def build(
        self, request_struct_class: type[DescribeShareGroupOffsetsRequest_v1]
    ) -> DescribeShareGroupOffsetsRequest_v1:
        topics: list[tuple[str, list[int], dict[int, bytes]]] | None = (
            None
            if self._topics is None
            else [(name, list(parts), {}) for name, parts in self._topics.items()]
        )
        return request_struct_class([(self._group, topics, {})], {})


@dataclass(frozen=True)
class SharePartitionOffset:
    """Where a share group stands on one partition (DescribeShareGroupOffsets v1)."""

    start_offset: int
    """The share-partition start offset (SPSO): every record before it is done (accepted,
    rejected, or archived at the delivery limit); -1 (:data:`UNKNOWN`) while the group has
    written no state for the partition (no record of it acknowledged, released or past its
    lock yet)."""
    leader_epoch: int
    lag: int
    """Records from the start offset to the end that are not done yet: the available,
    acquired and not yet delivered ones (KIP-1226); -1 (:data:`UNKNOWN`) where the broker
    cannot tell (no state yet, as above)."""

    @property
    def known_lag(self) -> int | None:
        """The lag, None where the broker does not know it."""
        return None if self.lag < 0 else self.lag


ShareOffsets = dict[tuple[str, int], SharePartitionOffset]
"""By ``(topic, partition)``."""


class ShareOffsetsError(RuntimeError):
    """A share group's offsets could not be read; the text says why (the broker's error by
    name, what it usually means)."""


class _CoordinatorMoved(ShareOffsetsError):
    """The broker asked is not (or not yet) the group's coordinator: worth a new lookup."""


_COORDINATOR_MOVED: Final = frozenset({14, 15, 16})
"""COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR."""

_HINTS: Final[Mapping[int, str]] = {
    3: "the topic or partition does not exist",
    14: "the group's coordinator is still loading its state",
    15: "the group's coordinator is not available (a fresh cluster, or a broker restarting)",
    16: "the broker is no longer the group's coordinator",
    29: "the client may not DESCRIBE the topic (an ACL)",
    30: "the client may not DESCRIBE the group (an ACL)",
    35: "the broker does not serve this request version",
    42: "the broker refused the request as malformed",
    69: "there is no share group of that name",
    -1: "the broker failed on it (its log says why)",
}


def error_text(code: int, message: str | None = None) -> str:
    """A Kafka error code in words: its name, number, what it usually means, and the broker's
    own message if it sent one."""
    error = for_code(code)
    name = error.message if error.errno == code else "UNKNOWN"
    text = f"{name} (error {code})"
    hint = _HINTS.get(code)
    if hint:
        text += f": {hint}"
    if message:
        text += f" [broker: {message}]"
    return text


NO_V1: Final = (
    "the broker does not serve DescribeShareGroupOffsets v1 (the share-group lag needs "
    "Kafka >= 4.2 with share groups on)"
)


def offsets_of(response: Any, group: str) -> ShareOffsets:
    """The partitions of a decoded DescribeShareGroupOffsets v1 response for ``group``;
    :class:`ShareOffsetsError` naming the group's or the partitions' errors."""
    offsets: ShareOffsets = {}
    for group_id, topics, code, message, _ in response.groups:
        if code:
            kind = _CoordinatorMoved if code in _COORDINATOR_MOVED else ShareOffsetsError
            raise kind(
                f"DescribeShareGroupOffsets of share group {group_id!r}: "
                f"{error_text(code, message)}"
            )
        failed: list[str] = []
        for topic, _topic_id, partitions, _ in topics:
            for partition, start, epoch, lag, p_code, p_message, _ in partitions:
                if p_code:
                    failed.append(f"{topic}-{partition}: {error_text(p_code, p_message)}")
                    continue
                offsets[(topic, partition)] = SharePartitionOffset(start, epoch, lag)
        if failed:
            raise ShareOffsetsError(
                f"DescribeShareGroupOffsets of share group {group!r}: {'; '.join(failed)}"
            )
    return offsets


class OffsetsClient(Protocol):
    """What is used of aiokafka's ``AIOKafkaClient`` (a bootstrapped one)."""

    async def coordinator_lookup(self, coordinator_type: int, coordinator_key: str) -> int: ...

    async def send(self, node_id: int, request: Any) -> Any: ...


async def describe_share_group_offsets(
    client: OffsetsClient, group: str, topics: Topics | None = None
) -> ShareOffsets:
    """Look up the group's coordinator and ask it for the group's offsets (``topics`` None:
    every partition the group has state of). A coordinator that moved, is not available or
    still loads (and a connection that failed) is looked up and asked once more; anything
    else, or the same twice, raises :class:`ShareOffsetsError`."""
    request = DescribeShareGroupOffsetsRequest(group, topics)
    for attempt in (1, 2):
        again = attempt == 1
        try:
            node = await client.coordinator_lookup(CoordinationType.GROUP, group)
        except KafkaError as exc:
            if again and exc.retriable:
                _LOG.debug("coordinator lookup of share group %s failed (%s); again", group, exc)
                continue
            raise ShareOffsetsError(
                f"finding the coordinator of share group {group!r}: {_kafka_error(exc)}"
            ) from exc
        try:
            response = await client.send(node, request)
        except (IncompatibleBrokerVersion, NotImplementedError) as exc:
            # No API key 90 (Kafka < 4.1, or share groups off), or only v0 (Kafka 4.1).
            raise ShareOffsetsError(f"{NO_V1} (coordinator: broker {node})") from exc
        except KafkaError as exc:
            if again and exc.retriable:
                _LOG.debug("DescribeShareGroupOffsets to broker %s failed (%s); again", node, exc)
                continue
            raise ShareOffsetsError(
                f"DescribeShareGroupOffsets of share group {group!r} to broker {node}: "
                f"{_kafka_error(exc)}"
            ) from exc
        try:
            return offsets_of(response, group)
        except _CoordinatorMoved as exc:
            if not again:
                raise
            _LOG.debug("share group %s: %s; looking its coordinator up again", group, exc)
    raise AssertionError("unreachable")  # pragma: no cover - the second attempt returns/raises


def _kafka_error(exc: KafkaError) -> str:
    code = getattr(exc, "errno", None)
    if isinstance(code, int):
        return error_text(code, str(exc.args[0]) if exc.args else None)
    return str(exc)


class ShareOffsetsReader:
    """Reads one share group's offsets with an aiokafka client of its own, made and
    bootstrapped on first use (and again after a bootstrap failed), kept for the next reads.

    ``options``: the client's (``AIOKafkaClient`` keyword arguments: bootstrap_servers,
    client_id, security...), or a callable returning them, called when the client is made.
    ``client_factory``: makes the client from them (tests give a fake)."""

    def __init__(
        self,
        options: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        group: str,
        *,
        request_timeout_s: float = 10.0,
        client_factory: Callable[..., Any] = AIOKafkaClient,
    ) -> None:
        self._options = options
        self.group = group
        self._request_timeout_ms = max(1, int(request_timeout_s * 1000))
        self._factory = client_factory
        self._client: Any = None

    @classmethod
    def for_settings(
        cls,
        settings: KafkaShareSettings,
        *,
        request_timeout_s: float = 10.0,
        client_factory: Callable[..., Any] = AIOKafkaClient,
    ) -> ShareOffsetsReader:
        """The source's group, brokers, SASL and TLS (the classic source's aiokafka options of
        the same brokers: :meth:`KafkaShareSettings.classic_view`); a TLS file that cannot be
        used fails the first read, naming it."""
        return cls(
            lambda: settings.classic_view().client_options(),
            settings.group_id,
            request_timeout_s=request_timeout_s,
            client_factory=client_factory,
        )

    async def _started(self) -> Any:
        if self._client is not None:
            return self._client
        options = dict(self._options() if callable(self._options) else self._options)
        options.setdefault("request_timeout_ms", self._request_timeout_ms)
        client = self._factory(**options)
        try:
            await client.bootstrap()
        except BaseException as exc:
            await client.close()
            if isinstance(exc, KafkaError | OSError):
                raise ShareOffsetsError(
                    f"cannot reach Kafka at {options.get('bootstrap_servers')}: {exc}"
                ) from exc
            raise
        self._client = client
        return client

    async def read(self, topics: Topics | None = None) -> ShareOffsets:
        """The group's start offset and lag per ``(topic, partition)``: of ``topics``
        (``{topic: [partitions]}``; a partition the group has no state of, and every partition
        of a group that does not exist, reads -1, -1), or, None, of every partition the group
        has. On a cluster no group used yet, the first reads fail for a few seconds
        (COORDINATOR_NOT_AVAILABLE, while Kafka makes its group metadata topic)."""
        return await describe_share_group_offsets(await self._started(), self.group, topics)

    async def partitions(self, topic: str) -> list[int]:
        """The topic's partitions (the client's metadata, refreshed when it lacks them);
        :class:`ShareOffsetsError` when the topic is not in the cluster."""
        client = await self._started()
        await client.add_topic(topic)
        found = client.cluster.partitions_for_topic(topic)
        if not found:
            await client.force_metadata_update()
            found = client.cluster.partitions_for_topic(topic)
        if not found:
            raise ShareOffsetsError(f"topic {topic!r} is not in the cluster's metadata")
        return sorted(found)

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()


__all__ = [
    "API_KEY",
    "NO_V1",
    "UNKNOWN",
    "DescribeShareGroupOffsetsRequest",
    "DescribeShareGroupOffsetsRequest_v1",
    "DescribeShareGroupOffsetsResponse_v1",
    "OffsetsClient",
    "ShareOffsets",
    "ShareOffsetsError",
    "ShareOffsetsReader",
    "SharePartitionOffset",
    "Topics",
    "Uuid",
    "describe_share_group_offsets",
    "error_text",
    "offsets_of",
]
