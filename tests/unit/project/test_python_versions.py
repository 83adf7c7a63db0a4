"""The Python versions rowbatch supports are stated alike everywhere: pyproject's classifiers
and requires-python, the oldest one as the target of ruff and mypy, and the versions
scripts/test.sh (CI) runs the unit tests on."""

from __future__ import annotations

import re
import sys
import tomllib
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from harness.service import REPO_ROOT

SUPPORTED = ("3.11", "3.12", "3.13")


def _pyproject() -> dict[str, Any]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        return tomllib.load(handle)


def _classified_versions() -> set[str]:
    prefix = "Programming Language :: Python :: "
    classifiers: list[str] = _pyproject()["project"]["classifiers"]
    named = (c.removeprefix(prefix) for c in classifiers if c.startswith(prefix))
    return {version for version in named if re.fullmatch(r"3\.\d+", version)}


def test_classifiers_name_each_supported_version() -> None:
    classifiers: list[str] = _pyproject()["project"]["classifiers"]
    assert _classified_versions() == set(SUPPORTED), (
        "pyproject.toml's 'Programming Language :: Python :: 3.X' classifiers must list exactly "
        f"{SUPPORTED}: update them together with SUPPORTED here and scripts/test.sh"
    )
    assert "Programming Language :: Python :: 3 :: Only" in classifiers


def test_requires_python_admits_the_supported_versions_and_no_older() -> None:
    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    for version in SUPPORTED:
        assert Version(f"{version}.0") in spec, f"requires-python {spec} excludes {version}"
    oldest = Version(SUPPORTED[0])
    older = f"{oldest.major}.{oldest.minor - 1}.0"
    assert Version(older) not in spec, f"requires-python {spec} admits {older}, never tested"


def test_the_running_interpreter_is_supported() -> None:
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert running in SUPPORTED, f"running on Python {running}; rowbatch supports {SUPPORTED}"


def test_lint_and_type_check_target_the_oldest_version() -> None:
    tool = _pyproject()["tool"]
    oldest = SUPPORTED[0]
    assert tool["mypy"]["python_version"] == oldest
    assert tool["ruff"]["target-version"] == "py" + oldest.replace(".", "")


def test_ci_runs_the_unit_tests_on_each_supported_version() -> None:
    script = (REPO_ROOT / "scripts" / "test.sh").read_text()
    default = re.search(r"\$\{ROWBATCH_PYTHONS-([^}]*)\}", script)
    assert default is not None, "scripts/test.sh no longer reads ROWBATCH_PYTHONS with a default"
    assert tuple(default.group(1).split()) == SUPPORTED, (
        f"scripts/test.sh tests {default.group(1).split()} by default; rowbatch supports "
        f"{SUPPORTED}"
    )
    assert "tests/unit" in script
