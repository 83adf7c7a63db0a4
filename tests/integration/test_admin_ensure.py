"""``rowbatch-consumer admin ensure`` on the real Pub/Sub emulator and the real Kafka broker: a
dry run creates nothing, a run creates everything with the configured settings (read back from
the broker), a second run finds it all in place, an existing resource that differs is named
with exit code 3, and an unreachable broker is an error naming its address (exit code 4).
Each is one test, run on both brokers through a small adapter (:class:`AdminBroker`)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pstypes

from harness.kafka import KafkaEndpoint, create_topic
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from harness.service import REPO_ROOT
from rowbatch.consumer.service import admin as admin_cmd

_MODEL = """
[model]
name = "m"
[binding]
inputs = {text = "TEXT"}
outputs = {OUT = "out"}
"""


def _ensure(config: Path, *, dry_run: bool = False, timeout_s: float = 30) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = admin_cmd.ensure_broker(config, dry_run=dry_run, timeout_s=timeout_s, out=out, err=err)
    return code, out.getvalue() + err.getvalue()


class AdminBroker(Protocol):
    """One broker with fresh names for what ``admin ensure`` manages there."""

    resources: int
    """How many resources the configuration names (topics, subscriptions)."""

    def config(self, tmp_path: Path) -> Path:
        """The consumer's configuration naming them, with settings to create them with."""
        ...

    def assert_absent(self) -> None: ...

    def assert_created(self) -> None:
        """They exist, with the configured settings (read back from the broker)."""
        ...

    def assert_all_ok(self, text: str) -> None:
        """What a run that found everything in place says of each."""
        ...

    def make_one_that_differs(self) -> list[str]:
        """Creates the main resource with other settings; returns what the run must say."""
        ...

    def assert_unchanged(self) -> None:
        """The resource that differs is as it was made: an existing one is never changed."""
        ...


# --- Pub/Sub ---------------------------------------------------------------------------------


def _pubsub_config(tmp_path: Path, project: str, unique: str) -> Path:
    path = tmp_path / "pubsub.toml"
    path.write_text(
        f"""
[source]
kind = "pubsub"
subscription = "projects/{project}/subscriptions/in-{unique}"
topic = "projects/{project}/topics/in-{unique}"
dead_letter_topic = "projects/{project}/topics/dlq-{unique}"
max_delivery_attempts = 6
ack_deadline_s = 45
retry_min_backoff_s = 2
retry_max_backoff_s = 30
"""
        + _MODEL
    )
    return path


@dataclass
class PubSubAdmin:
    """A topic, its subscription, a dead-letter topic and the subscription that keeps what
    reaches it."""

    endpoint: PubSubEndpoint
    publisher: pubsub_v1.PublisherClient
    subscriber: pubsub_v1.SubscriberClient
    unique: str = field(default_factory=lambda: uuid.uuid4().hex[:10])
    resources: int = 4

    @property
    def topic(self) -> str:
        return f"projects/{self.endpoint.project}/topics/in-{self.unique}"

    @property
    def dlq(self) -> str:
        return f"projects/{self.endpoint.project}/topics/dlq-{self.unique}"

    @property
    def sub(self) -> str:
        return f"projects/{self.endpoint.project}/subscriptions/in-{self.unique}"

    def config(self, tmp_path: Path) -> Path:
        return _pubsub_config(tmp_path, self.endpoint.project, self.unique)

    def assert_absent(self) -> None:
        for name in (self.topic, self.dlq):
            with pytest.raises(gexc.NotFound):
                self.publisher.get_topic(topic=name)
        with pytest.raises(gexc.NotFound):
            self.subscriber.get_subscription(subscription=self.sub)

    def assert_created(self) -> None:
        got = pstypes.Subscription.pb(self.subscriber.get_subscription(subscription=self.sub))
        assert got.topic == self.topic
        assert got.ack_deadline_seconds == 45
        assert got.retry_policy.minimum_backoff.seconds == 2
        assert got.retry_policy.maximum_backoff.seconds == 30
        assert got.dead_letter_policy.dead_letter_topic == self.dlq
        assert got.dead_letter_policy.max_delivery_attempts == 7  # the consumer's 6, plus one
        kept = self.subscriber.get_subscription(subscription=f"{self.sub}-dlq")
        assert kept.topic == self.dlq

    def assert_all_ok(self, text: str) -> None:
        assert text.count("ok       ") == 4

    def make_one_that_differs(self) -> list[str]:
        self.publisher.create_topic(name=self.topic)
        self.subscriber.create_subscription(
            name=self.sub, topic=self.topic, ack_deadline_seconds=10
        )
        return [
            f"DIFFERS  subscription {self.sub}",
            "ack_deadline_seconds is 10, the config wants 45",
            "retry_policy is none",
            "dead_letter_policy.dead_letter_topic is none",
        ]

    def assert_unchanged(self) -> None:
        got = self.subscriber.get_subscription(subscription=self.sub)
        assert got.ack_deadline_seconds == 10, "an existing subscription is never changed"


