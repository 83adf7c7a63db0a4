"""deploy/k8s under an operator's ``namePrefix`` (two installs in one namespace, e.g. staging-
and prod-): each kustomization, rendered through an overlay of its own with only the prefix,
applies as it does without one. Every object's name fits the API server's 63 characters (the
admin Job's name carries the hashed ConfigMap's name, so the prefix counts twice there, and
the Job controller puts the name in a pod label, whose values stop at 63 too), and every
reference to an object of the same render follows its new name: the pods' ServiceAccount,
ConfigMaps and Secrets, the HPA's target, and KEDA's ``scaleTargetRef`` and
``authenticationRef`` (kustomize knows nothing of KEDA's kinds until base/kustomizeconfig.yaml
tells it). A reference to an object made outside the render (the Secret rowbatch-secrets)
keeps its name."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.unit.deploy.kustomize import kustomize, overlay

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
RENDERED = (
    "base",
    "overlays/gke-pubsub",
    "overlays/kafka-keda",
    "overlays/kafka-share-keda",
    "overlays/vllm",
    "overlays/triton",
    "backfill",
)
# staging- and prod-, and the longest prefix the admin Job's name leaves room for (docs: the
# Job's name is <prefix>admin-<prefix>rowbatch-consumer-config-<10-character hash>).
PREFIXES = ("staging-", "prod-", "preprod-eu-")
NAME_MAX = 63
POD_TEMPLATE_KINDS = ("Deployment", "StatefulSet", "DaemonSet", "Job")

Reference = tuple[str, str]  # (kind, name) of the object referred to


@cache
def _unprefixed(where: str) -> tuple[dict[str, Any], ...]:
    return kustomize(K8S / where)


def _pod_references(pod: dict[str, Any]) -> Iterator[Reference]:
    if "serviceAccountName" in pod:
        yield "ServiceAccount", pod["serviceAccountName"]
    for volume in pod.get("volumes", []):
        if "configMap" in volume:
            yield "ConfigMap", volume["configMap"]["name"]
        if "secret" in volume:
            yield "Secret", volume["secret"]["secretName"]
        for source in volume.get("projected", {}).get("sources", []):
            for kind, key in (("ConfigMap", "configMap"), ("Secret", "secret")):
                if key in source:
                    yield kind, source[key]["name"]
    for container in pod.get("initContainers", []) + pod["containers"]:
        for var in container.get("env", []):
            ref = var.get("valueFrom", {})
            if "secretKeyRef" in ref:
                yield "Secret", ref["secretKeyRef"]["name"]
            if "configMapKeyRef" in ref:
                yield "ConfigMap", ref["configMapKeyRef"]["name"]
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                yield "Secret", source["secretRef"]["name"]
            if "configMapRef" in source:
                yield "ConfigMap", source["configMapRef"]["name"]


def references(doc: dict[str, Any]) -> Iterator[Reference]:
    """The objects ``doc`` names, by kind and name, in a fixed order."""
    kind, spec = doc["kind"], doc.get("spec", {})
    if kind in POD_TEMPLATE_KINDS:
        yield from _pod_references(spec["template"]["spec"])
    elif kind == "HorizontalPodAutoscaler":
        yield spec["scaleTargetRef"]["kind"], spec["scaleTargetRef"]["name"]
    elif kind == "ScaledObject":
        target = spec["scaleTargetRef"]
        yield target.get("kind", "Deployment"), target["name"]
        for trigger in spec["triggers"]:
            if "authenticationRef" in trigger:
                auth = trigger["authenticationRef"]
                yield auth.get("kind", "TriggerAuthentication"), auth["name"]
    elif kind == "TriggerAuthentication":
        for ref in spec.get("secretTargetRef", []):
            yield "Secret", ref["name"]
        for ref in spec.get("configMapTargetRef", []):
            yield "ConfigMap", ref["name"]


def _objects(docs: tuple[dict[str, Any], ...]) -> set[Reference]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def _prefixed(where: str, prefix: str, tmp_path: Path) -> tuple[dict[str, Any], ...]:
    return kustomize(overlay(tmp_path, K8S / where, namePrefix=prefix))


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("where", RENDERED)
def test_every_name_fits_under_a_prefix(where: str, prefix: str, tmp_path: Path) -> None:
    docs = _prefixed(where, prefix, tmp_path)
    assert len(docs) == len(_unprefixed(where))
    for doc in docs:
        name = doc["metadata"]["name"]
        assert name.startswith(prefix), f"{doc['kind']} {name}"
        assert len(name) <= NAME_MAX, f"{doc['kind']} {name}: {len(name)} > {NAME_MAX}"
        assert "$(" not in name, f"{doc['kind']} {name}: a var left unresolved"


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("where", RENDERED)
def test_every_reference_follows_the_prefix(where: str, prefix: str, tmp_path: Path) -> None:
    plain = _unprefixed(where)
    docs = _prefixed(where, prefix, tmp_path)
    plain_objects, objects = _objects(plain), _objects(docs)
    plain_refs = [(d["kind"], r) for d in plain for r in references(d)]
    refs = [(d["kind"], r) for d in docs for r in references(d)]
    assert len(refs) == len(plain_refs)
    assert refs, "nothing refers to anything: the walk found no reference"
    for (referrer, before), (_, after) in zip(plain_refs, refs, strict=True):
        if before in plain_objects:  # made by this render: renamed with it
            assert after in objects, f"{referrer} -> {after[0]} {after[1]}: no such object"
        else:  # made outside it (a Secret created by hand): the same name
            assert after == before, f"{referrer} -> {after}: renamed, but not made here"


@pytest.mark.parametrize("where", ["overlays/kafka-keda", "overlays/vllm"])
def test_keda_follows_the_prefix(where: str, tmp_path: Path) -> None:
    """KEDA's references by name, spelled out: without them the ScaledObject scales a
    Deployment that does not exist, with credentials it cannot find."""
    docs = _prefixed(where, "staging-", tmp_path)
    (scaled,) = [d for d in docs if d["kind"] == "ScaledObject"]
    (consumers,) = [
        d
        for d in docs
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/name"] == "rowbatch-consumer"
    ]
    (auth,) = [d for d in docs if d["kind"] == "TriggerAuthentication"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == consumers["metadata"]["name"]
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert auth["metadata"]["name"].startswith("staging-")
