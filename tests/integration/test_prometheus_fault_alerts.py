"""The fault alerts of deploy/prometheus/rules against a real Prometheus (Debian's package)
scraping a real consumer process, each made by a real fault on a service of the test's own (the
session's broker and Triton are shared, so they are never stopped here):

- the Kafka broker the consumer reads stops, so its lag reads fail: ``RowbatchScalingSignalStale``
  fires (the lag's ``rowbatch_kafka_lag_updated_timestamp_seconds`` stops moving);
- the Triton the consumer sends its batches to stops: ``RowbatchModelEndpointsDown`` (and the
  per-endpoint ``RowbatchModelEndpointOut``) fire, and clear once the server is back.

The rules are test_prometheus_rules.py's copies (every ``for:`` cut to ``SHORT_FOR``), and
``RowbatchScalingSignalStale``'s fixed age threshold (120 s in the rules file) is cut to
``STALE_AFTER_S`` too, so the test takes seconds; Prometheus scrapes and evaluates every second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.consumer_process import ConsumerProcess, to_toml
from harness.kafka import KafkaEndpoint, KafkaService
from harness.proc import LOOPBACK, free_port
from harness.prometheus import CONSUMER_JOB, PrometheusEndpoint, PrometheusService, ScrapeJob
from harness.service import RunDir
from harness.triton import TritonEndpoint, TritonService
from rowbatch.consumer.service.config import load_config
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, produce
from tests.integration.test_consumer_pubsub import text_chunk
from tests.integration.test_prometheus_rules import _scrapes, rules_with_short_for, wait_for

pytestmark = pytest.mark.timeout(300)

STALE_ALERT = "RowbatchScalingSignalStale"
DOWN_ALERT = "RowbatchModelEndpointsDown"
OUT_ALERT = "RowbatchModelEndpointOut"
STALE_AFTER_S = 6
"""``RowbatchScalingSignalStale``'s age threshold here (the rules file: 120 s): well above
what the lag's age reaches while reads succeed (``LAG_INTERVAL_S`` plus a scrape)."""
LAG_INTERVAL_S = 0.5
ROWS_PER_CHUNK = 20


def _unique(prefix: str) -> str:
    return f"{prefix}-{time.monotonic_ns() % 10**9}"


def rules_for_faults(dst: Path) -> list[Path]:
    """test_prometheus_rules' copies of the rules (every ``for:`` cut short), with
    ``RowbatchScalingSignalStale``'s fixed threshold cut to ``STALE_AFTER_S``."""
    paths = rules_with_short_for(dst)
    patched = 0
    for path in paths:
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                if rule.get("alert") == STALE_ALERT:
                    rule["expr"], count = re.subn(
                        r">\s*120\s*$", f"> {STALE_AFTER_S}", rule["expr"]
                    )
                    assert count == 1, f"{STALE_ALERT}'s expression changed: {rule['expr']!r}"
                    patched += 1
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert patched == 1, f"{STALE_ALERT} not found once in {paths}"
    return paths


def consumer_config(
    bootstrap: str, topics: KafkaTopics, model_url: str, sink: Path
) -> dict[str, Any]:
    """test_prometheus_rules' consumer (the chaos model, a SQLite table, lag read every
    ``LAG_INTERVAL_S``), reading ``bootstrap`` and calling ``model_url``."""
    return {
        "source": {
            "kind": "kafka",
            "bootstrap_servers": bootstrap,
            "topic": topics.topic,
            "group_id": topics.group,
            "commit_interval_s": 0.5,
            "lag_interval_s": LAG_INTERVAL_S,
            "session_timeout_ms": 6000,
            "heartbeat_interval_ms": 1000,
            "rows_per_s_per_replica": 1000.0,
            "target_latency_s": 1.0,
        },
        "model": {"url": model_url, "name": "chaos", "max_wait_ms": 50, "backoff_max_s": 0.5},
        "binding": {
            "inputs": {"text": "TEXT"},
            "outputs": {"EMBEDDING": "embedding"},
            "passthrough": {"id": "int64"},
        },
        "sink": {"kind": "sqlite", "path": str(sink), "table": "emb"},
        "server": {"host": LOOPBACK, "port": free_port()},
        "log_format": "text",
    }


