"""Secrets never appear in what the consumer prints or serves: a real consumer process
(``python -m rowbatch.consumer run``) whose PostgreSQL DSN, given in ``ROWBATCH_SINK__DSN``, carries
a password, logging at DEBUG level; its whole stdout/stderr and its ``/metrics`` body are searched
for the password.

The session's PostgreSQL authenticates by ``trust`` (see ``harness/postgres.py``), so any
password is accepted: the role made here has one all the same, and what matters is that it
is never printed. Start-up failures are provoked with a server that is not there (a closed
port) and a database that does not exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from harness.consumer_process import ConsumerProcess, to_toml
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from harness.service import REPO_ROOT
from harness.triton import TritonEndpoint
from rowbatch.consumer.sinks.settings import PostgresSinkSettings
from tests.integration.consumer_helpers import Topics
from tests.integration.test_consumer_pubsub import scorer_chunks

PASSWORD = f"Pw-{uuid.uuid4().hex[:12]}-s3cret"
"""The role's password: unique, so finding it anywhere is a leak."""

SCORER_BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}


@dataclass(frozen=True)
class Role:
    name: str
    endpoint: PostgresEndpoint

    def url(self, *, port: int | None = None, dbname: str | None = None) -> str:
        e = self.endpoint
        return f"postgresql://{self.name}:{PASSWORD}@{e.host}:{port or e.port}/{dbname or e.dbname}"

    def keywords(self, *, port: int | None = None, dbname: str | None = None) -> str:
        e = self.endpoint
        return (
            f"host={e.host} port={port or e.port} dbname={dbname or e.dbname} "
            f"user={self.name} password={PASSWORD} connect_timeout=5"
        )


@pytest.fixture(scope="module")
def role(postgres: PostgresEndpoint) -> Iterator[Role]:
    name = f"rb_secret_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f"GRANT CREATE, USAGE ON SCHEMA public TO {name}")
    yield Role(name, postgres)
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"DROP OWNED BY {name}")
        conn.execute(f"DROP ROLE {name}")


def write_config(
    tmp_path: Path, topics: Topics, triton: TritonEndpoint, port: int, log_format: str
) -> Path:
    sink: dict[str, Any] = {"kind": "postgres", "table": f"secret_{uuid.uuid4().hex[:8]}"}
    if "startup_wait_s" in PostgresSinkSettings.model_fields:
        sink["startup_wait_s"] = 3  # an unreachable database fails start-up soon
    config = {
        "source": {
            "kind": "pubsub",
            "subscription": topics.subscription,
            "dead_letter_topic": topics.dlq_topic,
            "max_lease_extension_s": 10,
        },
        "model": {"url": triton.grpc_url, "name": "scorer", "max_wait_ms": 50},
        "binding": SCORER_BINDING,
        "sink": sink,  # the DSN comes from ROWBATCH_SINK__DSN
        "server": {"host": "127.0.0.1", "port": port},
        "log_format": log_format,
        "log_level": "DEBUG",
    }
    path = tmp_path / f"consumer-{port}.toml"
    path.write_text(to_toml(config))
    return path


def child_env(pubsub: PubSubEndpoint, dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    return env | pubsub.env() | {"ROWBATCH_SINK__DSN": dsn}


def assert_no_password(text: str, where: str) -> None:
    assert PASSWORD not in text, f"the password leaked into {where}:\n{text[-4000:]}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("form", "failure", "log_format"),
    [
        ("url", "closed-port", "json"),
        ("keywords", "closed-port", "text"),
        ("url", "no-database", "text"),
        ("keywords", "no-database", "json"),
    ],
)
def test_a_failed_start_never_prints_the_password(
    form: str,
    failure: str,
    log_format: str,
    role: Role,
    topics: Topics,
    pubsub: PubSubEndpoint,
    triton: TritonEndpoint,
    tmp_path: Path,
) -> None:
    where: dict[str, Any] = (
        {"port": free_port()} if failure == "closed-port" else {"dbname": "no_such_db"}
    )
    dsn = role.url(**where) if form == "url" else role.keywords(**where)
    port = free_port()
    path = write_config(tmp_path, topics, triton, port, log_format)
    log = tmp_path / "consumer.log"
    proc = ConsumerProcess("failing", path, log, port, child_env(pubsub, dsn))
    try:
        proc.start()
        code = proc.wait(150)
    finally:
        proc.stop()
    text = log.read_text(errors="replace")
    assert code == 2, f"exit {code} (2: a failed start-up check):\n{text[-4000:]}"
    assert "PostgreSQL" in text or "postgres" in text.lower(), text[-4000:]
    expected = str(where["port"]) if failure == "closed-port" else "no_such_db"
    assert expected in text, f"the error does not say what failed:\n{text[-4000:]}"
    assert_no_password(text, f"the consumer's output ({form} DSN, {failure})")


