"""GKE's alerting, checked offline: the gke-pubsub overlay carries a managed-Prometheus
``Rules`` object with rowbatch's rule groups (all but KEDA's) and a ``GlobalRules`` object
with the Pub/Sub oldest-unacked alert; both are what scripts/gmp_rules.py makes of their
sources (``--check`` names a stale one), validate against the CRDs' schemas (with the CRDs'
CEL rules checked here), survive GMP's own rewriting (no rule may set or select the labels the
rule-evaluator scopes by, and durations must be Go durations, as the API server checks them),
pass ``promtool``, and the Pub/Sub alert watches the subscription the consumers read."""

from __future__ import annotations

import copy
import importlib.util
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema
import pytest
import yaml

from tests.required_tools import require_tool
from tests.unit.deploy.test_k8s import K8S, ROOT, _crd_schema, _one, _pod_config, _render

SCRIPT = ROOT / "scripts" / "gmp_rules.py"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "rowbatch.rules.yml"
PUBSUB_DIR = ROOT / "deploy" / "prometheus" / "gmp"
PUBSUB_RULES = PUBSUB_DIR / "pubsub.rules.yml"
OVERLAY = K8S / "overlays" / "gke-pubsub"
#: The groups GKE does not get: KEDA's (the overlay scales with an HPA).
LEFT_OUT = {"rowbatch.keda"}
#: What GMP's rule-evaluator adds to every rule of a Rules object (to its selectors and its
#: results): a rule that sets one of these labels, or selects on one, is rejected.
SCOPE_LABELS = ("project_id", "location", "cluster", "namespace")
#: The duration format the CRD declares (``format: duration``), which the API server checks
#: with Go's time.ParseDuration: no days or weeks, unlike Prometheus.
GO_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


@pytest.fixture
def promtool() -> None:
    require_tool("promtool", "the alerting rules", "apt-get install -y prometheus")


