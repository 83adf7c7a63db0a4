"""``pip install rowbatch`` as a user does it: the checkout (not editable) into a fresh venv made
with the running interpreter. The resolver must take current releases (numpy 2, pyarrow >= 26),
install no model server, and leave working console scripts and importable packages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.service import REPO_ROOT

INSTALL_TIMEOUT_S = 900
# What a source distribution of rowbatch holds (pyproject's packages, like deploy/Dockerfile)
_SOURCES = ("pyproject.toml", "README.md", "wire", "consumer", "producer", "harness", "bench")

_VERSIONS = """\
import importlib.metadata as md, json
names = ["rowbatch", "numpy", "pyarrow", "nvidia-pytriton"]
found = {}
for name in names:
    try:
        found[name] = md.version(name)
    except md.PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _run(argv: list[str | Path], cwd: Path, timeout: float = 120) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh venv with the checkout installed in it; removed afterwards."""
    root = tmp_path_factory.mktemp("install")
    try:
        source = root / "src"
        source.mkdir()
        for name in _SOURCES:
            path = REPO_ROOT / name
            if path.is_dir():
                ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
                shutil.copytree(path, source / name, ignore=ignore)
            else:
                shutil.copy2(path, source / name)
        venv = root / "venv"
        _run([sys.executable, "-m", "venv", venv], cwd=root)
        _run(
            [venv / "bin" / "python", "-m", "pip", "install", "-q", source], root, INSTALL_TIMEOUT_S
        )
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
def test_fresh_install_takes_numpy_2_and_current_pyarrow(installed: Path) -> None:
    out = _run([installed / "bin" / "python", "-c", _VERSIONS], cwd=installed)
    versions: dict[str, str | None] = json.loads(out)
    assert versions["rowbatch"] is not None
    numpy, pyarrow = versions["numpy"], versions["pyarrow"]
    assert numpy is not None
    assert int(numpy.split(".")[0]) == 2, versions
    assert pyarrow is not None
    assert int(pyarrow.split(".")[0]) >= 26, versions
    assert versions["nvidia-pytriton"] is None, "a model server came in with rowbatch"
    _run([installed / "bin" / "python", "-m", "pip", "check"], cwd=installed)


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
def test_fresh_install_runs_its_console_scripts_and_imports(installed: Path) -> None:
    for script in ("rowbatch-consumer", "rowbatch-producer"):
        out = _run([installed / "bin" / script, "--help"], cwd=installed)
        assert "usage" in out.lower(), out
    # From a directory outside the checkout, so only the installed packages can be found
    code = "import consumer, producer, wire; print(consumer.__file__)"
    out = _run([installed / "bin" / "python", "-c", code], cwd=installed)
    assert str(installed) in out, out
