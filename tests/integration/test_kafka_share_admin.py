"""The operator's side of a ``kind = "kafka-share"`` source on a real Kafka 4.4.0 broker with
share groups, every client speaking SASL_PLAINTEXT (PLAIN) to it:

- ``rowbatch-consumer admin ensure`` creates the topic and its dead-letter topic with the
  configured layout, sets the share group's ``share.auto.offset.reset`` and
  ``share.record.lock.duration.ms`` (read back from the broker), finds everything in place on
  a second run, names a group config set to another value (exit 3) and leaves it, and names
  the address when the password is wrong;
- a share consumer over SASL writes every row (real Triton and PostgreSQL) and dead-letters
  the poison;
- ``rowbatch-consumer dlq stats`` / ``replay`` (the real command) read that dead-letter topic
  over SASL, and a replayed letter goes back to the share topic, where the running share group
  takes it and writes its rows.

The broker is this module's own: the harness's share broker (``share_kafka_service``) with a
SASL_PLAINTEXT listener beside its PLAINTEXT one (which the test itself uses to produce and
look)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, ResourceType

from harness.consumer_process import to_toml
from harness.kafka import KafkaEndpoint
from harness.kafka.share import set_share_group_config, share_kafka_service
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.service import REPO_ROOT, RunDir
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.dead_letter import ATTR_CODE, ATTR_REASON
from tests.integration.consumer_helpers import consumer_running, wait_until
from tests.integration.test_consumer_process import SCORER_BINDING, pg_count, unique_table
from tests.integration.test_kafka_share import chunks_of, produce, undecodable

pytestmark = pytest.mark.timeout(300)

USER, PASSWORD = "rowbatch", "share-pw"  # ASCII: server.properties is Latin-1
CLI_TIMEOUT_S = 120


@dataclass(frozen=True)
class SecureShareBroker:
    plain: KafkaEndpoint
    """The PLAINTEXT listener: for the test itself (producing, looking)."""
    sasl: str
    """The SASL_PLAINTEXT listener's ``127.0.0.1:port`` (PLAIN, user ``rowbatch``)."""


@pytest.fixture(scope="module")
def secure_share(run_dir: RunDir) -> Iterator[SecureShareBroker]:
    """A share broker (Kafka 4.4.0, the harness's share settings) with a SASL_PLAINTEXT
    listener beside its PLAINTEXT one, for the module; stopped by its pid at the end."""
    port, controller, sasl = free_port(), free_port(), free_port()
    client = [f"PLAINTEXT://127.0.0.1:{port}", f"SASL_PLAINTEXT://127.0.0.1:{sasl}"]
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{USER}="{PASSWORD}";'
    )
    service = share_kafka_service(
        run_dir,
        name=f"kafka-share-sasl-{uuid.uuid4().hex[:8]}",
        overrides={
            "listeners": ",".join([*client, f"CONTROLLER://127.0.0.1:{controller}"]),
            "advertised.listeners": ",".join(client),
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
        },
    )
    service._ports = (port, controller)  # the listeners above name them
    pid: int | None = None
    try:
        endpoint = service.start()  # stops what it started itself when it fails
        pid = endpoint.pid
        yield SecureShareBroker(endpoint, f"127.0.0.1:{sasl}")
    finally:
        service.stop()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 0)
                os.killpg(pid, signal.SIGKILL)


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def source(broker: SecureShareBroker, topic: str, group: str, **extra: Any) -> dict[str, Any]:
    """A kafka-share ``[source]`` on the SASL listener."""
    return {
        "kind": "kafka-share",
        "bootstrap_servers": broker.sasl,
        "topic": topic,
        "group_id": group,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": USER,
        "sasl_plain_password": PASSWORD,
        "partitions": 2,
        "replication_factor": 1,
        "retention_ms": 3_600_000,
        "dead_letter_partitions": 1,
        "lock_duration_s": 20,
        "members": 2,
        "max_poll_records": 8,
        **extra,
    }


