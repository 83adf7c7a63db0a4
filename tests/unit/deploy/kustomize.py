"""``kubectl kustomize`` for the manifest tests: a directory rendered offline into its objects
(the test is skipped where kubectl is absent, and fails where CI is set), and kustomizations of
an operator's own over the shipped ones (a ``namePrefix``, components), written to a scratch
directory; and lookups in what it renders (one object, a workload's pod and container)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.required_tools import require_tool


def kustomize(directory: Path) -> tuple[dict[str, Any], ...]:
    """The objects ``kubectl kustomize directory`` renders (its error shown when it fails)."""
    require_tool(
        "kubectl",
        "the Kubernetes manifests (kubectl kustomize deploy/k8s)",
        "install kubectl (kustomize is built in)",
    )
    done = subprocess.run(
        ["kubectl", "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def one(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The one object of ``kind`` (named ``name``, where given) among ``objects``."""
    found = [
        d for d in objects if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{len(found)} {kind} {name or ''}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a workload's (a Deployment's, a Job's) template."""
    pod: dict[str, Any] = workload["spec"]["template"]["spec"]
    return pod


def only_container(workload: dict[str, Any]) -> dict[str, Any]:
    """A workload's container, asserting it has one only."""
    (container,) = pod_spec(workload)["containers"]
    assert isinstance(container, dict)
    return container


def _write_kustomization(
    tmp_path: Path, resources: Sequence[Path], components: Sequence[Path], fields: dict[str, Any]
) -> Path:
    """A kustomization.yaml in ``tmp_path``; kustomize takes only relative paths to other
    kustomizations, so each path goes up from ``tmp_path`` to / and down again."""
    up = "/".join([".."] * (len(tmp_path.parts) - 1))
    document: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"{up}{r}" for r in resources],
        **fields,
    }
    if components:
        document["components"] = [f"{up}{c}" for c in components]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(document))
    return tmp_path


def overlay(tmp_path: Path, resource: Path, **fields: Any) -> Path:
    """A kustomization in ``tmp_path`` over ``resource`` with ``fields`` (``namePrefix``...)."""
    return _write_kustomization(tmp_path, [resource], (), fields)


def render_with(
    tmp_path: Path, resources: Sequence[Path], components: Sequence[Path] = ()
) -> tuple[dict[str, Any], ...]:
    """What a kustomization of an operator's own renders: ``resources`` (kustomizations) with
    ``components`` applied, as a docs example writes it."""
    return kustomize(_write_kustomization(tmp_path, resources, components, {}))
