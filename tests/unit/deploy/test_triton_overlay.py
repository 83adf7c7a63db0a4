"""deploy/k8s/overlays/triton, rendered offline: Triton runs without root and with a read-only
root filesystem (its writes go to volumes), a drain cannot evict every replica, a pod that is
going away keeps serving until every consumer has stopped resolving it, and its metrics are
scraped by the Prometheus Operator (PodMonitor) or, with the gmp component, by Google's
managed Prometheus (PodMonitoring)."""

from __future__ import annotations

import json
import math
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rowbatch.consumer.model.settings import ModelSettings
from tests.unit.deploy.kustomize import kustomize, render_with

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
TRITON = K8S / "overlays" / "triton"
GMP = TRITON / "gmp"
SERVICE = "triton"

# How old a cluster DNS answer may be when a consumer re-resolves: the record TTL of
# kube-dns (GKE's default provider, 30 s) and CoreDNS (5 s by default), the larger.
DNS_TTL_S = 30
# Triton's own default for --exit-timeout-secs (in-flight requests after SIGTERM).
TRITON_EXIT_TIMEOUT_DEFAULT_S = 30


@cache
def _render() -> tuple[dict[str, Any], ...]:
    return kustomize(TRITON)


@cache
def _render_gmp() -> tuple[dict[str, Any], ...]:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        return render_with(Path(scratch), [TRITON], [GMP])


def _one(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def _arg(container: dict[str, Any], flag: str) -> str | None:
    for arg in container["args"]:
        if arg.startswith(f"{flag}="):
            value: str = arg.split("=", 1)[1]
            return value
    return None


def _crd_schema(doc: dict[str, Any]) -> dict[str, Any]:
    group, version = doc["apiVersion"].split("/")
    path = K8S / "schemas" / f"{group}_{doc['kind'].lower()}_{version}.json"
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def _consumer_resolve_intervals() -> list[float]:
    """``model.resolve_interval_s`` of every shipped configuration that reaches Triton by its
    Service name (``dns:///triton...``), or the setting's default where a file leaves it."""
    default = ModelSettings.model_fields["resolve_interval_s"].default
    assert isinstance(default, float)
    intervals = []
    for path in sorted(K8S.rglob("*.toml")):
        model = tomllib.loads(path.read_text()).get("model", {})
        if str(model.get("url", "")).startswith(f"dns:///{SERVICE}"):
            intervals.append(float(model.get("resolve_interval_s", default)))
    return intervals


def test_triton_runs_without_root_and_writes_only_to_its_volumes() -> None:
    deployment = _one(_render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    security = pod["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] > 0 and security["runAsGroup"] > 0
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    container = _container(deployment)
    own = container["securityContext"]
    assert own["allowPrivilegeEscalation"] is False
    assert own["capabilities"] == {"drop": ["ALL"]}
    assert own["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    # /tmp: the copy of the model repository Triton downloads from object storage, the
    # Python backend's files; /dev/shm: the Python backend's shared memory (memory-backed).
    for path in ("/tmp", "/dev/shm"):
        assert not mounts[path].get("readOnly", False), path
        assert "emptyDir" in volumes[mounts[path]["name"]], path
        assert "sizeLimit" in volumes[mounts[path]["name"]]["emptyDir"], path
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    repository = _arg(container, "--model-repository")
    assert repository is not None and repository.startswith(("gs://", "s3://", "as://")), (
        "a local repository would need a volume of its own under the read-only root"
    )
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env.get("HOME") == "/tmp", "libraries that cache under $HOME write to the volume"


def test_triton_gets_no_kubernetes_api_token() -> None:
    """Triton never calls the Kubernetes API (Workload Identity asks the node's metadata
    server), so neither its ServiceAccount nor its pods mount a token."""
    deployment = _one(_render(), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    account = _one(_render(), "ServiceAccount")
    assert account["metadata"]["name"] == pod["serviceAccountName"]
    assert account["automountServiceAccountToken"] is False


def test_a_drain_cannot_evict_every_triton_pod() -> None:
    deployment = _one(_render(), "Deployment")
    replicas = deployment["spec"]["replicas"]
    assert replicas >= 2
    budget = _one(_render(), "PodDisruptionBudget")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = budget["spec"]
    assert ("maxUnavailable" in spec) != ("minAvailable" in spec)
    evictable = spec.get("maxUnavailable", replicas - spec.get("minAvailable", 0))
    assert isinstance(evictable, int), "a number: a percentage rounds with the replica count"
    assert 1 <= evictable < replicas, "a drain may move one pod, never all of them"
    # the consumers' own budget selects none of these pods
    for doc in kustomize(K8S / "base"):
        if doc["kind"] == "PodDisruptionBudget":
            assert not doc["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_a_leaving_pod_serves_until_the_consumers_stop_resolving_it() -> None:
    """A deleted pod leaves the headless Service's DNS at once, but each consumer sees that
    only at its next resolve (every ``model.resolve_interval_s``) of an answer up to the DNS
    TTL old: until then it sends batches there. preStop keeps Triton serving that long; the
    grace period covers it plus Triton's exit timeout for the requests then in flight."""
    intervals = _consumer_resolve_intervals()
    assert intervals, "no shipped configuration reaches Triton by its Service name"
    deployment = _one(_render(), "Deployment")
    container = _container(deployment)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop_s = float(command[1])
    assert pre_stop_s > max(intervals) + DNS_TTL_S
    exit_timeout = _arg(container, "--exit-timeout-secs")
    exit_timeout_s = int(exit_timeout) if exit_timeout else TRITON_EXIT_TIMEOUT_DEFAULT_S
    grace_s = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= math.ceil(pre_stop_s) + exit_timeout_s
    # A rollout replaces one pod at a time and only once its successor is ready.
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling["maxUnavailable"] == 0


@pytest.mark.parametrize("collector", ["PodMonitor", "PodMonitoring"])
def test_triton_is_scraped_by_either_collector(collector: str) -> None:
    docs = _render() if collector == "PodMonitor" else _render_gmp()
    kinds = {d["kind"] for d in docs}
    assert {"PodMonitor", "PodMonitoring"} & kinds == {collector}, "exactly one collector"
    monitor = _one(docs, collector)
    errors = list(jsonschema.Draft202012Validator(_crd_schema(monitor)).iter_errors(monitor))
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    deployment = _one(docs, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    key = "podMetricsEndpoints" if collector == "PodMonitor" else "endpoints"
    (endpoint,) = monitor["spec"][key]
    assert ports[endpoint["port"]] == 8002, "Triton's metrics port"
    assert endpoint["path"] == "/metrics"
    if collector == "PodMonitor":
        # kube-prometheus-stack selects PodMonitors by its release label (as base's does)
        base = next(d for d in kustomize(K8S / "base") if d["kind"] == "PodMonitor")
        assert monitor["metadata"]["labels"]["release"] == base["metadata"]["labels"]["release"]
    # the component changes nothing else
    if collector == "PodMonitoring":
        rest = [d for d in docs if d["kind"] != collector]
        assert rest == [d for d in _render() if d["kind"] != "PodMonitor"]