@cache
def _generator() -> ModuleType:
    """scripts/gmp_rules.py, imported from its file (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("gmp_rules", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations there
    spec.loader.exec_module(module)
    return module


def _script(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _groups(path: Path) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(path.read_text())["groups"]
    return groups


def _committed(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((OVERLAY / name).read_text())
    return loaded


def _rules_objects() -> list[dict[str, Any]]:
    return [_committed("rules.yaml"), _committed("pubsub-globalrules.yaml")]


def _every_rule(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in doc["spec"]["groups"] for rule in group["rules"]]


def test_the_committed_objects_are_what_the_generator_writes() -> None:
    expected: dict[Path, str] = _generator().render(ROOT)
    assert {path.name for path in expected} == {"rules.yaml", "pubsub-globalrules.yaml"}
    for path, text in expected.items():
        assert (ROOT / path).read_text() == text, f"{path} is stale: run python {SCRIPT.name}"
    done = _script("--check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_names_the_stale_file_and_a_run_brings_it_up_to_date(tmp_path: Path) -> None:
    for source in (
        RULES,
        PUBSUB_RULES,
        OVERLAY / "rules.yaml",
        OVERLAY / "pubsub-globalrules.yaml",
    ):
        copied = tmp_path / source.relative_to(ROOT)
        copied.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, copied)
    assert _script("--check", "--root", tmp_path).returncode == 0
    rules = tmp_path / RULES.relative_to(ROOT)
    rules.write_text(rules.read_text().replace("for: 30m", "for: 45m"))
    done = _script("--check", "--root", tmp_path)
    assert done.returncode == 1
    assert "rules.yaml is stale" in done.stderr
    assert "pubsub-globalrules.yaml" not in done.stderr
    assert _script("--root", tmp_path).returncode == 0
    assert _script("--check", "--root", tmp_path).returncode == 0
    written = yaml.safe_load((tmp_path / OVERLAY.relative_to(ROOT) / "rules.yaml").read_text())
    assert "45m" in [rule.get("for") for rule in _every_rule(written)]


def test_rules_hold_the_rule_files_groups_but_kedas() -> None:
    rules = _committed("rules.yaml")
    assert (rules["apiVersion"], rules["kind"]) == ("monitoring.googleapis.com/v1", "Rules")
    assert rules["metadata"] == {"name": "rowbatch"}, "the namespace is the one applied to"
    source = _groups(RULES)
    assert {g["name"] for g in source} >= LEFT_OUT, "the left-out group still exists"
    assert rules["spec"]["groups"] == [g for g in source if g["name"] not in LEFT_OUT]
    alerts = {r["alert"] for r in _every_rule(rules) if "alert" in r}
    assert {"RowbatchModelEndpointOut", "RowbatchConsumersDown", "RowbatchNoRowsWritten"} <= alerts
    assert "RowbatchKedaScalerErrors" not in alerts


def test_global_rules_hold_the_pubsub_alert() -> None:
    global_rules = _committed("pubsub-globalrules.yaml")
    assert (global_rules["apiVersion"], global_rules["kind"]) == (
        "monitoring.googleapis.com/v1",
        "GlobalRules",
    )
    assert global_rules["metadata"] == {"name": "rowbatch-pubsub"}
    assert global_rules["spec"]["groups"] == _groups(PUBSUB_RULES)
    (alert,) = _every_rule(global_rules)
    assert alert["alert"] == "RowbatchPubSubOldestUnacked"
    assert "pubsub_googleapis_com:subscription_oldest_unacked_message_age" in alert["expr"]
    assert alert["labels"]["severity"] in ("critical", "warning", "info")


def test_the_pubsub_alert_watches_the_consumers_subscription(tmp_path: Path) -> None:
    """GlobalRules see the whole project: the alert names the subscription the overlay's
    consumers read and its HPA scales on, not every subscription."""
    (alert,) = _every_rule(_committed("pubsub-globalrules.yaml"))
    watched = re.findall(r'subscription_id="([^"]+)"', alert["expr"])
    config = _pod_config("gke-pubsub", "Deployment", tmp_path)
    subscription = config.source.subscription  # type: ignore[union-attr]
    assert watched == [subscription.rsplit("/", 1)[-1]]
    hpa = _one("gke-pubsub", "HorizontalPodAutoscaler")
    (external,) = [m["external"] for m in hpa["spec"]["metrics"] if m["type"] == "External"]
    assert external["metric"]["selector"]["matchLabels"] == {
        "resource.labels.subscription_id": watched[0]
    }


def test_the_overlay_applies_both(tmp_path: Path) -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _render("gke-pubsub")}
    assert docs[("Rules", "rowbatch")]["spec"] == _committed("rules.yaml")["spec"]
    assert (
        docs[("GlobalRules", "rowbatch-pubsub")]["spec"]
        == (_committed("pubsub-globalrules.yaml")["spec"])
    )
    for kind in ("PrometheusRule", "PodMonitor"):
        assert kind not in {k for k, _ in docs}, f"GKE runs no Prometheus Operator: {kind}"


def test_the_objects_validate_against_the_crds() -> None:
    for doc in _rules_objects():
        schema = _crd_schema(doc["apiVersion"], doc["kind"])
        jsonschema.Draft202012Validator.check_schema(schema)
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
        assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
        # The CRD's CEL rules (x-kubernetes-validations), which a JSON schema cannot hold.
        for rule in _every_rule(doc):
            assert ("record" in rule) != ("alert" in rule), rule
            assert "annotations" not in rule or "alert" in rule, rule
            assert rule["expr"].strip(), rule


def test_the_schemas_reject_what_the_api_server_would() -> None:
    rules = _committed("rules.yaml")
    validator = jsonschema.Draft202012Validator(_crd_schema(rules["apiVersion"], rules["kind"]))
    assert validator.is_valid(rules)
    typo = copy.deepcopy(rules)
    typo["spec"]["groups"][1]["rules"][0]["alerts"] = typo["spec"]["groups"][1]["rules"][0].pop(
        "alert"
    )
    assert not validator.is_valid(typo)
    no_groups = copy.deepcopy(rules)
    no_groups["spec"] = {}
    assert not validator.is_valid(no_groups)
    empty = copy.deepcopy(rules)
    empty["spec"]["groups"][0]["rules"] = []
    assert not validator.is_valid(empty)
    operator_style = copy.deepcopy(rules)
    operator_style["spec"]["groups"][0]["partial_response_strategy"] = "warn"
    assert not validator.is_valid(operator_style)


def test_no_rule_fights_the_rule_evaluators_scoping() -> None:
    """GMP adds project_id, location, cluster and namespace to every selector and every result
    of a Rules object, and rejects the object if a rule already sets one of those labels or
    selects on one with another matcher (prometheus-engine, rules_config.go); GlobalRules get
    neither. Durations are Go durations (the CRD's ``format: duration``)."""
    rules = _committed("rules.yaml")
    selector = re.compile(r"\{[^}]*\b(" + "|".join(SCOPE_LABELS) + r")\s*(=~|!=|!~|=)")
    for rule in _every_rule(rules):
        name = rule.get("alert") or rule["record"]
        assert not set(rule.get("labels", {})) & set(SCOPE_LABELS), name
        assert not selector.search(rule["expr"]), name
    assert selector.search('x{namespace="a"}') and selector.search('x{job="j", cluster=~"c"}')
    for doc in _rules_objects():
        for group in doc["spec"]["groups"]:
            assert "interval" not in group or GO_DURATION.match(group["interval"])
            for rule in group["rules"]:
                assert "for" not in rule or GO_DURATION.match(rule["for"]), rule
    assert not GO_DURATION.match("1d") and GO_DURATION.match("1h30m")


def test_promtool_accepts_the_groups_gmp_loads(promtool: None, tmp_path: Path) -> None:
    """The rule-evaluator validates each object's groups as a Prometheus rule file
    (``rulefmt``): so does ``promtool check rules``."""
    for doc in _rules_objects():
        file = tmp_path / f"{doc['metadata']['name']}.rules.yml"
        file.write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}, sort_keys=False))
        done = subprocess.run(
            ["promtool", "check", "rules", str(file)], capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_pubsub_rule_unit_tests_pass(promtool: None) -> None:
    done = subprocess.run(
        ["promtool", "test", "rules", "pubsub.test.yml"],
        cwd=PUBSUB_DIR,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_pubsub_alert_has_the_rules_runbook_and_severity() -> None:
    """The same conventions as rowbatch.rules.yml's alerts (one runbook base, the alert's
    section)."""
    base_line = re.compile(r"^# runbook_url base: (\S+)$", re.MULTILINE)
    (base,) = base_line.findall(RULES.read_text())
    assert base_line.findall(PUBSUB_RULES.read_text()) == [base]
    for group in _groups(PUBSUB_RULES):
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("critical", "warning", "info")
            assert {"summary", "description", "runbook_url"} <= set(rule["annotations"])
            assert rule["annotations"]["runbook_url"] == f"{base}#{rule['alert'].lower()}"
