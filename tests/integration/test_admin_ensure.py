"""``rowbatch-consumer admin ensure`` on the real Pub/Sub emulator and the real Kafka broker: a
dry run creates nothing, a run creates everything with the configured settings (read back from
the broker), a second run finds it all in place, an existing resource that differs is named
with exit code 3, and an unreachable broker is an error naming its address (exit code 4)."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

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


@pytest.fixture
def emulator_env(pubsub: PubSubEndpoint, monkeypatch: pytest.MonkeyPatch) -> PubSubEndpoint:
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    return pubsub


Clients = tuple[pubsub_v1.PublisherClient, pubsub_v1.SubscriberClient]


@pytest.fixture
def clients(emulator_env: PubSubEndpoint) -> Iterator[Clients]:
    """A publisher and a subscriber on the emulator, closed after the test."""
    publisher, subscriber = emulator_env.publisher(), emulator_env.subscriber()
    yield publisher, subscriber
    publisher.transport.close()
    subscriber.close()


def test_pubsub_dry_run_then_create_then_nothing_to_do(
    emulator_env: PubSubEndpoint, clients: Clients, tmp_path: Path
) -> None:
    project, unique = emulator_env.project, uuid.uuid4().hex[:10]
    config = _pubsub_config(tmp_path, project, unique)
    topic = f"projects/{project}/topics/in-{unique}"
    dlq = f"projects/{project}/topics/dlq-{unique}"
    sub = f"projects/{project}/subscriptions/in-{unique}"
    publisher, subscriber = clients
    code, text = _ensure(config, dry_run=True)
    assert code == admin_cmd.EXIT_OK, text
    assert "4 to create" in text
    for name in (topic, dlq):
        with pytest.raises(gexc.NotFound):
            publisher.get_topic(topic=name)
    with pytest.raises(gexc.NotFound):
        subscriber.get_subscription(subscription=sub)

    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "created 4; 0 differ" in text

    got = pstypes.Subscription.pb(subscriber.get_subscription(subscription=sub))
    assert got.topic == topic
    assert got.ack_deadline_seconds == 45
    assert got.retry_policy.minimum_backoff.seconds == 2
    assert got.retry_policy.maximum_backoff.seconds == 30
    assert got.dead_letter_policy.dead_letter_topic == dlq
    assert got.dead_letter_policy.max_delivery_attempts == 7  # the consumer's 6, plus one
    kept = subscriber.get_subscription(subscription=f"{sub}-dlq")
    assert kept.topic == dlq

    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "created 0; 0 differ" in text
    assert text.count("ok       ") == 4


def test_pubsub_existing_subscription_that_differs_is_named(
    emulator_env: PubSubEndpoint, clients: Clients, tmp_path: Path
) -> None:
    project, unique = emulator_env.project, uuid.uuid4().hex[:10]
    config = _pubsub_config(tmp_path, project, unique)
    topic = f"projects/{project}/topics/in-{unique}"
    sub = f"projects/{project}/subscriptions/in-{unique}"
    publisher, subscriber = clients
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=sub, topic=topic, ack_deadline_seconds=10)
    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_DIFFERS, text
    assert f"DIFFERS  subscription {sub}" in text
    assert "ack_deadline_seconds is 10, the config wants 45" in text
    assert "retry_policy is none" in text
    assert "dead_letter_policy.dead_letter_topic is none" in text
    got = subscriber.get_subscription(subscription=sub)
    assert got.ack_deadline_seconds == 10, "an existing subscription is never changed"


def test_pubsub_unreachable_names_the_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    address = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", address)
    config = _pubsub_config(tmp_path, "rowbatch-local", "nowhere")
    code, text = _ensure(config, timeout_s=2)
    assert code == admin_cmd.EXIT_UNREACHABLE, text
    assert f"Pub/Sub at {address} did not answer" in text


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


def test_kafka_dry_run_then_create_then_nothing_to_do(kafka: KafkaEndpoint, tmp_path: Path) -> None:
    topic = f"in-{uuid.uuid4().hex[:10]}"
    config = _kafka_config(tmp_path, kafka.bootstrap_servers, topic)

    code, text = _ensure(config, dry_run=True)
    assert code == admin_cmd.EXIT_OK, text
    assert "2 to create" in text
    assert asyncio.run(_describe(kafka, [topic, f"{topic}.dlq"])) == {}

    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "created 2; 0 differ" in text
    assert asyncio.run(_describe(kafka, [topic, f"{topic}.dlq"])) == {topic: 3, f"{topic}.dlq": 1}

    code, text = _ensure(config)
    assert code == admin_cmd.EXIT_OK, text
    assert "created 0; 0 differ" in text
    assert f"ok       topic {topic}" in text
    assert f"ok       dead-letter topic {topic}.dlq" in text


def test_kafka_existing_topic_that_differs_is_named(kafka: KafkaEndpoint, tmp_path: Path) -> None:
    topic = f"in-{uuid.uuid4().hex[:10]}"
    asyncio.run(create_topic(kafka, topic, 2, configs={"retention.ms": "60000"}))
    code, text = _ensure(_kafka_config(tmp_path, kafka.bootstrap_servers, topic))
    assert code == admin_cmd.EXIT_DIFFERS, text
    assert f"DIFFERS  topic {topic}: partitions is 2, the config wants 3" in text
    assert "retention.ms is 60000, the config wants 3600000" in text
    assert f"create   dead-letter topic {topic}.dlq" in text
    assert asyncio.run(_describe(kafka, [topic]))[topic] == 2, "an existing topic is not changed"


def test_kafka_unreachable_names_the_address(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    code, text = _ensure(_kafka_config(tmp_path, address, "rows"), timeout_s=2)
    assert code == admin_cmd.EXIT_UNREACHABLE, text
    assert f"Kafka at {address} did not answer" in text
