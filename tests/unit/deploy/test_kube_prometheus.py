"""deploy/k8s/kube-prometheus, checked offline: the committed PrometheusRule and dashboard
ConfigMap are what scripts/render_kube_prometheus.py makes of deploy/prometheus/rules and
deploy/grafana (and ``--check`` names a stale one); the kustomization renders with ``kubectl
kustomize``; the PrometheusRule validates against the Prometheus Operator's CRD schema
(deploy/k8s/schemas) and the ConfigMap against Kubernetes 1.32's; and both carry the labels a
default kube-prometheus-stack install selects by, the PrometheusRule the same ``release`` as the
base's PodMonitor."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.required_tools import require_tool
from tests.unit.deploy.kustomize import kustomize
from tests.unit.deploy.test_k8s import K8S, K8S_VERSION, ROOT, _crd_schema, _one

KUBE_PROMETHEUS = K8S / "kube-prometheus"
SCRIPT = ROOT / "scripts" / "render_kube_prometheus.py"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "rowbatch.rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "rowbatch-consumers.json"
# kube-prometheus-stack's defaults: Prometheus selects PrometheusRules and PodMonitors labelled
# with the Helm release's name; Grafana's sidecar loads ConfigMaps labelled grafana_dashboard=1.
RELEASE_LABEL = "release"
RELEASE = "kube-prometheus-stack"
SIDECAR_LABEL = ("grafana_dashboard", "1")
# `kubectl apply` (client-side) stores the whole object in an annotation of at most 256 KiB.
APPLY_ANNOTATION_LIMIT = 256 * 1024


@pytest.fixture
def kubectl() -> None:
    require_tool(
        "kubectl",
        "the kube-prometheus manifests (kubectl kustomize deploy/k8s/kube-prometheus)",
        "install kubectl (kustomize is built in)",
    )


@cache
def _generator() -> ModuleType:
    """scripts/render_kube_prometheus.py, imported from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("render_kube_prometheus", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@cache
def _rendered() -> tuple[dict[str, Any], ...]:
    return kustomize(KUBE_PROMETHEUS)


def _committed(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((KUBE_PROMETHEUS / name).read_text())
    return loaded


def _rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def _script(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_committed_manifests_are_what_the_generator_writes() -> None:
    expected: dict[Path, str] = _generator().render(ROOT)
    assert {path.name for path in expected} == {"prometheusrule.yaml", "grafana-dashboard.yaml"}
    for path, text in expected.items():
        assert (ROOT / path).read_text() == text, (
            f"{path} is stale: run python scripts/render_kube_prometheus.py"
        )
    done = _script("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_names_the_stale_file_and_a_run_brings_it_up_to_date(tmp_path: Path) -> None:
    for source in (RULES, DASHBOARD, *KUBE_PROMETHEUS.glob("*.yaml")):
        copy = tmp_path / source.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copy)
    rule = tmp_path / "deploy" / "k8s" / "kube-prometheus" / "prometheusrule.yaml"
    config_map = rule.with_name("grafana-dashboard.yaml")
    assert _script("--check", "--root", tmp_path).returncode == 0
    dashboard = tmp_path / DASHBOARD.relative_to(ROOT)
    changed = json.loads(dashboard.read_text())
    changed["title"] = "rowbatch consumers, changed"
    dashboard.write_text(json.dumps(changed, indent=2) + "\n")
    done = _script("--check", "--root", tmp_path)
    assert done.returncode == 1
    assert "grafana-dashboard.yaml is stale" in done.stderr
    assert "prometheusrule.yaml" not in done.stderr
    rule.unlink()
    done = _script("--check", "--root", tmp_path)
    assert done.returncode == 1
    assert "prometheusrule.yaml is stale" in done.stderr
    before = config_map.read_text()
    done = _script("--root", tmp_path)
    assert done.returncode == 0, done.stderr
    assert _script("--check", "--root", tmp_path).returncode == 0
    assert config_map.read_text() != before
    assert yaml.safe_load(config_map.read_text())["data"]["rowbatch-consumers.json"] == (
        dashboard.read_text()
    )
    assert yaml.safe_load(rule.read_text())["spec"]["groups"] == _rule_groups()


def test_the_prometheus_rule_holds_the_rule_files_groups_for_the_release() -> None:
    rule = _committed("prometheusrule.yaml")
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["name"] == "rowbatch"
    assert rule["metadata"]["labels"] == {RELEASE_LABEL: RELEASE}
    assert _generator().RELEASE == RELEASE
    assert list(rule["spec"]) == ["groups"]
    assert rule["spec"]["groups"] == _rule_groups()
    text = (KUBE_PROMETHEUS / "prometheusrule.yaml").read_text()
    assert "ruleSelector" in text, "the label's comment says what it must match"


def test_the_dashboard_config_map_is_the_dashboard_for_the_sidecar() -> None:
    config_map = _committed("grafana-dashboard.yaml")
    assert (config_map["apiVersion"], config_map["kind"]) == ("v1", "ConfigMap")
    assert config_map["metadata"]["name"] == "rowbatch-grafana-dashboard"
    key, value = SIDECAR_LABEL
    assert config_map["metadata"]["labels"] == {key: value}
    assert config_map["data"] == {"rowbatch-consumers.json": DASHBOARD.read_text()}
    size = len((KUBE_PROMETHEUS / "grafana-dashboard.yaml").read_bytes())
    assert size < APPLY_ANNOTATION_LIMIT // 2, f"{size} bytes: near kubectl apply's limit"


def test_renders_and_validates_offline(kubectl: None) -> None:
    docs = _rendered()
    assert sorted(d["kind"] for d in docs) == ["ConfigMap", "PrometheusRule"]
    for doc in docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/part-of"] == "rowbatch"
        if doc["kind"] == "PrometheusRule":
            schema = _crd_schema(doc["apiVersion"], doc["kind"])
            jsonschema.Draft202012Validator.check_schema(schema)
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
            assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
            assert doc["metadata"]["labels"][RELEASE_LABEL] == RELEASE
            assert doc["spec"]["groups"] == _rule_groups()
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            assert doc["metadata"]["labels"][SIDECAR_LABEL[0]] == SIDECAR_LABEL[1]
            assert doc["data"]["rowbatch-consumers.json"] == DASHBOARD.read_text()


def test_the_pod_monitor_is_selected_by_the_same_release(kubectl: None) -> None:
    (rule,) = [d for d in _rendered() if d["kind"] == "PrometheusRule"]
    monitor = _one("base", "PodMonitor")
    assert monitor["metadata"]["labels"][RELEASE_LABEL] == RELEASE
    assert rule["metadata"]["labels"][RELEASE_LABEL] == RELEASE


def test_the_prometheus_rule_schema_rejects_what_the_api_server_would() -> None:
    rule = _committed("prometheusrule.yaml")
    validator = jsonschema.Draft202012Validator(_crd_schema(rule["apiVersion"], rule["kind"]))
    assert validator.is_valid(rule)

    def changed(edit: Any) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(rule))
        edit(copy["spec"]["groups"][1])
        return copy

    def typo(group: dict[str, Any]) -> None:
        group["rules"][0]["alerts"] = group["rules"][0].pop("alert")

    def no_expr(group: dict[str, Any]) -> None:
        del group["rules"][0]["expr"]

    def no_name(group: dict[str, Any]) -> None:
        del group["name"]

    def bad_duration(group: dict[str, Any]) -> None:
        group["rules"][1]["for"] = "5 minutes"

    def number_annotation(group: dict[str, Any]) -> None:
        group["rules"][0]["annotations"]["summary"] = 5

    for edit in (typo, no_expr, no_name, bad_duration, number_annotation):
        assert not validator.is_valid(changed(edit)), edit.__name__
