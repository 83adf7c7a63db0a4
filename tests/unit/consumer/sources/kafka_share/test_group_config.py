"""A share group's configs (``share.auto.offset.reset``, ``share.record.lock.duration.ms``):
``admin ensure``'s plan of them (set those not set on the group; fine when they are what the
configuration wants; one set to another value named and left alone; a dry run sets nothing),
the start-up check's setting of them (a refusal is a configuration error that says how to opt
out), and confluent-kafka's answers mapped to "refused" or "did not answer"."""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import ConfigEntry, ConfigResource, ConfigSource

from rowbatch.consumer.sources.admin_plan import AdminFailed, AdminUnreachable, Outcome
from rowbatch.consumer.sources.base import SourceConfigError, SourceUnreachable
from rowbatch.consumer.sources.kafka_share import group_config
from rowbatch.consumer.sources.kafka_share.group_config import (
    AUTO_OFFSET_RESET,
    LOCK_DURATION_MS,
    ConfluentGroupConfigs,
)
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings

WANT = {AUTO_OFFSET_RESET: "earliest", LOCK_DURATION_MS: "30000"}


def settings(**extra: Any) -> KafkaShareSettings:
    return KafkaShareSettings.model_validate(
        {"bootstrap_servers": "b:9092", "topic": "rows", "group_id": "scorers", **extra}
    )


@dataclass
class FakeGroups:
    """Share groups' configs set on the groups themselves, by group."""

    groups: dict[str, dict[str, str]] = field(default_factory=dict)
    sets: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    refuse: str | None = None
    address: str = "k:9092"

    def describe(self, group: str) -> dict[str, str]:
        return dict(self.groups.get(group, {}))

    def set(self, group: str, configs: Mapping[str, str]) -> None:
        if self.refuse is not None:
            raise AdminFailed(self.refuse)
        self.groups.setdefault(group, {}).update(configs)
        self.sets.append((group, dict(configs)))


def test_what_the_settings_want() -> None:
    assert group_config.wanted(settings()) == WANT
    assert group_config.wanted(settings(auto_offset_reset="latest", lock_duration_s=45)) == {
        AUTO_OFFSET_RESET: "latest",
        LOCK_DURATION_MS: "45000",
    }


def test_configs_not_set_on_the_group_are_set_once() -> None:
    fake = FakeGroups()
    first = group_config.ensure(fake, "scorers", WANT)
    assert first.outcome is Outcome.CREATE
    assert first.describe() == (
        "create   share group scorers "
        "(set share.auto.offset.reset=earliest, share.record.lock.duration.ms=30000)"
    )
    assert fake.sets == [("scorers", WANT)]
    second = group_config.ensure(fake, "scorers", WANT)
    assert second.outcome is Outcome.OK
    assert len(fake.sets) == 1


def test_only_the_absent_ones_are_set() -> None:
    fake = FakeGroups({"scorers": {AUTO_OFFSET_RESET: "earliest"}})
    planned = group_config.ensure(fake, "scorers", WANT)
    assert planned.outcome is Outcome.CREATE
    assert fake.sets == [("scorers", {LOCK_DURATION_MS: "30000"})]


def test_a_dry_run_sets_nothing() -> None:
    fake = FakeGroups()
    assert group_config.ensure(fake, "scorers", WANT, dry_run=True).outcome is Outcome.CREATE
    assert fake.sets == []


def test_a_config_set_otherwise_is_named_and_left_alone() -> None:
    fake = FakeGroups({"scorers": {LOCK_DURATION_MS: "60000"}})
    planned = group_config.ensure(fake, "scorers", WANT)
    assert planned.outcome is Outcome.DIFFERS
    assert [(d.field, d.want, d.have) for d in planned.differences] == [
        (LOCK_DURATION_MS, "30000", "60000")
    ]
    assert fake.sets == []  # not even the absent share.auto.offset.reset


def test_start_up_sets_them_whatever_they_were() -> None:
    fake = FakeGroups({"scorers": {LOCK_DURATION_MS: "60000"}})
    group_config.configure_share_group(fake, settings())
    assert fake.groups["scorers"] == WANT