@pytest.mark.timeout(240)
def test_a_normal_run_never_prints_or_serves_the_password(
    role: Role,
    topics: Topics,
    pubsub: PubSubEndpoint,
    triton: TritonEndpoint,
    tmp_path: Path,
) -> None:
    total = 400
    chunks, _ = scorer_chunks(total, seed=7)
    topics.publish(chunks)
    # something to complain about: an undecodable message is dead-lettered with a warning
    topics.publish_raw(b"\x00not a chunk", dict(chunks[0].attributes))
    port = free_port()
    path = write_config(tmp_path, topics, triton, port, "json")
    log = tmp_path / "consumer.log"
    proc = ConsumerProcess("normal", path, log, port, child_env(pubsub, role.url()))
    bodies: list[str] = []
    try:
        proc.start()
        deadline = time.monotonic() + 120
        while proc.rows_written() < total:
            proc.check_alive(f"{total} rows written")
            assert time.monotonic() < deadline, f"rows not written in time:\n{proc.log()}"
            time.sleep(0.2)
        while (proc.metric("rowbatch_messages_dead_lettered_total") or 0) < 1:
            proc.check_alive("the dead letter")
            assert time.monotonic() < deadline, f"no dead letter in time:\n{proc.log()}"
            time.sleep(0.2)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            bodies.append(answer.read().decode())
        code = proc.terminate(60)
    finally:
        proc.stop()
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]
    assert "rowbatch_rows_written_total" in bodies[0]
    assert_no_password(bodies[0], "/metrics")
    assert_no_password(text, "the consumer's output")
    with psycopg.connect(role.endpoint.dsn) as conn:
        owner = conn.execute(
            "SELECT tablename FROM pg_tables WHERE tableowner = %s",
            (role.name,),
        ).fetchall()
    assert owner, "the consumer did not write as the role whose password it was given"


def run_check(tmp_path: Path, env: dict[str, str], sink: dict[str, Any]) -> tuple[int, str]:
    config = {
        "source": {"kind": "pubsub", "subscription": "projects/p/subscriptions/sub"},
        "model": {"url": "127.0.0.1:1", "name": "scorer"},
        "binding": SCORER_BINDING,
        "sink": sink,
    }
    path = tmp_path / "check.toml"
    path.write_text(to_toml(config))
    done = subprocess.run(
        [sys.executable, "-m", "rowbatch.consumer", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("case", "sink", "env_dsn", "names"),
    [
        # a DSN for a sink kind that has none
        ("dsn-on-sqlite", {"kind": "sqlite"}, "url", "sink.sqlite.dsn"),
        # a misspelt field next to the DSN, the whole section from one variable
        ("misspelt-field", {"kind": "postgres", "dsn": "url", "tabel": "t"}, None, "tabel"),
        # a wrong type in the DSN's section
        ("bad-type", {"kind": "postgres", "table": 5}, "keywords", "sink.postgres.table"),
    ],
)
def test_check_with_a_dsn_config_error_never_prints_the_password(
    case: str,
    sink: dict[str, Any],
    env_dsn: str | None,
    names: str,
    role: Role,
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    dsns = {"url": role.url(), "keywords": role.keywords()}
    if env_dsn is not None:
        env["ROWBATCH_SINK__DSN"] = dsns[env_dsn]
    if sink.get("dsn") == "url":
        env["ROWBATCH_SINK"] = json.dumps({**sink, "dsn": dsns["url"]})
        sink = {"kind": "postgres", "dsn": "placeholder"}
    code, output = run_check(tmp_path, env, sink)
    assert code == 2, output
    assert names in output, output
    assert_no_password(output, f"rowbatch-consumer check's output ({case})")
