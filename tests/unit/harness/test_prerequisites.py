"""A missing prerequisite fails with one clear message naming it and how to get it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import postgres, pubsub
from harness.errors import PrerequisiteMissing
from harness.kafka import jars as kafka
from harness.proc import ServiceProcess, free_port
from harness.service import RunDir


def test_postgres_without_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Path, "glob", lambda self, pattern: iter(()))
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(
        PrerequisiteMissing, match=r"PostgreSQL server.*apt-get install -y postgresql"
    ):
        postgres.find_bindir()


def test_kafka_without_java(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(PrerequisiteMissing, match="java"):
        kafka._require_java()


def test_pubsub_rejects_unknown_forced_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROWBATCH_PUBSUB", "docker")
    with pytest.raises(ValueError, match="ROWBATCH_PUBSUB must be 'emulator' or 'pstest'"):
        pubsub._choose_kind()


def test_pubsub_without_emulator_or_go(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ROWBATCH_CACHE", str(tmp_path))
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(PrerequisiteMissing, match=r"pubsub-emulator.*Go"):
        pubsub._build_pstest()


def test_dead_process_is_reported_with_its_log(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    proc = ServiceProcess(
        name="broken",
        argv=["sh", "-c", "echo 'bind: Address already in use' >&2; exit 3"],
        log_path=run.log("broken"),
    )
    proc.start()
    try:
        with pytest.raises(RuntimeError, match=r"(?s)broken: exited with code 3.*Address already"):
            proc.wait_ready(lambda: False, timeout_s=30)
    finally:
        proc.stop()


def test_free_port_is_bindable() -> None:
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