def test_a_refusal_at_start_up_says_how_to_opt_out() -> None:
    fake = FakeGroups(refuse="INVALID_CONFIG: share.record.lock.duration.ms must be in range")
    with pytest.raises(SourceConfigError, match="configure_group = false") as err:
        group_config.configure_share_group(fake, settings())
    assert "'scorers'" in str(err.value)
    assert "INVALID_CONFIG" in str(err.value)


# --- confluent-kafka's answers ----------------------------------------------------------------


def done(value: Any = None, error: BaseException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)
    return future


class FakeAdminClient:
    """What ``ConfluentGroupConfigs`` calls of confluent-kafka's ``AdminClient``."""

    def __init__(self, answer: Future[Any]) -> None:
        self.answer = answer
        self.altered: list[ConfigResource] = []

    def describe_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]:
        return {resources[0]: self.answer}

    def incremental_alter_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> dict[ConfigResource, Future[Any]]:
        self.altered.extend(resources)
        return {resources[0]: self.answer}


def configs(answer: Future[Any], timeout_s: float = 5.0) -> ConfluentGroupConfigs:
    return ConfluentGroupConfigs(
        FakeAdminClient(answer),  # type: ignore[arg-type]
        address="k:9092",
        timeout_s=timeout_s,
    )


def entry(name: str, value: str, source: ConfigSource, *, as_int: bool) -> ConfigEntry:
    """A described config; confluent-kafka 2.16 gives its source as the enum's int value (its
    type hint says ``ConfigSource``): both must count."""
    if as_int:
        return ConfigEntry(name, value, source=source.value)  # type: ignore[arg-type]
    return ConfigEntry(name, value, source=source)


@pytest.mark.parametrize("as_int", [True, False])
def test_describe_keeps_what_is_set_on_the_group(as_int: bool) -> None:
    """The broker lists every group config; only those whose source is the group count."""
    described = [
        (AUTO_OFFSET_RESET, "earliest", ConfigSource.GROUP_CONFIG),
        (LOCK_DURATION_MS, "30000", ConfigSource.DEFAULT_CONFIG),
        ("share.heartbeat.interval.ms", "1000", ConfigSource.STATIC_BROKER_CONFIG),
    ]
    entries = {n: entry(n, v, source, as_int=as_int) for n, v, source in described}
    assert configs(done(entries)).describe("scorers") == {AUTO_OFFSET_RESET: "earliest"}


def test_set_sends_every_config_as_a_set() -> None:
    fake = FakeAdminClient(done(None))
    ConfluentGroupConfigs(fake, address="k", timeout_s=1.0).set("scorers", WANT)  # type: ignore[arg-type]
    (resource,) = fake.altered
    assert resource.name == "scorers"
    assert {e.name: e.value for e in resource.incremental_configs} == WANT


def test_a_refusal_is_admin_failed_naming_the_call() -> None:
    refused = KafkaException(KafkaError(KafkaError.INVALID_CONFIG, "lock out of range"))
    with pytest.raises(AdminFailed, match=r"refused setting .*'scorers'.*lock out of range"):
        configs(done(error=refused)).set("scorers", WANT)


@pytest.mark.parametrize(
    "code", [KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._AUTHENTICATION]
)
def test_a_broker_that_does_not_answer_is_unreachable(code: int) -> None:
    down = KafkaException(KafkaError(code, "no broker"))
    with pytest.raises(AdminUnreachable, match="Kafka at k:9092 did not answer") as err:
        configs(done(error=down)).describe("scorers")
    assert isinstance(err.value, SourceUnreachable)


def test_no_answer_in_time_is_unreachable() -> None:
    """``Future.result`` past its timeout raises ``TimeoutError`` (given here, not waited)."""
    with pytest.raises(AdminUnreachable, match="within 5 s"):
        configs(done(error=TimeoutError())).describe("scorers")


def test_an_admin_client_of_the_settings_names_a_missing_tls_file(tmp_path: Path) -> None:
    bad = settings(security_protocol="SSL", ssl_cafile=str(tmp_path / "absent.pem"))
    with pytest.raises(SourceConfigError, match=r"absent\.pem"):
        ConfluentGroupConfigs.of(bad, timeout_s=1.0)
