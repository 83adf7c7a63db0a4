"""deploy/k8s/backfill, rendered offline: a Job that cannot run forever, the image by digest,
an identity that works as shipped (GKE Workload Identity, active) and one for EKS (the eks
component: IRSA, or EKS Pod Identity with no annotation), no Kubernetes API token in its pods,
and its metrics scraped by the Prometheus Operator (PodMonitor) or, with the gmp component,
by Google's managed Prometheus (PodMonitoring)."""

from __future__ import annotations

import json
import re
import tempfile
import tomllib
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from rowbatch.consumer.service.config import load_config
from rowbatch.consumer.service.shutdown import CLOSE_MARGIN_S
from rowbatch.consumer.sources.table.settings import TableSettings
from tests.unit.deploy.kustomize import kustomize, render_with
from tests.unit.deploy.test_k8s_min_version import MINIMUM_KUBERNETES

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
BACKFILL = K8S / "backfill"
GMP = BACKFILL / "gmp"
EKS = BACKFILL / "eks"
ACCOUNT = "rowbatch-backfill"

DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
GOOGLE_SA = re.compile(
    r"^[a-z][-a-z0-9]{4,28}[a-z0-9]@[a-z][-a-z0-9]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com$"
)
AWS_ROLE = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,64}$")


@cache
def _render(components: tuple[Path, ...] = ()) -> tuple[dict[str, Any], ...]:
    if not components:
        return kustomize(BACKFILL)
    with tempfile.TemporaryDirectory() as scratch:
        return render_with(Path(scratch), [BACKFILL], components)


def _one(docs: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def _container(job: dict[str, Any]) -> dict[str, Any]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def _crd_schema(doc: dict[str, Any]) -> dict[str, Any]:
    group, version = doc["apiVersion"].split("/")
    path = K8S / "schemas" / f"{group}_{doc['kind'].lower()}_{version}.json"
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def _validate(docs: Sequence[dict[str, Any]]) -> None:
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring."):
            validator = jsonschema.Draft202012Validator(_crd_schema(doc))
            errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
            assert not errors, errors
        else:
            kubernetes_validate.validate(doc, f"{MINIMUM_KUBERNETES}.0", strict=True)


def test_the_job_cannot_run_forever() -> None:
    """activeDeadlineSeconds ends a Job whose shards keep being retried or hang (a model
    server that never answers): every pod is stopped (SIGTERM, then the grace period) and the
    Job fails with DeadlineExceeded; a Job re-created later resumes each shard from its state."""
    job = _one(_render(), "Job")
    deadline = job["spec"]["activeDeadlineSeconds"]
    assert isinstance(deadline, int)
    config = tomllib.loads((BACKFILL / "table.toml").read_text())
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > config["shutdown_grace_s"] + CLOSE_MARGIN_S
    # Longer than one pod's start-up waits and a few retries, and at most a week.
    startup = max(config["model"]["startup_wait_s"], config["sink"]["startup_wait_s"])
    assert deadline > job["spec"]["backoffLimitPerIndex"] * (startup + grace)
    assert deadline <= 7 * 24 * 3600


@pytest.mark.parametrize(
    "components", [(), (GMP,), (EKS,), (GMP, EKS)], ids=["shipped", "gmp", "eks", "gmp+eks"]
)
def test_every_variant_renders_and_validates(components: tuple[Path, ...]) -> None:
    docs = _render(components)
    _validate(docs)
    image = _container(_one(docs, "Job"))["image"]
    assert DIGEST.search(image), f"{image}: deploy by digest, not by tag"
    account = _one(docs, "ServiceAccount")
    assert account["automountServiceAccountToken"] is False
    pod = _one(docs, "Job")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == account["metadata"]["name"] == ACCOUNT


def test_workload_identity_is_active_as_shipped() -> None:
    docs = _render()
    account = _one(docs, "ServiceAccount")
    google = account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
    assert GOOGLE_SA.match(google), google
    config = tomllib.loads((BACKFILL / "table.toml").read_text())
    assert config["source"]["input"].startswith("gs://")
    assert config["source"]["state"].startswith("gs://")


def test_the_eks_component_swaps_the_identity_and_the_storage() -> None:
    docs = _render((EKS,))
    annotations = _one(docs, "ServiceAccount")["metadata"].get("annotations", {})
    assert "iam.gke.io/gcp-service-account" not in annotations
    assert AWS_ROLE.match(annotations["eks.amazonaws.com/role-arn"])
    env = {e["name"]: e.get("value") for e in _container(_one(docs, "Job"))["env"]}
    assert env["ROWBATCH_SOURCE__INPUT"].startswith("s3://")
    assert env["ROWBATCH_SOURCE__STATE"].startswith("s3://")
    assert env["AWS_REGION"]
    # The pod's configuration, through the real loader: the env's S3 prefixes win over the
    # file's gs:// ones.
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    with tempfile.TemporaryDirectory() as scratch, pytest.MonkeyPatch.context() as mp:
        file = Path(scratch) / "table.toml"
        file.write_text(config_map["data"]["table.toml"])
        for name, value in env.items():
            mp.setenv(name, value if value is not None else "postgresql://u:p@db:5432/rowbatch")
        loaded = load_config(file)
    assert isinstance(loaded.source, TableSettings)
    assert loaded.source.input == env["ROWBATCH_SOURCE__INPUT"]
    assert loaded.source.state == env["ROWBATCH_SOURCE__STATE"]
    # Nothing else of the Job changes (its shards, retries, deadline, hardening).
    shipped = _one(_render(), "Job")
    job = _one(docs, "Job")
    assert {k: v for k, v in job["spec"].items() if k != "template"} == {
        k: v for k, v in shipped["spec"].items() if k != "template"
    }
    assert (
        job["spec"]["template"]["spec"]["securityContext"]
        == (shipped["spec"]["template"]["spec"]["securityContext"])
    )


@pytest.mark.parametrize("collector", ["PodMonitor", "PodMonitoring"])
def test_the_backfill_is_scraped_by_either_collector(collector: str) -> None:
    docs = _render() if collector == "PodMonitor" else _render((GMP,))
    kinds = {d["kind"] for d in docs}
    assert {"PodMonitor", "PodMonitoring"} & kinds == {collector}, "exactly one collector"
    monitor = _one(docs, collector)
    job = _one(docs, "Job")
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in _container(job)["ports"]}
    key = "podMetricsEndpoints" if collector == "PodMonitor" else "endpoints"
    (endpoint,) = monitor["spec"][key]
    config = tomllib.loads((BACKFILL / "table.toml").read_text())
    assert ports[endpoint["port"]] == config["server"]["port"]
    assert endpoint["path"] == "/metrics"
    # Not the consumers' pods: base's monitor and this one select disjoint pods.
    base = kustomize(K8S / "base")
    consumer_labels = _one(base, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= consumer_labels.items()
    if collector == "PodMonitor":
        base_monitor = _one(base, "PodMonitor")
        assert (
            monitor["metadata"]["labels"]["release"]
            == (base_monitor["metadata"]["labels"]["release"])
        )
        assert monitor["metadata"]["name"] != base_monitor["metadata"]["name"]
