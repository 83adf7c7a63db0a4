"""The admin Job (deploy/k8s/base/admin-job.yaml), checked offline beyond
tests/unit/deploy/test_k8s.py: one Job per configuration, named after the generated ConfigMap's
hashed name, so that a changed consumer.toml makes ``kubectl apply -k`` create a new Job instead
of changing an existing Job's (immutable) pod template; the name short enough for an operator's
namePrefix, which it carries twice; a bad configuration or a difference on the broker fails it
at once; and the order it needs is the documented ``kubectl wait`` on that Job, with the
consumers' own start-up check (exit 2, restarted by the kubelet) meanwhile."""

from __future__ import annotations

import re
import shutil
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rowbatch.consumer.service.admin import EXIT_CONFIG, EXIT_DIFFERS
from tests.unit.deploy.kustomize import kustomize, overlay

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
# triton has no consumer and no Job
WITH_ADMIN_JOB = ("base", "gke-pubsub", "kafka-keda", "kafka-share-keda")
# The rendered Job is admin-<the ConfigMap's hashed name>; admin-job.yaml names it
# rowbatch-admin-ensure, which patches use.
JOB_PREFIX = "admin-"
CONFIG_MAP = "rowbatch-consumer-config"
HASHED = re.compile(rf"{CONFIG_MAP}-[a-z0-9]{{10}}")  # kustomize's generator suffix
LABEL_VALUE_MAX = 63  # the Job controller labels its pods job-name=<the Job's name>
# Where each kustomization's consumer.toml comes from (the Kafka overlays replace the base's),
# and a value admin ensure compares on the broker.
CONFIG_SOURCE = {
    "base": ("base/consumer.toml", "ack_deadline_s = 60", "ack_deadline_s = 120"),
    "gke-pubsub": ("base/consumer.toml", "ack_deadline_s = 60", "ack_deadline_s = 120"),
    "kafka-keda": ("overlays/kafka-keda/consumer.toml", "partitions = 12", "partitions = 24"),
    "kafka-share-keda": (
        "overlays/kafka-share-keda/consumer.toml",
        "partitions = 6",
        "partitions = 12",
    ),
}


def _directory(k8s: Path, where: str) -> Path:
    return k8s / (where if where == "base" else f"overlays/{where}")


def _build(k8s: Path, where: str) -> tuple[dict[str, Any], ...]:
    return kustomize(_directory(k8s, where))


@cache
def _render(where: str) -> tuple[dict[str, Any], ...]:
    return _build(K8S, where)


def _only(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def _config_map_name(docs: tuple[dict[str, Any], ...], prefix: str = "") -> str:
    names = [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith(prefix + CONFIG_MAP)
    ]
    assert len(names) == 1, names
    name: str = names[0]
    assert HASHED.fullmatch(name.removeprefix(prefix)), name
    return name


def _job_name(docs: tuple[dict[str, Any], ...]) -> str:
    name: str = _only(docs, "Job")["metadata"]["name"]
    return name


def _pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def _config_map_volumes(workload: dict[str, Any]) -> list[str]:
    return [v["configMap"]["name"] for v in _pod_spec(workload)["volumes"] if "configMap" in v]


def _copy_manifests(tmp_path: Path) -> Path:
    """deploy/k8s copied whole (the overlays reach the base as ../../base)."""
    copy = tmp_path / "k8s"
    shutil.copytree(K8S, copy)
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path}: {old!r}"
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_the_jobs_name_carries_the_config_maps_hash(where: str) -> None:
    docs = _render(where)
    name = _job_name(docs)
    assert name == JOB_PREFIX + _config_map_name(docs)
    assert "$(" not in name, "the var was not substituted"
    assert len(name) <= LABEL_VALUE_MAX, name


@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_the_job_mounts_exactly_that_config_map_as_the_consumers_do(where: str) -> None:
    docs = _render(where)
    config_map = _config_map_name(docs)
    assert _config_map_volumes(_only(docs, "Job")) == [config_map]
    assert _config_map_volumes(_only(docs, "Deployment")) == [config_map]


@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_a_changed_configuration_names_a_new_job(where: str, tmp_path: Path) -> None:
    k8s = _copy_manifests(tmp_path)
    before = _job_name(_build(k8s, where))
    assert before == _job_name(_render(where)), "the copy renders as the original"
    source, old, new = CONFIG_SOURCE[where]
    _edit(k8s / source, old, new)
    docs = _build(k8s, where)
    after = _job_name(docs)
    assert after != before
    assert after == JOB_PREFIX + _config_map_name(docs)


