"""deploy/prometheus/rules and deploy/grafana, checked offline: ``promtool`` accepts the rules,
their unit tests pass and it parses every dashboard query; every metric the rules and the
dashboard name is one the consumer exports or one of the few named external ones; every alert's
runbook_url is a section of docs/observability.md; every dashboard query is scoped to the
dashboard's job (or subscription); and the harness's Prometheus configuration scrapes what it
should."""

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
from rowbatch.consumer.rollout.metrics import RolloutMetrics
from rowbatch.consumer.service.config import ServerSettings
from tests.required_tools import require_tool

RULES_DIR = REPO_ROOT / "deploy" / "prometheus" / "rules"
RULES = RULES_DIR / "rowbatch.rules.yml"
RULES_TEST = RULES_DIR / "rowbatch.test.yml"
#: GKE only (Cloud Monitoring's Pub/Sub metric): tests/unit/deploy/test_gmp_rules.py runs its
#: promtool tests; its alerts follow the same runbook conventions, checked here.
PUBSUB_RULES = REPO_ROOT / "deploy" / "prometheus" / "gmp" / "pubsub.rules.yml"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "rowbatch-consumers.json"
DOC = REPO_ROOT / "docs" / "observability.md"
CONSUMER_DEPLOYMENT = REPO_ROOT / "deploy" / "k8s" / "base" / "deployment.yaml"

#: The base every alert's ``runbook_url`` starts with, as the rules file's header states it
#: (``# runbook_url base: <URL>``): a fork changes it there and in the annotations.
_RUNBOOK_BASE = re.compile(r"^# runbook_url base: (\S+)$", re.MULTILINE)

#: The metrics the rules and the dashboard may name that the consumer does not export, each
#: with where it comes from and the text every query naming it must contain, which scopes it to
#: the dashboard's consumers (as ``job=~"$job"`` does the consumer's own metrics).
EXTERNAL_METRICS: dict[str, tuple[str, str]] = {
    # Prometheus' own series per scrape target: 1 while the consumer answers its scrape.
    "up": ("Prometheus (every scrape target)", 'up{job=~"$job"}'),
    # kube-state-metrics (installed by kube-prometheus-stack), joined on the pod to the
    # consumer targets: its series carry kube-state-metrics' job, not the consumers'.
    "kube_pod_container_status_restarts_total": (
        "kube-state-metrics",
        'and on (namespace, pod) up{job=~"$job"}',
    ),
    # Cloud Monitoring's Pub/Sub metric as GKE's managed Prometheus serves it; no job label,
    # scoped by the dashboard's subscription variable instead.
    "pubsub_googleapis_com:subscription_num_undelivered_messages": (
        "Cloud Monitoring (GKE managed Prometheus)",
        'subscription_id=~"$subscription"',
    ),
    # KEDA's operator (2.14 or later), per ScaledObject: the rowbatch.keda group's alert, scoped
    # to rowbatch's ScaledObjects by name (a dashboard query would be too).
    "keda_scaled_object_errors_total": (
        "KEDA's operator",
        'scaledObject=~".*rowbatch-consumer.*"',
    ),
}

_METRIC = re.compile(r"(?<![:\w])rowbatch_[a-z0-9_]+")
_RECORDED = re.compile(r"\b[a-z_]+:rowbatch_[a-z0-9_]+:[a-z0-9_]+\b")
_SELECTOR = re.compile(r"(?<![:\w])(rowbatch_[a-z0-9_]+)(\{[^}]*\})?")
# What is not a metric name in PromQL: strings, label matchers, ranges, grouping label lists,
# function and aggregation calls, keywords.
_NOT_NAMES = re.compile(
    r'"[^"]*"|\{[^}]*\}|\[[^\]]*\]'
    r"|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"
)
_IDENTIFIER = re.compile(r"(?<![\w:.$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring"}
_KEYWORDS |= {"group_left", "group_right", "inf", "nan"}


@pytest.fixture
def promtool() -> None:
    require_tool("promtool", "the alerting rules", "apt-get install -y prometheus")


def _rules(path: Path = RULES) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (including recorded series' names)."""
    bare = _NOT_NAMES.sub(" ", expr)
    return {n for n in _IDENTIFIER.findall(bare) if n.lower() not in _KEYWORDS}


def exported_series_names() -> set[str]:
    """The sample names a consumer serves on /metrics (its registry with the Kafka lag
    gauges, and a rollout's series: ``[model.candidate]``), with the suffixes Prometheus sees
    (``_total``, ``_bucket``...)."""
    metrics = Metrics()
    LagGauges(metrics.registry)
    RolloutMetrics(metrics.registry, "shadow", ["score"])
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
    # Every name, not only rowbatch_*: the consumer's, the rules' recorded series, or one of
    # the named external metrics; and each of those is used (the allow-list stays tight).
    recorded = {rule["record"] for rule in _rules() if "record" in rule}
    every = {name for expr in exprs for name in metric_names(expr)}
    assert every - exported - recorded - set(EXTERNAL_METRICS) == set()
    assert set(EXTERNAL_METRICS) <= every
    for rule in _rules():
        for name in metric_names(rule["expr"]) & set(EXTERNAL_METRICS) - {"up"}:
            scope = EXTERNAL_METRICS[name][1]
            assert scope in rule["expr"], f"{rule.get('alert')}: {name} not scoped by {scope}"
    assert metric_names(
        'sum by (pod) (increase(a_total{x="b"}[5m]) and on (namespace, pod) up{job=~"$job"})'
        " / ignoring (le) rate(job:c:rate1m[$__rate_interval]) > bool 0"
    ) == {"a_total", "up", "job:c:rate1m"}
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
        "rowbatch_server_saturated",
        "rowbatch_endpoint_server_queue_seconds",
        "rowbatch_endpoint_window",
        "rowbatch_oldest_unwritten_age_seconds",
    ):
        assert must in named, must


