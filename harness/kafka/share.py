"""Share groups (KIP-932, "queues for Kafka") on a harness broker: a broker that has them, a
group's share configs, and a share group's lag.

The session's broker (:data:`~harness.kafka.jars.KAFKA_VERSION`, 4.1.1) has share groups off;
:func:`share_kafka_service` runs a second one on :data:`~harness.kafka.jars.SHARE_KAFKA_VERSION`
(its own ports, data dir and log), where a fresh format turns them on (``share.version=2``).

A share group's settings (where a new group starts reading, the record lock, the delivery
limit) are group configs, not client settings: :func:`set_share_group_config` sets them with
confluent-kafka's admin client (aiokafka's cannot alter a GROUP resource). Neither client has
the share-group offsets admin call (Java's ``listShareGroupOffsets``): :func:`share_group_lag`
reads a group's lag with the consumer's own reader of that request, DescribeShareGroupOffsets
v1 (rowbatch/consumer/sources/kafka_share/share_offsets.py, over aiokafka's client).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

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
from rowbatch.consumer.sources.kafka_share.share_offsets import (
    ShareOffsetsError,
    ShareOffsetsReader,
    SharePartitionOffset,
)

__all__ = [
    "ShareGroupError",
    "SharePartitionOffset",
    "set_share_group_config",
    "share_group_lag",
    "share_kafka_service",
]

_ADMIN_TIMEOUT_S: Final = 30.0
_T = TypeVar("_T")


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


# --- share_group_lag: the product's reader of DescribeShareGroupOffsets ---


class ShareGroupError(RuntimeError):
    """The broker refused a share-group call (its error code and message are in the text)."""


def share_group_lag(
    bootstrap: str,
    group: str,
    topics: Mapping[str, Sequence[int]] | None = None,
    *,
    timeout_s: float = 10.0,
) -> dict[tuple[str, int], SharePartitionOffset]:
    """The share group's start offset and lag per ``(topic, partition)``, what
    ``kafka-share-groups.sh --describe`` shows, read with one DescribeShareGroupOffsets v1
    request by the consumer's own reader
    (:class:`~rowbatch.consumer.sources.kafka_share.share_offsets.ShareOffsetsReader`).
    ``topics``: ``{topic: [partitions]}``, or None for every partition the group has state of.

    ``bootstrap`` is any broker of the cluster (PLAINTEXT): the group's coordinator is looked
    up. A partition whose state the group has not written yet (none of its records
    acknowledged, released or past its lock) reads start offset -1 and lag -1. What the broker
    refuses (and a broker older than Kafka 4.2, or one it cannot reach) raises
    :class:`ShareGroupError` naming the error; so does no answer within ``timeout_s``.
    Callable from a thread with a running event loop (it then reads on a thread of its own)."""

    async def read() -> dict[tuple[str, int], SharePartitionOffset]:
        reader = ShareOffsetsReader(
            {"bootstrap_servers": bootstrap, "client_id": "rowbatch-harness"},
            group,
            request_timeout_s=timeout_s,
        )
        try:
            async with asyncio.timeout(timeout_s):
                return await reader.read(topics)
        finally:
            await reader.close()

    try:
        return _run(read)
    except ShareOffsetsError as exc:
        raise ShareGroupError(str(exc)) from exc
    except TimeoutError as exc:
        raise ShareGroupError(
            f"DescribeShareGroupOffsets of share group {group!r} at {bootstrap}: no answer "
            f"within {timeout_s:g} s"
        ) from exc


def _run(make: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    """``asyncio.run`` of ``make()``, on a thread of its own when this one runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="share-group-lag") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()
