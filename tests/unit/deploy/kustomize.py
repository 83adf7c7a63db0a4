"""``kubectl kustomize`` for the manifest tests: a directory rendered offline into its objects
(the test is skipped where kubectl is absent, and fails where CI is set)."""

from __future__ import annotations

import subprocess
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
