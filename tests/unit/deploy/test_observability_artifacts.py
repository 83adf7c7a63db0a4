"""deploy/prometheus/rules and deploy/grafana, checked offline: ``promtool`` accepts the rules and
their unit tests pass; every metric the rules and the dashboard name is one the consumer exports;
every alert is documented in docs/observability.md; every dashboard query is scoped to the
dashboard's job; and the harness's Prometheus configuration scrapes what it should."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import prometheus
from harness.errors import PrerequisiteMissing
from harness.prometheus import CONSUMER_JOB, ScrapeJob, local_stack_prometheus, render_config
from harness.service import REPO_ROOT, RunDir
from rowbatch.consumer.observe.lag import LagGauges
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.config import ServerSettings
from tests.required_tools import require_tool

RULES_DIR = REPO_ROOT / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "rowbatch.rules.yml"
RULES_TEST = RULES_DIR / "rowbatch.test.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "rowbatch-consumers.json"
DOC = REPO_ROOT / "docs" / "observability.md"

_METRIC = re.compile(r"(?<![:\w])rowbatch_[a-z0-9_]+")
_RECORDED = re.compile(r"\b[a-z_]+:rowbatch_[a-z0-9_]+:[a-z0-9_]+\b")
_SELECTOR = re.compile(r"(?<![:\w])(rowbatch_[a-z0-9_]+)(\{[^}]*\})?")


@pytest.fixture
def promtool() -> None:
    require_tool("promtool", "the alerting rules", "apt-get install -y prometheus")


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]


def exported_series_names() -> set[str]:
    """The sample names a consumer serves on /metrics (its registry with the Kafka lag
    gauges), with the suffixes Prometheus sees (``_total``, ``_bucket``...)."""
    metrics = Metrics()
    LagGauges(metrics.registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in metrics.registry.collect()
        for suffix in suffixes[family.type]
    }


def test_promtool_accepts_the_rules(promtool: None) -> None:
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_rule_unit_tests_pass(promtool: None) -> None:
    done = subprocess.run(
        ["promtool", "test", "rules", RULES_TEST.name],
        cwd=RULES_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_rules_and_dashboard_name_only_exported_metrics() -> None:
    exported = exported_series_names()
    exprs = [rule["expr"] for rule in _rules()] + _dashboard_exprs()
    named = {name for expr in exprs for name in _METRIC.findall(expr)}
    assert named - exported == set()
    # The alerts' and panels' subjects are all covered.
    for must in (
        "rowbatch_messages_dead_lettered_total",
        "rowbatch_paused",
        "rowbatch_kafka_lag",
        "rowbatch_desired_replicas",
        "rowbatch_batch_fill_ratio_sum",
        "rowbatch_sink_errors_total",
        "rowbatch_rows_written_total",
        "rowbatch_inflight_bytes",
        "rowbatch_budget_bytes",
        "rowbatch_end_to_end_seconds_bucket",
        "rowbatch_inference_seconds_bucket",
    ):
        assert must in named, must


def test_alerts_use_only_recorded_series_that_are_defined() -> None:
    rules = _rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    used = {name for rule in rules for name in _RECORDED.findall(rule["expr"])}
    assert used <= recorded, used - recorded


def test_every_alert_has_a_severity_and_a_documented_runbook() -> None:
    doc = DOC.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in doc.splitlines()
        if line.startswith("#")
    }
    alerts = [rule for rule in _rules() if "alert" in rule]
    assert {a["alert"] for a in alerts} >= {
        "RowbatchDeadLetters",
        "RowbatchPausedForBackoff",
        "RowbatchBacklogAboveTarget",
        "RowbatchBatchFillLow",
        "RowbatchSinkUnavailable",
        "RowbatchNoRowsWritten",
    }
    for alert in alerts:
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook"} <= set(alert["annotations"]), name
        page, anchor = alert["annotations"]["runbook"].split("#")
        assert page == "docs/observability.md", name
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section {anchor}"


def test_dashboard_panels_are_well_formed_and_scoped_to_the_job() -> None:
    dash = _dashboard()
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "job"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        grid = panel["gridPos"]
        own = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not own & cells, f"{panel['title']} overlaps another panel"
        assert grid["x"] + grid["w"] <= 24
        cells |= own
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            for name, labels in _SELECTOR.findall(target["expr"]):
                assert 'job=~"$job"' in labels, f"{panel['title']}: {name} not scoped to $job"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for subject in (
        "throughput",
        "batch fill",
        "batch size",
        "inference latency",
        "end-to-end latency",
        "lag",
        "desired vs current replicas",
        "dead letters by reason",
        "backoff",
        "in-flight bytes vs budget",
    ):
        assert subject in titles, subject


def test_config_scrapes_the_jobs_and_loads_the_rules(tmp_path: Path) -> None:
    jobs = [
        ScrapeJob("a", ("127.0.0.1:1", "127.0.0.1:2")),
        ScrapeJob("b", metrics_path="/m", file_sd_dir=tmp_path / "sd"),
    ]
    config = render_config(jobs, [RULES], scrape_interval_s=0.5, evaluation_interval_s=1)
    assert config["global"] == {
        "scrape_interval": "500ms",
        "scrape_timeout": "500ms",
        "evaluation_interval": "1000ms",
    }
    assert config["rule_files"] == [str(RULES)]
    a, b = config["scrape_configs"]
    assert a == {
        "job_name": "a",
        "metrics_path": "/metrics",
        "static_configs": [{"targets": ["127.0.0.1:1", "127.0.0.1:2"]}],
    }
    assert b["file_sd_configs"][0]["files"] == [str(tmp_path / "sd" / "*.json")]
    assert "static_configs" not in b


def test_default_rules_are_the_rule_files_not_their_tests() -> None:
    assert prometheus.default_rule_files() == [RULES]


def test_local_stack_scrapes_consumers_on_the_default_port_and_triton(tmp_path: Path) -> None:
    service = local_stack_prometheus(RunDir(tmp_path), "http://127.0.0.1:8002/metrics")
    consumers, triton = service.jobs
    server = ServerSettings()
    assert consumers.name == CONSUMER_JOB
    assert consumers.targets == (f"{server.host}:{server.port}",)
    assert consumers.file_sd_dir == tmp_path / "prometheus" / "targets"
    assert (triton.name, triton.targets, triton.metrics_path) == (
        "triton",
        ("127.0.0.1:8002",),
        "/metrics",
    )
    assert service.rule_files == [RULES]


def test_missing_prometheus_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.which", lambda name: None)
    with pytest.raises(PrerequisiteMissing, match=r"Prometheus.*apt-get install -y prometheus"):
        prometheus.find_binary()