@contextlib.contextmanager
def running_consumer(config: dict[str, Any], tmp_path: Path) -> Iterator[ConsumerProcess]:
    """The consumer process of ``config``, killed by pid at the end whatever happens."""
    path = tmp_path / "consumer.toml"
    path.write_text(to_toml(config))
    load_config(path)  # a typo fails here, not in the child's log
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    proc = ConsumerProcess("c1", path, tmp_path / "consumer.log", config["server"]["port"], env)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def prometheus_on(proc: ConsumerProcess, tmp_path: Path) -> Iterator[PrometheusEndpoint]:
    """A Prometheus scraping ``proc`` with the fault rules, once it has scraped it twice."""
    rules = rules_for_faults(tmp_path)
    job = ScrapeJob(CONSUMER_JOB, (f"{LOOPBACK}:{proc.port}",))
    with PrometheusService(RunDir(tmp_path / "prom"), [job], rules) as prom:
        wait_for(proc.ready, 60, "consumer ready", proc)
        wait_for(lambda: _scrapes(prom) >= 2, 30, "Prometheus scraping the consumer", proc)
        yield prom


def active(prom: PrometheusEndpoint, alertname: str) -> list[str]:
    """The states (pending, firing) of the active alerts named ``alertname``."""
    return [a["state"] for a in prom.alerts() if a["labels"].get("alertname") == alertname]


@pytest.fixture
def own_broker(run_dir: RunDir) -> Iterator[KafkaService]:
    """A broker of this test's own (the session's is shared): stopped by the test, and in any
    case at the end (by its pid, through the harness); its data dir removed."""
    service = KafkaService(run_dir, name=_unique("kafka-prom-stale"))
    try:
        service.start()
        yield service
    finally:
        service.stop()
        shutil.rmtree(run_dir.root / service.name, ignore_errors=True)


@pytest.fixture
def own_triton(run_dir: RunDir) -> Iterator[TritonService]:
    """A tritonserver of this test's own serving only ``chaos`` (the session's is shared):
    stopped by the test, and in any case at the end; its data dir removed."""
    service = TritonService(run_dir, models=["chaos"], name=_unique("triton-prom-down"))
    try:
        service.start()
        yield service
    finally:
        service.stop()
        shutil.rmtree(run_dir.root / service.name, ignore_errors=True)


def test_scaling_signal_stale_fires_when_the_broker_is_unreachable(
    own_broker: KafkaService, triton: TritonEndpoint, tmp_path: Path
) -> None:
    started = time.monotonic()
    broker = own_broker.endpoint
    assert broker is not None
    topics = asyncio.run(KafkaTopics.create(broker, partitions=2))
    config = consumer_config(broker.bootstrap_servers, topics, triton.grpc_url, tmp_path / "r.db")
    updated = f'rowbatch_kafka_lag_updated_timestamp_seconds{{topic="{topics.topic}"}}'
    failures = f'rowbatch_kafka_lag_read_failures_total{{topic="{topics.topic}"}}'
    with running_consumer(config, tmp_path) as proc, prometheus_on(proc, tmp_path) as prom:
        # The lag is read and its age stays well under the threshold: no alert, not pending.
        wait_for(lambda: prom.query(updated) != [], 30, "the lag's timestamp scraped", proc)
        wait_for(lambda: _scrapes(prom) >= STALE_AFTER_S + 2, 30, "a few more scrapes", proc)
        assert active(prom, STALE_ALERT) == [], prom.alerts()
        assert float(prom.query(f"time() - {updated}")[0]["value"][1]) < STALE_AFTER_S / 2

        own_broker.stop()
        stopped = time.monotonic()
        wait_for(
            lambda: float((prom.query(failures) or [{"value": (0, "0")}])[0]["value"][1]) > 0,
            30,
            "failed lag reads scraped",
            proc,
        )
        wait_for(lambda: prom.firing(STALE_ALERT) != [], 60, f"{STALE_ALERT} firing", proc)
        fired_s = time.monotonic() - stopped
        (alert,) = prom.firing(STALE_ALERT)
        assert alert["labels"]["job"] == CONSUMER_JOB
        assert alert["labels"]["topic"] == topics.topic
        assert float(alert["value"]) > STALE_AFTER_S
        proc.check_alive("the end of the test")  # it rode out the outage, still serving /metrics
    print(
        f"\n{STALE_ALERT} fired {fired_s:.1f} s after the broker stopped "
        f"(threshold {STALE_AFTER_S} s); test took {time.monotonic() - started:.1f} s"
    )


