"""pyproject's dependency lists: the runtime ones take current releases (numpy 2, the latest
pyarrow) with no upper caps a user's environment would fight, and the model servers' own pins
live in their venvs (harness/server_venv.py), never in an extra."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest
from packaging.requirements import Requirement

from harness.server_venv import SERVER_VENVS, TRITON_VENV
from harness.service import REPO_ROOT

_SERVER_PACKAGES = {"nvidia-pytriton", "mlserver", "kserve", "tritonserver"}


def _project() -> dict[str, Any]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        project: dict[str, Any] = tomllib.load(handle)["project"]
    return project


def _runtime() -> dict[str, Requirement]:
    reqs = (Requirement(line) for line in _project()["dependencies"])
    return {req.name.lower(): req for req in reqs}


def _upper_caps(req: Requirement) -> list[str]:
    return [str(s) for s in req.specifier if s.operator in {"<", "<=", "==", "===", "~="}]


def test_runtime_dependencies_have_lower_bounds_and_no_upper_caps() -> None:
    for name, req in _runtime().items():
        assert not _upper_caps(req), f"{name}: upper cap {_upper_caps(req)} in {req}"
        assert any(s.operator == ">=" for s in req.specifier), f"{name}: no lower bound ({req})"


@pytest.mark.parametrize(("name", "current"), [("numpy", "2.4.0"), ("pyarrow", "26.0.1")])
def test_numpy_2_and_current_pyarrow_are_allowed(name: str, current: str) -> None:
    req = _runtime()[name]
    assert req.specifier.contains(current), f"{req} excludes {name} {current}"


def test_no_model_server_in_any_extra() -> None:
    for extra, lines in _project().get("optional-dependencies", {}).items():
        names = {Requirement(line).name.lower() for line in lines}
        assert not names & _SERVER_PACKAGES, (
            f"extra [{extra}] installs {sorted(names & _SERVER_PACKAGES)}: model servers run "
            "from their own venvs (harness/server_venv.py)"
        )
    assert "server" not in _project().get("optional-dependencies", {})


def test_triton_and_its_numpy_pin_live_in_the_triton_venv() -> None:
    assert SERVER_VENVS["triton"] is TRITON_VENV
    pinned = {Requirement(line).name: Requirement(line) for line in TRITON_VENV.requirements}
    assert str(pinned["nvidia-pytriton"].specifier) == "==0.7.0"
    assert not pinned["numpy"].specifier.contains("2.0.0")  # the stub's numpy (the wheel pins it)