@pytest.fixture
def emulator_env(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> PubSubEndpoint:
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    return pubsub


def _pubsub_admin(endpoint: PubSubEndpoint) -> Iterator[PubSubAdmin]:
    """With a publisher and a subscriber on the emulator, closed after the test."""
    publisher, subscriber = endpoint.publisher(), endpoint.subscriber()
    try:
        yield PubSubAdmin(endpoint, publisher, subscriber)
    finally:
        publisher.transport.close()
        subscriber.close()


# --- Kafka -----------------------------------------------------------------------------------


def _kafka_config(tmp_path: Path, bootstrap: str, topic: str) -> Path:
    path = tmp_path / "kafka.toml"
    path.write_text(
        f"""
[source]
kind = "kafka"
bootstrap_servers = "{bootstrap}"
topic = "{topic}"
group_id = "g-{topic}"
partitions = 3
replication_factor = 1
retention_ms = 3600000
"""
        + _MODEL
    )
    return path


async def _describe(endpoint: KafkaEndpoint, topics: list[str]) -> dict[str, int]:
    """Partition counts of the topics of ``topics`` that exist."""
    admin = AIOKafkaAdminClient(bootstrap_servers=endpoint.bootstrap_servers)
    await admin.start()
    try:
        listed = set(await admin.list_topics())
        present = [t for t in topics if t in listed]
        described = await admin.describe_topics(present) if present else []
        return {t["topic"]: len(t["partitions"]) for t in described}
    finally:
        await admin.close()


@dataclass
class KafkaAdmin:
    """A topic and its dead-letter topic."""

    endpoint: KafkaEndpoint
    topic: str = field(default_factory=lambda: f"in-{uuid.uuid4().hex[:10]}")
    resources: int = 2

    def config(self, tmp_path: Path) -> Path:
        return _kafka_config(tmp_path, self.endpoint.bootstrap_servers, self.topic)

    def _partitions(self) -> dict[str, int]:
        return asyncio.run(_describe(self.endpoint, [self.topic, f"{self.topic}.dlq"]))

    def assert_absent(self) -> None:
        assert self._partitions() == {}

    def assert_created(self) -> None:
        assert self._partitions() == {self.topic: 3, f"{self.topic}.dlq": 1}

    def assert_all_ok(self, text: str) -> None:
        assert f"ok       topic {self.topic}" in text
        assert f"ok       dead-letter topic {self.topic}.dlq" in text

    def make_one_that_differs(self) -> list[str]:
        asyncio.run(create_topic(self.endpoint, self.topic, 2, configs={"retention.ms": "60000"}))
        return [
            f"DIFFERS  topic {self.topic}: partitions is 2, the config wants 3",
            "retention.ms is 60000, the config wants 3600000",
            f"create   dead-letter topic {self.topic}.dlq",
        ]

    def assert_unchanged(self) -> None:
        assert self._partitions()[self.topic] == 2, "an existing topic is not changed"


# --- both ------------------------------------------------------------------------------------


@pytest.fixture(params=["kafka", "pubsub"])
def broker(request: pytest.FixtureRequest) -> Iterator[AdminBroker]:
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        yield KafkaAdmin(kafka)
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("emulator_env")
        yield from _pubsub_admin(pubsub)


def test_dry_run_then_create_then_nothing_to_do(broker: AdminBroker, tmp_path: Path) -> None:
    config = broker.config(tmp_path)
    code, text = _ensure(config, dry_run=True)
    assert code == admin_cmd.EXIT_OK, text
    assert f"{broker.resources} to create" in text
    broker.assert_absent()

    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert f"created {broker.resources}; 0 differ" in text
    broker.assert_created()

    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "created 0; 0 differ" in text
    broker.assert_all_ok(text)


def test_an_existing_resource_that_differs_is_named(broker: AdminBroker, tmp_path: Path) -> None:
    says = broker.make_one_that_differs()
    code, text = _ensure(broker.config(tmp_path))
    assert code == admin_cmd.EXIT_DIFFERS, text
    for line in says:
        assert line in text
    broker.assert_unchanged()


@pytest.mark.parametrize("kind", ["kafka", "pubsub"])
def test_an_unreachable_broker_is_named_by_its_address(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_port()}"
    if kind == "kafka":
        config, says = _kafka_config(tmp_path, address, "rows"), f"Kafka at {address}"
    else:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", address)
        config = _pubsub_config(tmp_path, "rowbatch-local", "nowhere")
        says = f"Pub/Sub at {address}"
    code, text = _ensure(config, timeout_s=2)
    assert code == admin_cmd.EXIT_UNREACHABLE, text
    assert f"{says} did not answer" in text


def test_the_command_line_runs_it(emulator_env: PubSubEndpoint, tmp_path: Path) -> None:
    config = _pubsub_config(tmp_path, emulator_env.project, uuid.uuid4().hex[:10])
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rowbatch.consumer",
            "admin",
            "ensure",
            "--config",
            str(config),
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={**os.environ, **emulator_env.env()},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "dry run: nothing changed (4 to create, 0 differ)" in done.stdout
