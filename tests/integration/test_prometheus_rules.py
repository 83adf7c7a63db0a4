"""The Prometheus rules and the Grafana dashboard against a real Prometheus (Debian's package)
scraping a real consumer process (Kafka, Triton's ``chaos`` model, a SQLite table): a poison
record fires ``RowbatchDeadLetters``, a model outage fires ``RowbatchPausedForBackoff``; every
rule evaluates without error, and every recording rule and every dashboard query returns data.

The rules are loaded as deploy/prometheus/rules has them except that every alert's ``for:`` is
cut to ``SHORT_FOR`` (production values: in the rules file and docs/observability.md), and
Prometheus scrapes and evaluates every second.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.chaos import ChaosControl
from harness.consumer_process import ConsumerProcess, to_toml
from harness.kafka import KafkaEndpoint
from harness.proc import LOOPBACK, free_port
from harness.prometheus import (
    CONSUMER_JOB,
    PrometheusEndpoint,
    PrometheusService,
    ScrapeJob,
    default_rule_files,
)
from harness.service import REPO_ROOT, RunDir
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import load_config
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, produce
from tests.integration.test_consumer_pubsub import text_chunk

pytestmark = pytest.mark.timeout(240)

DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "rowbatch-consumers.json"
SHORT_FOR = "2s"
RATE_INTERVAL = "1m"
"""What the dashboard's ``$__rate_interval`` becomes here (Grafana: at least 4 scrapes)."""
CHUNKS, ROWS_PER_CHUNK = 40, 50


