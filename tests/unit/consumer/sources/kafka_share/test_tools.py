"""The operator's commands on a ``kind = "kafka-share"`` configuration, over fakes: ``admin
ensure`` plans the topic and dead-letter topic as for the classic source (with the share
settings' layout, over the same SASL/TLS options) and then the share group's configs (left
out, with a note, when ``configure_group = false``); the ``dlq`` commands read the dead-letter
topic as the classic source's and replay to the share group's topic."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from rowbatch.consumer.dlq.kafka_queue import KafkaDeadLetterQueue
from rowbatch.consumer.service import admin as admin_cmd
from rowbatch.consumer.service.config import load_config
from rowbatch.consumer.service.dlq_cli import open_queue
from rowbatch.consumer.sources.kafka import admin as kafka_admin
from rowbatch.consumer.sources.kafka_share import group_config
from rowbatch.consumer.sources.kafka_share.group_config import LOCK_DURATION_MS
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from tests.unit.consumer.sources.kafka_share.test_group_config import FakeGroups
from tests.unit.consumer.sources.test_admin_plan import FakeKafka

SHARE_TOML = """\
[source]
kind = "kafka-share"
bootstrap_servers = "127.0.0.1:9092"
topic = "rows"
group_id = "scorers"
security_protocol = "SASL_PLAINTEXT"
sasl_mechanism = "PLAIN"
sasl_plain_username = "u"
sasl_plain_password = "pw"
partitions = 2
replication_factor = 1
{extra}
[model]
name = "m"
[binding]
inputs = {{text = "TEXT"}}
outputs = {{OUT = "out"}}
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ROWBATCH_"):
            monkeypatch.delenv(name)


def config_file(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "share.toml"
    path.write_text(SHARE_TOML.format(extra=extra))
    return path


class Brokers:
    """A fake Kafka (topics) and fake share groups put in place of the real admin clients."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kafka = FakeKafka(address="127.0.0.1:9092")
        self.groups = FakeGroups(address="127.0.0.1:9092")
        self.options: list[Mapping[str, Any]] = []
        brokers = self

        class Admin:
            def __init__(self, options: Mapping[str, Any], timeout_s: float) -> None:
                brokers.options.append(options)

            async def __aenter__(self) -> FakeKafka:
                return brokers.kafka

            async def __aexit__(self, *exc: object) -> None:
                pass

        def groups_of(settings: KafkaShareSettings, *, timeout_s: float) -> FakeGroups:
            return self.groups

        monkeypatch.setattr(kafka_admin, "AioKafkaAdmin", Admin)
        monkeypatch.setattr(group_config.ConfluentGroupConfigs, "of", groups_of)

    def ensure(self, config: Path, *, dry_run: bool = False) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        code = admin_cmd.ensure_broker(config, dry_run=dry_run, out=out, err=err)
        return code, out.getvalue() + err.getvalue()


def test_admin_ensure_creates_both_topics_and_sets_the_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = Brokers(monkeypatch)
    config = config_file(tmp_path)
    code, text = brokers.ensure(config, dry_run=True)
    assert code == admin_cmd.EXIT_OK, text
    assert "dry run: nothing changed (3 to create, 0 differ)" in text
    assert (brokers.kafka.created, brokers.groups.sets) == ([], [])

    code, text = brokers.ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "create   topic rows (2 partitions, replication factor 1," in text
    assert "create   dead-letter topic rows.dlq (1 partitions, replication factor 1," in text
    assert "create   share group scorers (set share.auto.offset.reset=earliest," in text
    assert brokers.kafka.created == ["rows", "rows.dlq"]
    source = load_config(config).source
    assert isinstance(source, KafkaShareSettings)
    assert brokers.groups.groups["scorers"] == group_config.wanted(source)
    assert brokers.options[-1]["sasl_plain_password"] == "pw"  # the source's own security
    assert brokers.options[-1]["security_protocol"] == "SASL_PLAINTEXT"

    code, text = brokers.ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "created 0; 0 differ" in text
    assert "ok       share group scorers" in text


def test_a_group_lock_set_otherwise_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = Brokers(monkeypatch)
    brokers.groups.groups["scorers"] = {LOCK_DURATION_MS: "60000"}
    code, text = brokers.ensure(config_file(tmp_path))
    assert code == admin_cmd.EXIT_DIFFERS, text
    assert "share.record.lock.duration.ms is 60000, the config wants 30000" in text
    assert brokers.groups.sets == []


def test_configure_group_off_leaves_the_group_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    brokers = Brokers(monkeypatch)
    code, text = brokers.ensure(config_file(tmp_path, "configure_group = false"))
    assert code == admin_cmd.EXIT_OK, text
    assert not [line for line in text.splitlines() if "share group scorers" in line]
    assert "note: configure_group = false: the configs of share group 'scorers'" in text
    assert brokers.kafka.created == ["rows", "rows.dlq"]
    assert brokers.groups.sets == []


def test_the_dlq_commands_read_the_dead_letter_topic_as_a_classic_one(tmp_path: Path) -> None:
    config = load_config(config_file(tmp_path, 'dead_letter_topic = "rows-dead"'))
    queue = open_queue(config, timeout_s=1.0)
    assert isinstance(queue, KafkaDeadLetterQueue)
    assert queue.where == "Kafka topic rows-dead at 127.0.0.1:9092"
    assert queue.default_target == "rows"  # replayed to the share group's topic
    source = config.source
    assert isinstance(source, KafkaShareSettings)
    assert source.classic_view().client_options()["sasl_plain_username"] == "u"
