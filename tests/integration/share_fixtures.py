"""The ``share_kafka`` fixture: a Kafka broker with share groups (KIP-932) of a test module's own.

The session's broker (``kafka``, Kafka 4.1.1) has share groups off, so the share-group tests
run on a second one, Kafka 4.4.0 (``harness.kafka.share.share_kafka_service``), next to it in
the session's run dir under a name of its own (data in ``<run dir>/kafka-share-<id>/``, log in
``<run dir>/logs/kafka-share-<id>.log``), on free ports. It is started once per module that
uses it and stopped at the module's end, by its pid, however the module's tests ended.

Import it where it is used: ``share_kafka = share_fixtures.share_kafka`` (where pytest finds
it) after ``from tests.integration import share_fixtures``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Iterator

import pytest

from harness.kafka import KafkaEndpoint
from harness.kafka.share import share_kafka_service
from harness.service import RunDir

__all__ = ["share_kafka"]


@pytest.fixture(scope="module")
def share_kafka(run_dir: RunDir) -> Iterator[KafkaEndpoint]:
    """A running Kafka 4.4.0 broker with share groups, for the module; yields its endpoint."""
    service = share_kafka_service(run_dir, name=f"kafka-share-{uuid.uuid4().hex[:8]}")
    pid: int | None = None
    try:
        endpoint = service.start()  # stops what it started itself when it fails
        pid = endpoint.pid
        yield endpoint
    finally:
        service.stop()  # SIGTERM to the broker's process group, SIGKILL after 15 s
        if pid is not None:
            _kill_group_if_alive(pid)


def _kill_group_if_alive(pid: int) -> None:
    """SIGKILL the broker's process group if anything of it is left (it leads its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, 0)
        os.killpg(pid, signal.SIGKILL)
