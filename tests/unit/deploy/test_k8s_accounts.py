"""rowbatch's ServiceAccounts (deploy/k8s/base/serviceaccounts.yaml, as every consumer overlay
renders them): no pod of rowbatch gets a Kubernetes API token it never uses. Neither the
consumers nor admin ensure call the Kubernetes API (Workload Identity on GKE asks the node's
metadata server, which needs no token in the pod), so a token mounted into them is only
something to steal. Set on the ServiceAccount and again on each pod template, so that neither a
ServiceAccount swapped by an operator nor a pod template patched elsewhere brings it back."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.unit.deploy.kustomize import kustomize

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
WITH_ACCOUNTS = (
    "base",
    "overlays/gke-pubsub",
    "overlays/kafka-keda",
    "overlays/kafka-share-keda",
)
WORKLOADS = ("Deployment", "Job")


@cache
def _render(where: str) -> tuple[dict[str, Any], ...]:
    return kustomize(K8S / where)


def _of_kind(where: str, kind: str) -> list[dict[str, Any]]:
    return [d for d in _render(where) if d["kind"] == kind]


@pytest.mark.parametrize("where", WITH_ACCOUNTS)
def test_no_service_account_mounts_an_api_token(where: str) -> None:
    accounts = _of_kind(where, "ServiceAccount")
    assert {a["metadata"]["name"] for a in accounts} == {"rowbatch-consumer", "rowbatch-admin"}
    for account in accounts:
        name = account["metadata"]["name"]
        assert account.get("automountServiceAccountToken") is False, name


@pytest.mark.parametrize("where", WITH_ACCOUNTS)
@pytest.mark.parametrize("kind", WORKLOADS)
def test_no_pod_mounts_an_api_token(where: str, kind: str) -> None:
    (workload,) = _of_kind(where, kind)
    pod = workload["spec"]["template"]["spec"]
    assert pod.get("automountServiceAccountToken") is False
    accounts = {a["metadata"]["name"] for a in _of_kind(where, "ServiceAccount")}
    assert pod["serviceAccountName"] in accounts, "its own account, not the namespace's default"