def test_the_job_keeps_its_name_when_only_the_consumers_change(tmp_path: Path) -> None:
    """Applying again without a configuration change leaves the Job as it is (no rerun)."""
    k8s = _copy_manifests(tmp_path)
    before = _job_name(_build(k8s, "base"))
    _edit(k8s / "base" / "deployment.yaml", "replicas: 2", "replicas: 3")
    assert _job_name(_build(k8s, "base")) == before


@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_a_bad_configuration_or_a_difference_fails_the_job_at_once(where: str) -> None:
    job = _only(_render(where), "Job")
    (container,) = _pod_spec(job)["containers"]
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule == {
        "action": "FailJob",
        "onExitCodes": {
            "containerName": container["name"],
            "operator": "In",
            "values": [EXIT_CONFIG, EXIT_DIFFERS],
        },
    }
    assert _pod_spec(job)["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert job["spec"]["backoffLimit"] > 0  # a refused call (1) or no answer (4) is retried
    assert job["spec"]["ttlSecondsAfterFinished"] > 0  # the Jobs of old configurations go


# The Job controller's backoff between a failed pod and its replacement: 10 s, doubling, at most
# 6 minutes (kubernetes.io/docs/concepts/workloads/controllers/job, "Pod backoff failure policy").
JOB_BACKOFF_S, JOB_BACKOFF_MAX_S = 10, 360


@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_the_job_has_a_deadline_that_leaves_room_for_its_retries(where: str) -> None:
    """activeDeadlineSeconds stops a Job that keeps failing or hangs, but not before every
    retry allowed by backoffLimit has had its turn."""
    spec = _only(_render(where), "Job")["spec"]
    deadline = spec["activeDeadlineSeconds"]
    backoff = sum(min(JOB_BACKOFF_S * 2**i, JOB_BACKOFF_MAX_S) for i in range(spec["backoffLimit"]))
    assert backoff < deadline <= spec["ttlSecondsAfterFinished"], (backoff, deadline)


@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_only_the_job_runs_with_admin_rights_and_the_docs_wait_for_it(where: str) -> None:
    """The order is the documented wait on the Job ``kubectl apply -k`` names: nothing in the
    consumer pods needs the admin's rights or waits on the Job (the consumers' start-up check
    exits 2 until the subscription/topics exist, and the kubelet restarts them)."""
    docs = _render(where)
    job, deployment = _only(docs, "Job"), _only(docs, "Deployment")
    assert _pod_spec(job)["serviceAccountName"] == "rowbatch-admin"
    assert _pod_spec(deployment)["serviceAccountName"] == "rowbatch-consumer"
    assert "initContainers" not in _pod_spec(deployment)
    assert _job_name(docs).startswith(_documented_job_name_start())
    assert 'kubectl wait --for=condition=complete --timeout=10m "$job"' in DEPLOY_DOC.read_text()


def _documented_job_name_start() -> str:
    """How docs/deploy.md picks the Job out of ``kubectl apply -k -o name``."""
    grep = re.search(r"grep '\^job\.batch/([a-z-]*)'", DEPLOY_DOC.read_text())
    assert grep is not None, "docs/deploy.md: the Job picked from `kubectl apply -k -o name`"
    return grep.group(1)


@pytest.mark.parametrize("prefix", ["staging-", "prod-"])
@pytest.mark.parametrize("where", WITH_ADMIN_JOB)
def test_under_a_name_prefix_the_job_keeps_its_pattern_and_the_docs_find_it(
    where: str, prefix: str, tmp_path: Path
) -> None:
    """The prefix lands on the Job's own name and on the ConfigMap's in it: still one Job per
    configuration, still a valid pod label value, and the documented grep still picks it."""
    docs = kustomize(overlay(tmp_path, _directory(K8S, where), namePrefix=prefix))
    name = _job_name(docs)
    config_map = _config_map_name(docs, prefix)
    assert name == prefix + JOB_PREFIX + config_map
    assert len(name) <= LABEL_VALUE_MAX, name
    assert _config_map_volumes(_only(docs, "Job")) == [config_map]
    assert name.startswith(_documented_job_name_start())