def test_model_endpoints_down_fires_when_triton_stops_and_clears_when_it_is_back(
    kafka: KafkaEndpoint, own_triton: TritonService, tmp_path: Path
) -> None:
    started = time.monotonic()
    assert own_triton.ports is not None
    grpc_url = f"{LOOPBACK}:{own_triton.ports.grpc}"
    topics = asyncio.run(KafkaTopics.create(kafka, partitions=2))
    config = consumer_config(kafka.bootstrap_servers, topics, grpc_url, tmp_path / "r.db")
    chunks = [chunk_record(text_chunk(n, ROWS_PER_CHUNK)) for n in range(30)]
    healthy = f'rowbatch_endpoint_healthy{{endpoint="{grpc_url}"}}'
    with running_consumer(config, tmp_path) as proc, prometheus_on(proc, tmp_path) as prom:
        asyncio.run(produce(kafka, topics.topic, chunks[:10]))
        wait_for(lambda: proc.rows_written() == 10 * ROWS_PER_CHUNK, 60, "rows written", proc)
        wait_for(lambda: prom.query(f"{healthy} == 1") != [], 30, "endpoint healthy", proc)
        assert active(prom, DOWN_ALERT) == active(prom, OUT_ALERT) == [], prom.alerts()

        # With no traffic the consumer does not notice a dead server: send batches meanwhile.
        own_triton.stop()
        stopped = time.monotonic()
        asyncio.run(produce(kafka, topics.topic, chunks[10:20]))
        wait_for(lambda: prom.firing(DOWN_ALERT) != [], 60, f"{DOWN_ALERT} firing", proc)
        fired_s = time.monotonic() - stopped
        (alert,) = prom.firing(DOWN_ALERT)
        assert alert["labels"]["job"] == CONSUMER_JOB
        wait_for(lambda: prom.firing(OUT_ALERT) != [], 30, f"{OUT_ALERT} firing", proc)
        (out,) = prom.firing(OUT_ALERT)
        assert out["labels"]["endpoint"] == grpc_url
        assert proc.rows_written() == 10 * ROWS_PER_CHUNK  # nothing got through meanwhile

        own_triton.start()  # same ports: the consumer's probe finds it again
        asyncio.run(produce(kafka, topics.topic, chunks[20:]))
        wait_for(
            lambda: proc.rows_written() == len(chunks) * ROWS_PER_CHUNK,
            120,
            "every row written after the restart",
            proc,
        )
        wait_for(lambda: active(prom, DOWN_ALERT) == [], 30, f"{DOWN_ALERT} cleared", proc)
        wait_for(lambda: active(prom, OUT_ALERT) == [], 30, f"{OUT_ALERT} cleared", proc)
    print(
        f"\n{DOWN_ALERT} fired {fired_s:.1f} s after Triton stopped, and cleared once it was "
        f"back; test took {time.monotonic() - started:.1f} s"
    )
