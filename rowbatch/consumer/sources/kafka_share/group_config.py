"""A share group's configuration as the ``[source]`` wants it: ``share.auto.offset.reset`` (where
the group starts on partitions it has not read) and ``share.record.lock.duration.ms`` (the
record lock). These are group configs on the broker, not client settings; confluent-kafka's
admin client reads and sets them (aiokafka's cannot alter a GROUP resource).

Two users, one definition: the source's start-up check sets them (:func:`configure_share_group`,
unless ``configure_group = false``), and ``rowbatch-consumer admin ensure`` plans them like a
topic (:func:`ensure`): those not set on the group are set, those set to what the
configuration wants are fine, and one set to another value is named and left alone.
``ShareGroupConfigs`` is the seam (``ConfluentGroupConfigs`` on real brokers)."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any, Final, Protocol

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)

from rowbatch.consumer.sources.admin_plan import (
    AdminFailed,
    AdminUnreachable,
    Outcome,
    Step,
    compare,
    step,
)
from rowbatch.consumer.sources.base import SourceConfigError
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings

AUTO_OFFSET_RESET: Final = "share.auto.offset.reset"
LOCK_DURATION_MS: Final = "share.record.lock.duration.ms"
STEP_KIND: Final = "share group"
"""How ``admin ensure`` names the group's step."""

_UNREACHABLE: Final = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
    }
)
"""librdkafka's errors of a broker that could not be reached (or would not let us in), as
opposed to a call it refused."""


def wanted(settings: KafkaShareSettings) -> dict[str, str]:
    """The group configs ``settings`` set, by name."""
    return {
        AUTO_OFFSET_RESET: settings.auto_offset_reset,
        LOCK_DURATION_MS: str(settings.lock_duration_ms),
    }


class ShareGroupConfigs(Protocol):
    """Reading and setting a share group's configs on the brokers."""

    @property
    def address(self) -> str: ...

    def describe(self, group: str) -> dict[str, str]:
        """The configs set on ``group`` itself, by name (those at the broker's defaults left
        out); ``AdminUnreachable`` / ``AdminFailed``."""
        ...

    def set(self, group: str, configs: Mapping[str, str]) -> None:
        """Set ``configs`` on ``group`` (its other configs kept; the group need not exist
        yet); ``AdminUnreachable`` / ``AdminFailed`` naming what was refused."""
        ...


def plan(group: str, want: Mapping[str, str], have: Mapping[str, str]) -> Step:
    """The group's step: ``DIFFERS`` naming each config set on the group to another value;
    else ``CREATE`` with those not set on it (to be set); else ``OK``."""
    differences = [compare(name, value, have[name]) for name, value in want.items() if name in have]
    if any(d is not None for d in differences):
        return step(STEP_KIND, group, _text(want), differences)
    absent = {name: value for name, value in want.items() if name not in have}
    if absent:
        return Step(STEP_KIND, group, Outcome.CREATE, f"set {_text(absent)}")
    return Step(STEP_KIND, group, Outcome.OK, _text(want))


def ensure(
    admin: ShareGroupConfigs, group: str, want: Mapping[str, str], *, dry_run: bool = False
) -> Step:
    """Observe, plan, and (unless ``dry_run``) set the configs not set on the group yet."""
    have = admin.describe(group)
    planned = plan(group, want, have)
    if planned.outcome is Outcome.CREATE and not dry_run:
        admin.set(group, {name: value for name, value in want.items() if name not in have})
    return planned


def configure_share_group(admin: ShareGroupConfigs, settings: KafkaShareSettings) -> None:
    """The start-up check's part: set the group's configs to what ``settings`` want, whatever
    they were; ``SourceConfigError`` when the broker refuses (a lock out of its bounds...),
    ``AdminUnreachable`` (a ``SourceUnreachable``) when it does not answer."""
    try:
        admin.set(settings.group_id, wanted(settings))
    except AdminFailed as exc:
        raise SourceConfigError(
            f"cannot configure share group {settings.group_id!r} ({AUTO_OFFSET_RESET}, "
            f"{LOCK_DURATION_MS}; set configure_group = false to leave it as it is): {exc}"
        ) from exc


class ConfluentGroupConfigs:
    """``ShareGroupConfigs`` through confluent-kafka's ``AdminClient``; each call waits at most
    ``timeout_s``."""

    def __init__(self, client: AdminClient, *, address: str, timeout_s: float) -> None:
        self._client = client
        self._address = address
        self._timeout_s = timeout_s

    @classmethod
    def of(cls, settings: KafkaShareSettings, *, timeout_s: float) -> ConfluentGroupConfigs:
        """An admin client with the source's own address, SASL and TLS."""
        config: dict[str, str | int | float | bool] = {**settings.client_config()}
        try:
            client = AdminClient(config)
        except KafkaException as exc:
            raise SourceConfigError(
                f"cannot make a Kafka admin client for {settings.bootstrap_servers}: {exc}"
            ) from exc
        return cls(client, address=settings.bootstrap_servers, timeout_s=timeout_s)

    @property
    def address(self) -> str:
        return self._address

    def describe(self, group: str) -> dict[str, str]:
        resource = ConfigResource(ResourceType.GROUP, group)
        what = f"describing the configs of share group {group!r}"
        futures = self._client.describe_configs([resource], request_timeout=self._timeout_s)
        entries: dict[str, ConfigEntry] = self._wait(what, futures[resource])
        return {
            name: entry.value
            for name, entry in entries.items()
            if entry.value is not None
            and getattr(entry.source, "value", entry.source) == ConfigSource.GROUP_CONFIG.value
        }

    def set(self, group: str, configs: Mapping[str, str]) -> None:
        entries = [
            ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            for name, value in configs.items()
        ]
        resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
        futures = self._client.incremental_alter_configs(
            [resource], request_timeout=self._timeout_s
        )
        self._wait(f"setting {_text(configs)} on share group {group!r}", futures[resource])

    def _wait(self, what: str, future: Future[Any]) -> Any:
        try:
            return future.result(timeout=self._timeout_s)
        except TimeoutError as exc:
            raise AdminUnreachable(
                f"Kafka at {self._address} did not answer ({what}) within {self._timeout_s:g} s"
            ) from exc
        except KafkaException as exc:
            error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
            if error is not None and error.code() in _UNREACHABLE:
                raise AdminUnreachable(
                    f"Kafka at {self._address} did not answer ({what}): {error.str()}"
                ) from exc
            reason = error.str() if error is not None else str(exc)
            raise AdminFailed(f"Kafka at {self._address} refused {what}: {reason}") from exc


def _text(configs: Mapping[str, str]) -> str:
    return ", ".join(f"{name}={value}" for name, value in configs.items())


__all__ = [
    "AUTO_OFFSET_RESET",
    "LOCK_DURATION_MS",
    "ConfluentGroupConfigs",
    "ShareGroupConfigs",
    "configure_share_group",
    "ensure",
    "plan",
    "wanted",
]