def rules_with_short_for(dst: Path) -> list[Path]:
    """Copies of rowbatch's rule files in ``dst`` with every alert's ``for:`` cut to SHORT_FOR."""
    out = []
    for src in default_rule_files():
        doc = yaml.safe_load(src.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "for" in rule:
                    rule["for"] = SHORT_FOR
        path = dst / src.name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        out.append(path)
    return out


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel / legend, PromQL) of every dashboard target, its variables filled in."""
    dash = json.loads(DASHBOARD.read_text())
    return [
        (
            f"{panel['title']} / {target['legendFormat']}",
            target["expr"]
            .replace("$__rate_interval", RATE_INTERVAL)
            .replace('"$job"', f'"{CONSUMER_JOB}"'),
        )
        for panel in dash["panels"]
        for target in panel["targets"]
    ]


def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, consumer: ConsumerProcess
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        consumer.check_alive(what)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.25)


def has_finite_value(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(series["value"][1])) for series in result)


@pytest.fixture
def chaos(triton: TritonEndpoint) -> Iterator[TritonEndpoint]:
    ChaosControl().write(triton.chaos_control)
    yield triton
    ChaosControl().write(triton.chaos_control)


@pytest.fixture
def consumer(
    kafka: KafkaEndpoint, chaos: TritonEndpoint, tmp_path: Path
) -> Iterator[tuple[ConsumerProcess, KafkaTopics]]:
    topics = asyncio.run(KafkaTopics.create(kafka, partitions=3))
    config: dict[str, Any] = {
        "source": {
            "kind": "kafka",
            "bootstrap_servers": topics.bootstrap,
            "topic": topics.topic,
            "group_id": topics.group,
            "commit_interval_s": 0.5,
            "lag_interval_s": 0.5,
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "rows_per_s_per_replica": 1000.0,
            "target_latency_s": 1.0,
        },
        "model": {"url": chaos.grpc_url, "name": "chaos", "max_wait_ms": 50, "backoff_max_s": 0.5},
        "binding": {
            "inputs": {"text": "TEXT"},
            "outputs": {"EMBEDDING": "embedding"},
            "passthrough": {"id": "int64"},
        },
        "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "emb"},
        "server": {"host": LOOPBACK, "port": free_port()},
        "log_format": "text",
    }
    path = tmp_path / "consumer.toml"
    path.write_text(to_toml(config))
    load_config(path)  # a typo fails here, not in the child's log
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    proc = ConsumerProcess("c1", path, tmp_path / "consumer.log", config["server"]["port"], env)
    proc.start()
    try:
        yield proc, topics
    finally:
        proc.stop()


def test_alerts_fire_and_every_rule_and_panel_has_data(
    kafka: KafkaEndpoint,
    chaos: TritonEndpoint,
    consumer: tuple[ConsumerProcess, KafkaTopics],
    tmp_path: Path,
) -> None:
    proc, topics = consumer
    started = time.monotonic()
    rules = rules_with_short_for(tmp_path)
    job = ScrapeJob(CONSUMER_JOB, (f"{LOOPBACK}:{proc.port}",))
    with PrometheusService(RunDir(tmp_path / "prom"), [job], rules) as prom:
        wait_for(proc.ready, 60, "consumer ready", proc)
        # The dead-letter counter must be scraped at 0 before it moves, or increase() sees
        # no change: wait for a few scrapes of the running consumer first.
        wait_for(lambda: _scrapes(prom) >= 2, 30, "Prometheus scraping the consumer", proc)

        good = [chunk_record(text_chunk(n, ROWS_PER_CHUNK)) for n in range(CHUNKS)]
        # RowbatchDeadLetters fires from 10 dead letters in ten minutes: send 12 poison records.
        poison = [(b"poison", b"\x00garbage{", good[0][2])] * 12
        asyncio.run(produce(kafka, topics.topic, [*good[: CHUNKS // 2], *poison]))
        wait_for(
            lambda: (proc.metric("rowbatch_messages_dead_lettered_total") or 0) >= 12,
            60,
            "the poison records dead-lettered",
            proc,
        )
        wait_for(lambda: bool(prom.firing("RowbatchDeadLetters")), 30, "DLQ alert", proc)
        (dlq_alert,) = prom.firing("RowbatchDeadLetters")
        assert dlq_alert["labels"]["reason"] == "undecodable"
        assert dlq_alert["labels"]["job"] == CONSUMER_JOB

        ChaosControl.unavailable_for(120).write(chaos.chaos_control)
        asyncio.run(produce(kafka, topics.topic, good[CHUNKS // 2 :]))
        wait_for(
            lambda: prom.firing("RowbatchPausedForBackoff") != [],
            60,
            "paused-for-backoff alert",
            proc,
        )
        (paused_alert,) = prom.firing("RowbatchPausedForBackoff")
        assert paused_alert["labels"]["instance"] == job.targets[0]
        paused_at = time.monotonic() - started

        ChaosControl().write(chaos.chaos_control)
        wait_for(
            lambda: proc.rows_written() == CHUNKS * ROWS_PER_CHUNK, 60, "every row written", proc
        )
        wait_for(lambda: not prom.firing("RowbatchPausedForBackoff"), 30, "alert cleared", proc)

        unhealthy = [(r["name"], r.get("lastError")) for r in prom.rules() if r["health"] != "ok"]
        assert unhealthy == []
        recorded = [r["name"] for r in prom.rules() if r["type"] == "recording"]

        def no_data() -> list[str]:
            return [name for name in recorded if not has_finite_value(prom.query(name))]

        # A rule over the endpoints' health (namespace_job:rowbatch_server_saturated:min)
        # has no data while the endpoint is out: it comes back once the endpoint's health is
        # scraped again and the rule evaluated, a few seconds after the outage on a busy
        # machine.
        try:
            wait_for(lambda: no_data() == [], 30, "every recording rule with data", proc)
        except AssertionError:
            raise AssertionError(f"recording rules without data: {no_data()}") from None
        # Panels over metrics from outside the consumer that this Prometheus has no source for
        # are not checked here, each for the reason stated (the unit tests check that promtool
        # parses them and that they are scoped to the dashboard's consumers).
        not_here = {
            "kube_pod_container_status_restarts_total": "kube-state-metrics: no cluster here",
            "pubsub_googleapis_com:subscription_num_undelivered_messages": (
                "Cloud Monitoring via GKE managed Prometheus: none here (the broker is Kafka)"
            ),
            "rowbatch_rollout_": (
                "exported only with [model.candidate] (tests/integration/test_rollout.py reads "
                "them from the consumer's registry)"
            ),
        }
        queries, skipped = [], []
        for what, expr in dashboard_queries():
            reasons = [reason for name, reason in not_here.items() if name in expr]
            if reasons:
                skipped.append(f"{what} ({'; '.join(reasons)})")
            else:
                queries.append((what, expr))
        print("\ndashboard queries not checked: " + ", ".join(skipped))
        empty = [(what, expr) for what, expr in queries if not has_finite_value(prom.query(expr))]
        assert empty == [], f"dashboard queries without data: {empty}"
    assert proc.terminate(60) == 0, proc.log()  # a clean stop (the fixture only kills)
    print(
        f"\nboth alerts fired (the paused one {paused_at:.1f} s into the test); "
        f"{len(recorded)} recording rules and {len(queries)} dashboard queries have data; "
        f"test took {time.monotonic() - started:.1f} s"
    )


def _scrapes(prom: PrometheusEndpoint) -> int:
    """How many times Prometheus has scraped the consumer successfully (``up`` samples)."""
    result = prom.query(f'count_over_time(up{{job="{CONSUMER_JOB}"}}[1m])')
    up = prom.query(f'up{{job="{CONSUMER_JOB}"}} == 1')
    return int(float(result[0]["value"][1])) if result and up else 0
