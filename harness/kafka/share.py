"""Share groups (KIP-932, "queues for Kafka") on a harness broker: a broker that has them, a
group's share configs, and a share group's lag.

The session's broker (:data:`~harness.kafka.jars.KAFKA_VERSION`, 4.1.1) has share groups off;
:func:`share_kafka_service` runs a second one on :data:`~harness.kafka.jars.SHARE_KAFKA_VERSION`
(its own ports, data dir and log), where a fresh format turns them on (``share.version=2``).

A share group's settings (where a new group starts reading, the record lock, the delivery
limit) are group configs, not client settings: :func:`set_share_group_config` sets them with
confluent-kafka's admin client (aiokafka's cannot alter a GROUP resource). Neither client has
the share-group offsets admin call (Java's ``listShareGroupOffsets``), so
:func:`share_group_lag` speaks that one request, DescribeShareGroupOffsets v1, itself.
"""

from __future__ import annotations

import itertools
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from harness.kafka.broker import KafkaService
from harness.kafka.config import SHARE_BROKER_OVERRIDES
from harness.kafka.jars import SHARE_KAFKA_VERSION
from harness.service import RunDir

__all__ = [
    "ShareGroupError",
    "SharePartitionOffset",
    "set_share_group_config",
    "share_group_lag",
    "share_kafka_service",
]

_ADMIN_TIMEOUT_S: Final = 30.0


def share_kafka_service(
    run: RunDir,
    *,
    name: str = "kafka-share",
    version: str = SHARE_KAFKA_VERSION,
    overrides: Mapping[str, str] | None = None,
) -> KafkaService:
    """An (unstarted) broker with share groups: Kafka ``version`` (>= 4.2) with
    :data:`~harness.kafka.config.SHARE_BROKER_OVERRIDES` plus ``overrides``. ``name`` picks its
    data dir and log in ``run`` (``run.data(name)``, ``run.log(name)``): give each broker that
    shares a run dir a name of its own. Its ports are free ones, picked on first start."""
    return KafkaService(
        run,
        version,
        overrides={**SHARE_BROKER_OVERRIDES, **(overrides or {})},
        name=name,
    )


def set_share_group_config(bootstrap: str, group: str, **configs: str) -> None:
    """Set group configs of share group ``group`` (IncrementalAlterConfigs SET on the GROUP
    resource; the group need not exist yet, and its other configs are kept). Keys are the
    configs' names; as Python names cannot hold dots, an underscore in a key without a dot
    stands for one (group configs have no underscores): ``share_auto_offset_reset="earliest"``
    and ``**{"share.auto.offset.reset": "earliest"}`` are the same.

    The broker checks each value against its bounds (``share.record.lock.duration.ms`` within
    ``group.share.min/max.record.lock.duration.ms``...) and the call raises
    :class:`ShareGroupError` naming the config it refused."""
    if not configs:
        return
    entries = [
        ConfigEntry(
            _config_name(key),
            value,
            incremental_operation=AlterConfigOpType.SET,
        )
        for key, value in configs.items()
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "rowbatch-harness"})
    futures = admin.incremental_alter_configs([resource], request_timeout=_ADMIN_TIMEOUT_S)
    for future in futures.values():
        try:
            future.result(timeout=_ADMIN_TIMEOUT_S)
        except KafkaException as exc:
            raise ShareGroupError(f"setting {sorted(configs)} of group {group!r}: {exc}") from exc


def _config_name(key: str) -> str:
    return key if "." in key else key.replace("_", ".")


# --- share_group_lag: DescribeShareGroupOffsets (API key 90) by hand ---


class ShareGroupError(RuntimeError):
    """The broker refused a share-group call (its error code and message are in the text)."""


@dataclass(frozen=True)
class SharePartitionOffset:
    """Where a share group stands on one partition (DescribeShareGroupOffsets v1)."""

    start_offset: int
    """The share-partition start offset (SPSO): every record before it is done (accepted,
    rejected, or archived at the delivery limit); -1 before the group initialised it."""
    leader_epoch: int
    lag: int
    """Records from the start offset to the end that are not done yet: the available,
    acquired and not yet delivered ones (KIP-1226); -1 where the broker could not tell."""


_API_KEY: Final = 90
_API_VERSION: Final = 1  # v1 adds Lag (Kafka >= 4.2)
_CORRELATION = itertools.count(1)