def write_config(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(to_toml(config))
    return path


def minimal(src: dict[str, Any]) -> dict[str, Any]:
    """A configuration for the commands that read ``[source]`` only."""
    return {
        "source": src,
        "model": {"name": "m"},
        "binding": {"inputs": {"text": "TEXT"}, "outputs": {"OUT": "out"}},
    }


def command(config_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The real command, ``python -m rowbatch.consumer <args> --config FILE``."""
    return subprocess.run(
        [sys.executable, "-m", "rowbatch.consumer", *args, "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")},
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


# --- what the broker has (read on the PLAINTEXT listener) --------------------------------------


def admin(broker: SecureShareBroker) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.plain.bootstrap_servers})


def partitions(broker: SecureShareBroker, topic: str) -> int | None:
    topics = admin(broker).list_topics(timeout=30).topics
    return len(topics[topic].partitions) if topic in topics else None


def configs_of(broker: SecureShareBroker, kind: ResourceType, name: str) -> dict[str, Any]:
    resource = ConfigResource(kind, name)
    client = admin(broker)  # held until the answer came: a destroyed client fails its calls
    entries = client.describe_configs([resource], request_timeout=30)[resource].result(30)
    return dict(entries)


def group_configs(broker: SecureShareBroker, group: str) -> dict[str, str]:
    """The configs set on the share group itself."""
    return {
        name: entry.value
        for name, entry in configs_of(broker, ResourceType.GROUP, group).items()
        if getattr(entry.source, "value", entry.source) == ConfigSource.GROUP_CONFIG.value
    }


# --- admin ensure --------------------------------------------------------------------------------


def test_admin_ensure_creates_both_topics_and_sets_the_group(
    secure_share: SecureShareBroker, tmp_path: Path
) -> None:
    topic, group = unique("share-admin"), unique("share-admin-group")
    config = write_config(tmp_path / "share.toml", minimal(source(secure_share, topic, group)))

    dry = ok(command(config, "admin", "ensure", "--dry-run"))
    assert "dry run: nothing changed (3 to create, 0 differ)" in dry
    assert partitions(secure_share, topic) is None
    assert group_configs(secure_share, group) == {}

    created = ok(command(config, "admin", "ensure"))
    assert f"create   topic {topic} (2 partitions, replication factor 1" in created
    assert f"create   dead-letter topic {topic}.dlq (1 partitions" in created
    assert f"create   share group {group} (set share.auto.offset.reset=earliest" in created
    assert "created 3; 0 differ" in created
    assert (partitions(secure_share, topic), partitions(secure_share, f"{topic}.dlq")) == (2, 1)
    retention = configs_of(secure_share, ResourceType.TOPIC, topic)["retention.ms"].value
    assert retention == "3600000"
    assert group_configs(secure_share, group) == {
        "share.auto.offset.reset": "earliest",
        "share.record.lock.duration.ms": "20000",
    }

    again = ok(command(config, "admin", "ensure"))
    assert "created 0; 0 differ" in again
    assert f"ok       share group {group}" in again

    set_share_group_config(
        secure_share.plain.bootstrap_servers, group, **{"share.record.lock.duration.ms": "45000"}
    )
    differs = command(config, "admin", "ensure")
    assert differs.returncode == 3, (differs.stdout, differs.stderr)
    assert "share.record.lock.duration.ms is 45000, the config wants 20000" in differs.stdout
    assert group_configs(secure_share, group)["share.record.lock.duration.ms"] == "45000"


def test_admin_ensure_with_a_wrong_password_names_the_address(
    secure_share: SecureShareBroker, tmp_path: Path
) -> None:
    topic = unique("share-denied")
    wrong = source(secure_share, topic, unique("g"), sasl_plain_password="nope")
    config = write_config(tmp_path / "wrong.toml", minimal(wrong))
    result = command(config, "admin", "ensure", "--timeout", "5")
    assert result.returncode == 4, (result.stdout, result.stderr)
    assert secure_share.sasl in result.stderr
    assert partitions(secure_share, topic) is None


# --- a consumer, and the dlq commands --------------------------------------------------------


def produce_letter(broker: SecureShareBroker, dlq_topic: str, payload: bytes, headers: Any) -> None:
    """A dead letter as a consumer leaves one (the chunk, its headers, the reason)."""
    producer = Producer({"bootstrap.servers": broker.plain.bootstrap_servers, "acks": "all"})
    producer.produce(dlq_topic, value=payload, key=b"replay-me", headers=headers)
    assert producer.flush(60) == 0


@pytest.mark.timeout(420)
async def test_a_sasl_share_consumer_writes_every_row_and_its_dead_letters_replay(
    secure_share: SecureShareBroker,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
) -> None:
    total, rows, poison = 2_000, 50, 2
    topic, group = unique("share-sasl"), unique("share-sasl-group")
    table = unique_table("share_sasl")
    raw = {
        "source": source(secure_share, topic, group),
        "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 20},
        "binding": SCORER_BINDING,
        "sink": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
        "server": {"port": 0},
        "log_format": "text",
    }
    config_file = write_config(tmp_path / "consumer.toml", raw)
    ok(await asyncio.to_thread(command, config_file, "admin", "ensure"))
    chunks, _ = chunks_of(total, rows, seed=932)
    extra, _ = chunks_of(total + rows, rows, seed=933)  # one more chunk: ids past total
    letter = extra[-1]

    async with consumer_running(ConsumerConfig.model_validate(raw)) as run:
        await wait_until(lambda: bool(run.running), 60, "running", run.task)
        await asyncio.to_thread(produce, secure_share.plain, topic, chunks, poison)
        await wait_until(lambda: pg_count(postgres.dsn, table) == total, 180, "rows", run.task)
        registry = run.running[0].metrics.registry
        await wait_until(lambda: undecodable(registry) == poison, 60, "dead letters", run.task)

        stats = json.loads(
            ok(await asyncio.to_thread(command, config_file, "dlq", "stats", "--json"))
        )
        assert stats["by_reason"] == {"undecodable": poison}, stats

        headers = [*letter.attributes.items(), (ATTR_REASON, "rejected-by-sink")]
        headers.append((ATTR_CODE, "test"))
        await asyncio.to_thread(
            produce_letter, secure_share, f"{topic}.dlq", letter.payload, headers
        )
        replayed = await asyncio.to_thread(
            command, config_file, "dlq", "replay", "--reason", "rejected-by-sink"
        )
        summary = ok(replayed)
        assert "selected; replayed 1 " in summary and f"to {topic}" in summary, summary
        await wait_until(
            lambda: pg_count(postgres.dsn, table) == total + rows,
            120,
            "the replayed chunk's rows, taken by the share group",
            run.task,
        )

    after = json.loads(ok(await asyncio.to_thread(command, config_file, "dlq", "stats", "--json")))
    assert after["by_reason"] == {"undecodable": poison}, after
    with psycopg.connect(postgres.dsn) as conn:
        ids = [int(r[0]) for r in conn.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()]
    assert ids == list(range(total + rows)), "every row once, the replayed chunk's included"
