"""``pip install rowbatch`` as a user does it: the checkout (not editable) into a fresh venv made
with the running interpreter. The resolver must take current releases (numpy 2, pyarrow >= 26),
install no model server, and leave working console scripts and importable packages. The wheel
holds one top-level package, ``rowbatch`` (no ``wire``, ``consumer``, ``harness``, ``bench``...)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.service import REPO_ROOT

INSTALL_TIMEOUT_S = 900
# What a source distribution of rowbatch needs: the package (rowbatch/, one real directory) and
# its metadata. No
# harness/ or bench/: the wheel must build without them (like deploy/Dockerfile).
_SOURCES = ("pyproject.toml", "README.md", "rowbatch")

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
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A fresh venv with the checkout's wheel installed in it, and that wheel; removed
    afterwards."""
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
        wheels = root / "wheels"
        pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip"]
        _run([*pip, "wheel", "-q", "--no-deps", "-w", wheels, source], root, INSTALL_TIMEOUT_S)
        (wheel,) = wheels.glob("rowbatch-*.whl")
        _run([*pip, "install", "-q", wheel], root, INSTALL_TIMEOUT_S)
        yield venv, wheel
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
def test_the_wheel_holds_the_rowbatch_package_alone(installed: tuple[Path, Path]) -> None:
    _, wheel = installed
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        tops = {name.split("/")[0] for name in names}
        dist_info = {t for t in tops if t.endswith(".dist-info")}
        assert len(dist_info) == 1, tops
        (info,) = dist_info
        entry_points = archive.read(f"{info}/entry_points.txt").decode()
    assert tops - dist_info == {"rowbatch"}, tops
    for part in ("consumer", "producer", "wire"):
        assert f"rowbatch/{part}/__init__.py" in names, part
    assert "rowbatch/py.typed" in names, "PEP 561 marker"
    assert "rowbatch-consumer = rowbatch.consumer.service.cli:entry" in entry_points
    assert "rowbatch-producer = rowbatch.producer.cli.main:main" in entry_points
    assert "rowbatch-stack" not in entry_points, "harness is not installed"


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
def test_fresh_install_takes_numpy_2_and_current_pyarrow(installed: tuple[Path, Path]) -> None:
    venv, _ = installed
    out = _run([venv / "bin" / "python", "-c", _VERSIONS], cwd=venv)
    versions: dict[str, str | None] = json.loads(out)
    assert versions["rowbatch"] is not None
    numpy, pyarrow = versions["numpy"], versions["pyarrow"]
    assert numpy is not None
    assert int(numpy.split(".")[0]) == 2, versions
    assert pyarrow is not None
    assert int(pyarrow.split(".")[0]) >= 26, versions
    assert versions["nvidia-pytriton"] is None, "a model server came in with rowbatch"
    _run([venv / "bin" / "python", "-m", "pip", "check"], cwd=venv)


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 120)
def test_fresh_install_runs_its_console_scripts_and_imports(installed: tuple[Path, Path]) -> None:
    venv, _ = installed
    for script in ("rowbatch-consumer", "rowbatch-producer"):
        out = _run([venv / "bin" / script, "--help"], cwd=venv)
        assert "usage" in out.lower(), out
    for module in ("rowbatch.consumer", "rowbatch.producer"):
        out = _run([venv / "bin" / "python", "-m", module, "--help"], cwd=venv)
        assert "usage" in out.lower(), out
    # From a directory outside the checkout, so only the installed packages can be found
    code = (
        "import importlib.util, json, rowbatch.consumer, rowbatch.producer, rowbatch.wire\n"
        "old = ['wire', 'consumer', 'producer', 'harness', 'bench']\n"
        "print(json.dumps([rowbatch.consumer.__file__,"
        " [n for n in old if importlib.util.find_spec(n) is not None]]))"
    )
    out = _run([venv / "bin" / "python", "-c", code], cwd=venv)
    where, importable = json.loads(out)
    assert str(venv) in where, where
    assert importable == [], f"{importable} installed as top-level names"