def share_group_lag(
    bootstrap: str,
    group: str,
    topics: Mapping[str, Sequence[int]] | None = None,
    *,
    timeout_s: float = 10.0,
) -> dict[tuple[str, int], SharePartitionOffset]:
    """The share group's start offset and lag per ``(topic, partition)``, what
    ``kafka-share-groups.sh --describe`` shows, read with one DescribeShareGroupOffsets v1
    request. ``topics``: ``{topic: [partitions]}``, or None for every partition the group has
    initialised (a partition appears once a member has fetched from it).

    The request goes to ``bootstrap`` itself, which must be the group's coordinator: true on
    a single-node harness broker; anything else raises :class:`ShareGroupError`
    (NOT_COORDINATOR) rather than looking the coordinator up. So does a fresh broker before
    any group's first member joined (no ``__consumer_offsets`` yet: no coordinator). A
    partition whose state the group has not written yet (its first records still locked, none
    settled) reads start offset -1 and lag -1. Needs Kafka >= 4.2 (an older broker closes the
    connection: ``ConnectionError``)."""
    host, _, port = bootstrap.split(",", maxsplit=1)[0].strip().rpartition(":")
    correlation = next(_CORRELATION)
    payload = _describe_request(correlation, group, topics)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        sock.sendall(struct.pack(">i", len(payload)) + payload)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        response = _Reader(_recv_exact(sock, size))
    if (got := response.int32()) != correlation:
        raise ShareGroupError(f"response correlation id {got}, expected {correlation}")
    response.tagged_fields()
    return _parse_describe_response(response, group)


def _describe_request(
    correlation: int, group: str, topics: Mapping[str, Sequence[int]] | None
) -> bytes:
    client_id = b"rowbatch-harness"
    # Request header v2: api key, version, correlation id, client id (int16-length string),
    # then (flexible versions) its tagged fields.
    out = [struct.pack(">hhih", _API_KEY, _API_VERSION, correlation, len(client_id)), client_id]
    out.append(_TAGS_NONE)
    out += [_uvarint(1 + 1), _compact_string(group)]  # Groups: one entry
    if topics is None:
        out.append(_uvarint(0))  # Topics: null, i.e. all
    else:
        out.append(_uvarint(len(topics) + 1))
        for name, partitions in topics.items():
            out += [_compact_string(name), _uvarint(len(partitions) + 1)]
            out += [struct.pack(">i", p) for p in partitions]
            out.append(_TAGS_NONE)
    out += [_TAGS_NONE, _TAGS_NONE]  # the group's tagged fields, then the request's
    return b"".join(out)


def _parse_describe_response(
    response: _Reader, group: str
) -> dict[tuple[str, int], SharePartitionOffset]:
    response.int32()  # ThrottleTimeMs
    offsets: dict[tuple[str, int], SharePartitionOffset] = {}
    for _ in range(response.array_length()):
        group_id = response.compact_string()
        partition_errors: list[str] = []
        for _ in range(response.array_length()):
            topic = response.compact_string() or ""
            response.raw(16)  # TopicId
            for _ in range(response.array_length()):
                partition = response.int32()
                start_offset = response.int64()
                leader_epoch = response.int32()
                lag = response.int64()
                code = response.int16()
                message = response.compact_string()
                response.tagged_fields()
                if code:
                    partition_errors.append(f"{topic}-{partition}: error {code} {message or ''}")
                    continue
                offsets[(topic, partition)] = SharePartitionOffset(start_offset, leader_epoch, lag)
            response.tagged_fields()
        code = response.int16()
        message = response.compact_string()
        response.tagged_fields()
        if code:
            raise ShareGroupError(
                f"DescribeShareGroupOffsets of group {group_id!r}: error {code} "
                f"{message or ''}".rstrip()
            )
        if partition_errors:
            raise ShareGroupError(
                f"DescribeShareGroupOffsets of group {group!r}: {'; '.join(partition_errors)}"
            )
    return offsets


_TAGS_NONE: Final = b"\x00"  # an empty tagged-fields section


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact_string(text: str) -> bytes:
    data = text.encode()
    return _uvarint(len(data) + 1) + data


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    while size:
        chunk = sock.recv(min(size, 1 << 16))
        if not chunk:
            raise ConnectionError(
                "the broker closed the connection (no DescribeShareGroupOffsets v1: Kafka < 4.2, "
                "or share groups off?)"
            )
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


class _Reader:
    """Reads a flexible-version Kafka response body field by field."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def raw(self, size: int) -> bytes:
        if self._pos + size > len(self._data):
            raise ShareGroupError("truncated DescribeShareGroupOffsets response")
        chunk = self._data[self._pos : self._pos + size]
        self._pos += size
        return chunk

    def _unpack(self, fmt: str) -> int:
        value: int = struct.unpack(fmt, self.raw(struct.calcsize(fmt)))[0]
        return value

    def int16(self) -> int:
        return self._unpack(">h")

    def int32(self) -> int:
        return self._unpack(">i")

    def int64(self) -> int:
        return self._unpack(">q")

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.raw(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def array_length(self) -> int:
        """A compact array's length (0 for a null one)."""
        return max(self.uvarint() - 1, 0)

    def compact_string(self) -> str | None:
        size = self.uvarint()
        return None if size == 0 else self.raw(size - 1).decode()

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self.raw(self.uvarint())
