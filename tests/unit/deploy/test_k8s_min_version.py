"""The minimum Kubernetes version deploy/k8s needs, stated once (``MINIMUM_KUBERNETES``) and
checked: every kustomization and every component under deploy/k8s (found on disk, so new ones
are covered) renders, each built-in object validates strictly against that version's OpenAPI
schemas, and no object uses an API feature that is off by default before it. The minimum is
tight: the version before it rejects something the manifests hold."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.kustomize import kustomize, render_with

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"

MINIMUM_KUBERNETES = "1.29"
"""The oldest Kubernetes the manifests run on (docs/deploy.md states it). What sets it: the
backfill Job's per-index retries (backoffLimitPerIndex, maxFailedIndexes, the FailIndex action)
and its podReplacementPolicy, off by default (alpha) in 1.28, whose API server then refuses
the Job; and 1.28's API schema still marks a pod failure policy rule's onPodConditions as
required, so schema validators (kubeconform, kubectl's client-side validation) refuse both
Jobs' rules on exit codes alone."""
PREVIOUS_KUBERNETES = "1.28"

CRD_GROUPS = ("keda.sh", "monitoring.coreos.com", "monitoring.googleapis.com")


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def _jobs(doc: dict[str, Any]) -> dict[str, Any] | None:
    return doc["spec"] if doc["kind"] == "Job" else None


def _pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    template = doc.get("spec", {}).get("template", {})
    if doc["kind"] == "CronJob":
        template = doc["spec"]["jobTemplate"]["spec"]["template"]
    if "spec" in template:
        yield template["spec"]


def _failure_rules(doc: dict[str, Any]) -> list[dict[str, Any]]:
    job = _jobs(doc)
    rules: list[dict[str, Any]] = (job or {}).get("podFailurePolicy", {}).get("rules", [])
    return rules


def _uses_pre_stop_sleep(doc: dict[str, Any]) -> bool:
    return any(
        "sleep" in c.get("lifecycle", {}).get(hook, {})
        for pod in _pod_specs(doc)
        for c in pod.get("containers", [])
        for hook in ("preStop", "postStart")
    )


def _uses_sidecars(doc: dict[str, Any]) -> bool:
    return any(
        c.get("restartPolicy") == "Always"
        for pod in _pod_specs(doc)
        for c in pod.get("initContainers", [])
    )


# Each API feature the manifests may use, the first version that has it on by default (beta or
# GA; the API server drops or refuses a field whose feature gate is off), and how to see it in
# a rendered object. Source: the Kubernetes feature-gate reference.
FEATURES: tuple[tuple[str, str, Callable[[dict[str, Any]], bool]], ...] = (
    (
        "Job podFailurePolicy (JobPodFailurePolicy)",
        "1.26",
        lambda d: bool(_failure_rules(d)),
    ),
    (
        "Job backoffLimitPerIndex / maxFailedIndexes / FailIndex (JobBackoffLimitPerIndex)",
        "1.29",
        lambda d: bool(
            (job := _jobs(d))
            and (
                "backoffLimitPerIndex" in job
                or "maxFailedIndexes" in job
                or any(r["action"] == "FailIndex" for r in _failure_rules(d))
            )
        ),
    ),
    (
        "Job podReplacementPolicy (JobPodReplacementPolicy)",
        "1.29",
        lambda d: "podReplacementPolicy" in (_jobs(d) or {}),
    ),
    (
        "PodDisruptionBudget unhealthyPodEvictionPolicy (PDBUnhealthyPodEvictionPolicy)",
        "1.27",
        lambda d: d["kind"] == "PodDisruptionBudget" and "unhealthyPodEvictionPolicy" in d["spec"],
    ),
    ("sidecar containers (SidecarContainers)", "1.29", _uses_sidecars),
    ("lifecycle sleep action (PodLifecycleSleepAction)", "1.30", _uses_pre_stop_sleep),
    ("Job successPolicy (JobSuccessPolicy)", "1.31", lambda d: "successPolicy" in (_jobs(d) or {})),
    ("Job managedBy (JobManagedBy)", "1.32", lambda d: "managedBy" in (_jobs(d) or {})),
    (
        "Service trafficDistribution (ServiceTrafficDistribution)",
        "1.31",
        lambda d: d["kind"] == "Service" and "trafficDistribution" in d["spec"],
    ),
)


def _kustomizations() -> list[Path]:
    return sorted(p.parent for p in K8S.rglob("kustomization.yaml"))


def _kind(directory: Path) -> str:
    kind: str = yaml.safe_load((directory / "kustomization.yaml").read_text())["kind"]
    return kind


def _applied_to(component: Path) -> tuple[Path, list[Path]]:
    """How ``component`` is used: the nearest Kustomization above it (the one it is for;
    deploy/k8s/base for a free-standing component under components/), with the components
    between them, outermost first, and itself (a sub-component needs its parent component)."""
    chain = [component]
    for parent in component.parents:
        if parent == K8S:
            break
        if (parent / "kustomization.yaml").exists():
            if _kind(parent) == "Kustomization":
                return parent, chain[::-1]
            chain.append(parent)
    return K8S / "base", chain[::-1]


@cache
def _rendered(directory: Path) -> tuple[dict[str, Any], ...]:
    if _kind(directory) == "Kustomization":
        return kustomize(directory)
    with tempfile.TemporaryDirectory() as scratch:
        resource, components = _applied_to(directory)
        return render_with(Path(scratch), [resource], components)


def _label(directory: Path) -> str:
    return directory.relative_to(K8S).as_posix()


def _built_in(doc: dict[str, Any]) -> bool:
    return doc["apiVersion"].split("/")[0] not in CRD_GROUPS


def _problems(doc: dict[str, Any], version: str) -> list[str]:
    """Why ``version`` would refuse ``doc``: a schema error, or a feature it lacks."""
    problems = []
    try:
        kubernetes_validate.validate(doc, f"{version}.0", strict=True)
    except kubernetes_validate.ValidationError as error:
        problems.append(f"schema: {error.message}")
    for feature, since, used in FEATURES:
        if used(doc) and _version(since) > _version(version):
            problems.append(f"{feature} needs {since}")
    return problems


def test_the_minimum_is_a_version_the_validator_knows() -> None:
    for version in (MINIMUM_KUBERNETES, PREVIOUS_KUBERNETES):
        assert f"{version}.0" in kubernetes_validate.utils.all_versions()
    major, minor = _version(MINIMUM_KUBERNETES)
    assert _version(PREVIOUS_KUBERNETES) == (major, minor - 1)


def test_every_kustomization_and_component_is_found() -> None:
    found = {_label(d): _kind(d) for d in _kustomizations()}
    assert found["base"] == "Kustomization"
    assert found["backfill"] == "Kustomization"
    assert found["overlays/triton/gpu"] == "Component"
    assert set(found.values()) <= {"Kustomization", "Component"}


@pytest.mark.parametrize("directory", _kustomizations(), ids=_label)
def test_every_object_runs_on_the_minimum_version(directory: Path) -> None:
    docs = _rendered(directory)
    assert docs
    refused = {
        f"{d['kind']}/{d['metadata']['name']}": problems
        for d in docs
        if _built_in(d) and (problems := _problems(d, MINIMUM_KUBERNETES))
    }
    assert not refused, f"Kubernetes {MINIMUM_KUBERNETES} would refuse: {refused}"


def test_the_minimum_is_tight() -> None:
    """The version before the minimum refuses something (else the minimum is too high), and
    the features that set it are the ones the docs name."""
    refused: dict[str, list[str]] = {}
    setting: set[str] = set()
    for directory in _kustomizations():
        for doc in _rendered(directory):
            if not _built_in(doc):
                continue
            if problems := _problems(doc, PREVIOUS_KUBERNETES):
                refused[f"{_label(directory)}: {doc['kind']}/{doc['metadata']['name']}"] = problems
            setting |= {
                f for f, since, used in FEATURES if used(doc) and since == MINIMUM_KUBERNETES
            }
    assert refused, f"nothing needs {MINIMUM_KUBERNETES}: lower MINIMUM_KUBERNETES"
    assert any(k.startswith("backfill: Job/") for k in refused)
    assert "Job podReplacementPolicy (JobPodReplacementPolicy)" in setting
    assert any(f.startswith("Job backoffLimitPerIndex") for f in setting)


def test_a_feature_newer_than_the_minimum_is_caught() -> None:
    """The feature table sees what it describes: a Job with a success policy (1.31) and a
    preStop sleep action (1.30) are refused at the minimum."""
    job = next(d for d in _rendered(K8S / "backfill") if d["kind"] == "Job")
    newer = yaml.safe_load(yaml.safe_dump(job))
    newer["spec"]["successPolicy"] = {"rules": [{"succeededCount": 1}]}
    container = newer["spec"]["template"]["spec"]["containers"][0]
    container["lifecycle"] = {"preStop": {"sleep": {"seconds": 5}}}
    problems = _problems(newer, MINIMUM_KUBERNETES)
    assert any("successPolicy" in p for p in problems)
    assert any("sleep action" in p for p in problems)
    assert not _problems(job, MINIMUM_KUBERNETES)
