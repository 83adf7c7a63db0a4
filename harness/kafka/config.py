"""The harness broker's configuration: its ``server.properties`` and a cluster id.

Settings chosen for tests (see :func:`server_properties`):

- ``auto.create.topics.enable=false``: topics exist only when a test creates them (with
  :func:`~harness.kafka.admin.create_topic`), so a typo or a race fails loudly instead of
  creating a one-off topic with default settings. Internal topics (``__consumer_offsets``) are
  still created on demand.
- ``num.partitions=6``; ``offsets.topic.num.partitions=6`` and
  ``transaction.state.log.num.partitions=6`` (instead of 50) so the first consumer group and the
  first transactional producer do not wait for 50 partitions to be created;
- ``group.initial.rebalance.delay.ms=0``: a group's first join completes at once;
- ``broker.session.timeout.ms=4000`` (9 s by default): a broker restarted after a crash
  registers again after ~4 s instead of ~9 s;
- replication factor 1 / min ISR 1 for every internal topic (one broker), the share
  coordinator's ``__share_group_state`` included.

A share-group broker (Kafka >= 4.2: :data:`~harness.kafka.jars.SHARE_KAFKA_VERSION`) adds
:data:`SHARE_BROKER_OVERRIDES` to these. Share groups themselves need no setting: a fresh 4.4
format gives ``share.version=2``.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from harness.proc import LOOPBACK


def server_properties(
    port: int,
    controller_port: int,
    log_dir: Path,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The broker's ``server.properties``: single-node KRaft with a static voter, on loopback."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "6",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "6",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "6",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # After a crash (SIGKILL) the new broker process can only register once the old one's
        # session has expired: 4 s instead of 9 s. Heartbeats every 0.5 s (default 2 s) keep
        # that well clear of a busy 2-core machine.
        "broker.session.timeout.ms": "4000",
        "broker.heartbeat.interval.ms": "500",
    }
    props.update(overrides or {})
    return props


SHARE_BROKER_OVERRIDES: Final[Mapping[str, str]] = MappingProxyType(
    {
        # __share_group_state with 6 partitions instead of 50 (as __consumer_offsets): the
        # first share group waits for fewer partitions to be created.
        "share.coordinator.state.topic.num.partitions": "6",
        # A group may set share.record.lock.duration.ms down to 1 s (the broker's floor for
        # this minimum; 15 s by default), so a test sees a lock expire quickly. The broker-wide
        # lock stays at its default (30 s).
        "group.share.min.record.lock.duration.ms": "1000",
        # A member's heartbeat every 1 s instead of 5 s (both the default and the minimum): a
        # second member gets its assignment within about a second of joining.
        "group.share.min.heartbeat.interval.ms": "1000",
        "group.share.heartbeat.interval.ms": "1000",
    }
)
"""``server.properties`` entries of the share-group tests' broker, on top of
:func:`server_properties` (whose ``overrides`` they are)."""


def write_properties(path: Path, props: Mapping[str, str]) -> None:
    """Writes ``props`` as a Java properties file."""
    lines = ["# Written by harness/kafka; rewritten on every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def random_cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints (Kafka's ``Uuid.randomUuid().toString()``:
    16 random bytes, URL-safe base64 without padding, never starting with ``-``), made here to
    save a JVM start."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text
