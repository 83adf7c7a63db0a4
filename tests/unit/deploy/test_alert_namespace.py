"""Every rule keeps the ``namespace`` label: kube-prometheus-stack's Alertmanager groups
(``group_by: [namespace]``) and inhibits (``equal: [namespace]``) by it, and a job name alone
does not tell two deployments apart (GKE's PodMonitoring names the job after the monitor, the
same in every namespace). So every aggregation groups ``by`` a list naming ``namespace``, every
vector match is ``on`` a list naming it, and nothing aggregates it away with ``without`` or
``ignoring``. Checked over the rule files' PromQL as text (rowbatch's rules use the prefix
form ``sum by (...) (...)``, which this requires), with a check that the checker finds each kind
of fault. What the rules then do with two namespaces is tested by promtool
(rowbatch.test.yml)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.service import REPO_ROOT

RULES = REPO_ROOT / "deploy" / "prometheus" / "rules" / "rowbatch.rules.yml"

#: ``absent()`` returns one series whose labels are its selector's equality matchers: it cannot
#: carry a namespace it did not select, and that is its point ("no consumer anywhere").
#: On GKE the rule-evaluator adds the Rules object's namespace to its result.
ABSENT_ALLOWED = {"RowbatchConsumersAbsent"}

_AGGREGATIONS = (
    "sum|min|max|avg|group|count|stddev|stdvar|topk|bottomk|quantile|count_values"
    "|limitk|limit_ratio"
)
_AGGREGATION = re.compile(rf"\b({_AGGREGATIONS})\s*((?:by|without)\s*\([^)]*\)\s*)?\(")
_GROUPING = re.compile(r"\b(by|without|on|ignoring)\s*\(([^)]*)\)")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
#: Functions whose result carries no labels at all.
_LABEL_LESS = re.compile(r"\b(vector|scalar)\s*\(")


def faults(expr: str) -> list[str]:
    """What in ``expr`` drops the ``namespace`` label (empty when nothing does)."""
    bare = _STRING.sub('""', expr)
    found = []
    for match in _AGGREGATION.finditer(bare):
        if match.group(2) is None:
            found.append(f"{match.group(1)}(...) without a prefix `by (namespace, ...)`")
    for keyword, names in _GROUPING.findall(bare):
        labels = {n.strip() for n in names.split(",") if n.strip()}
        if keyword in ("by", "on") and "namespace" not in labels:
            found.append(f"{keyword} ({names}) leaves out namespace")
        if keyword in ("without", "ignoring") and "namespace" in labels:
            found.append(f"{keyword} ({names}) drops namespace")
    found.extend(f"{m.group(1)}() has no labels" for m in _LABEL_LESS.finditer(bare))
    return found


def _rules(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_the_checker_finds_each_way_of_dropping_the_namespace() -> None:
    assert faults("sum by (namespace, job) (rate(x_total[5m])) > 0") == []
    assert faults('max by (namespace, job) (x{job=~"a by (job)"})') == []
    assert faults("sum by (job) (x)") == ["by (job) leaves out namespace"]
    assert faults("sum(x)") == ["sum(...) without a prefix `by (namespace, ...)`"]
    assert faults("sum by (namespace) (x) and on (job) y") == ["on (job) leaves out namespace"]
    assert faults("sum without (namespace) (x)") == ["without (namespace) drops namespace"]
    assert faults("sum without (instance) (x)") == []
    assert faults("x / ignoring (namespace, le) y") == ["ignoring (namespace, le) drops namespace"]
    assert faults("vector(1)") == ["vector() has no labels"]
    assert (
        faults("histogram_quantile(0.99, sum by (namespace, job, le) (rate(x_bucket[5m])))") == []
    )


def test_every_rule_keeps_the_namespace() -> None:
    rules = _rules(RULES)
    assert len(rules) > 20
    dropping = {
        rule.get("alert") or rule["record"]: faults(rule["expr"])
        for rule in rules
        if faults(rule["expr"])
    }
    assert dropping == {}
    absent = {rule.get("alert") or rule["record"] for rule in rules if "absent(" in rule["expr"]}
    assert absent <= ABSENT_ALLOWED


def test_recorded_series_are_named_for_their_labels() -> None:
    """``level:metric:operations``: the level lists the labels a recorded series keeps, and
    every one starts with the namespace."""
    for rule in _rules(RULES):
        if "record" in rule:
            level = rule["record"].split(":")[0]
            assert level.startswith("namespace_job"), rule["record"]
            grouped = re.search(r"\bby\s*\(([^)]*)\)", rule["expr"])
            assert grouped is not None, rule["record"]
            labels = [n.strip() for n in grouped.group(1).split(",") if n.strip() != "le"]
            assert level == "_".join(labels), rule["record"]