def test_alerts_use_only_recorded_series_that_are_defined() -> None:
    rules = _rules()
    recorded = {rule["record"] for rule in rules if "record" in rule}
    used = {name for rule in rules for name in _RECORDED.findall(rule["expr"])}
    assert used <= recorded, used - recorded


def test_every_alert_has_a_severity_and_a_documented_runbook() -> None:
    """kube-prometheus' convention: an absolute ``runbook_url``, here the rules file's one base
    and the alert's section of docs/observability.md."""
    (base,) = _RUNBOOK_BASE.findall(RULES.read_text())
    assert base.startswith("https://") and base.endswith("/docs/observability.md"), base
    doc = DOC.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in doc.splitlines()
        if line.startswith("#")
    }
    alerts = [rule for rule in _rules() + _rules(PUBSUB_RULES) if "alert" in rule]
    assert {a["alert"] for a in alerts} >= {
        "RowbatchDeadLetters",
        "RowbatchPausedForBackoff",
        "RowbatchBacklogAboveTarget",
        "RowbatchBatchFillLow",
        "RowbatchSinkUnavailable",
        "RowbatchNoRowsWritten",
        "RowbatchModelEndpointOut",
        "RowbatchModelServerBound",
        "RowbatchKedaScalerErrors",
        "RowbatchPubSubOldestUnacked",
    }
    for alert in alerts:
        name = alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook_url"} <= set(alert["annotations"]), name
        assert "runbook" not in alert["annotations"], f"{name}: runbook_url is the name"
        page, anchor = alert["annotations"]["runbook_url"].split("#")
        assert page == base, f"{name}: {page} is not the base {base}"
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section {anchor}"


def test_the_rule_tests_expect_the_rules_runbook_urls() -> None:
    """rowbatch.test.yml's expected annotations name the same runbook_url as the rules (promtool
    compares them; this names the difference when the base changes in one file only)."""
    urls = {a["annotations"]["runbook_url"] for a in _rules() if "alert" in a}
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    expected = {
        alert["exp_annotations"]["runbook_url"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        for alert in case.get("exp_alerts", [])
    }
    assert expected and expected <= urls, expected - urls


def test_dashboard_panels_are_well_formed_and_scoped_to_the_job() -> None:
    dash = _dashboard()
    names = {v["name"] for v in dash["templating"]["list"]}
    assert names == {"datasource", "job", "subscription"}
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
            for name in metric_names(target["expr"]) & set(EXTERNAL_METRICS):
                scope = EXTERNAL_METRICS[name][1]
                assert scope in target["expr"], f"{panel['title']}: {name} not scoped by {scope}"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for subject in (
        "throughput",
        "batch fill",
        "batch size",
        "inference latency",
        "end-to-end latency",
        "lag",
        "desired vs current replicas",
        "server-bound or subscriber-bound",
        "dead letters by reason",
        "backoff",
        "in-flight bytes vs budget",
        "consumers up",
        "pod restarts",
        "model server",
        "nacks and redeliveries",
        "pub/sub backlog",
    ):
        assert subject in titles, subject


def test_the_server_bound_panel_sits_beside_the_replicas_it_explains() -> None:
    """Whether the servers or the subscribers limit the flow is read next to the replica
    figure: per endpoint, saturated (the replica figure's rate-term switch), the server's
    queue time and the consumers' windows summed."""
    panels = {p["title"]: p for p in _dashboard()["panels"]}
    bound = panels["Server-bound or subscriber-bound"]
    replicas = panels["Desired vs current replicas"]
    assert bound["gridPos"]["y"] == replicas["gridPos"]["y"]
    assert bound["gridPos"]["x"] == replicas["gridPos"]["x"] + replicas["gridPos"]["w"]
    exprs = [target["expr"] for target in bound["targets"]]
    assert exprs == [
        'max by (endpoint) (rowbatch_server_saturated{job=~"$job"})',
        'max by (endpoint) (rowbatch_endpoint_server_queue_seconds{job=~"$job"})',
        'sum by (endpoint) (rowbatch_endpoint_window{job=~"$job"})',
    ]


def test_the_restarts_panel_counts_the_consumer_container() -> None:
    deployment = yaml.safe_load(CONSUMER_DEPLOYMENT.read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    restarts = [e for e in _dashboard_exprs() if "kube_pod_container_status_restarts_total" in e]
    assert restarts
    selector = f'kube_pod_container_status_restarts_total{{container="{container["name"]}"}}'
    for expr in restarts:
        assert selector in expr


def test_promtool_parses_every_dashboard_query(promtool: None, tmp_path: Path) -> None:
    """Each query, its Grafana variables filled in, as a recording rule ``promtool check
    rules`` parses (the integration test runs only those over the consumer's own metrics)."""
    filled = {
        "$__rate_interval": "1m",
        '"$job"': '".+"',
        '"$subscription"': '".+"',
    }
    exprs = []
    for query in _dashboard_exprs():
        expr = query
        for variable, value in filled.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, query
        exprs.append(expr)
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)],
            }
        ]
    }
    file = tmp_path / "dashboard.rules.yml"
    file.write_text(yaml.safe_dump(rules))
    done = subprocess.run(
        ["promtool", "check", "rules", str(file)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


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
