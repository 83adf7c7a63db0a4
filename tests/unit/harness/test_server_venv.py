"""harness.server_venv: which interpreter the model servers' venvs are made with, where they go,
and the environment tritonserver gets from its own venv (no venv is made here)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from harness import server_venv
from harness.errors import PrerequisiteMissing
from harness.server_venv import ServerVenv, ensure_all, python_info, server_python
from harness.service import RunDir


@pytest.fixture(autouse=True)
def _fresh_probes() -> None:
    python_info.cache_clear()
    server_venv._runs.cache_clear()


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_configured_interpreter_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROWBATCH_SERVER_PYTHON", "/opt/python3.12")
    assert server_python() == "/opt/python3.12"


def test_a_broken_shim_on_path_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # pyenv puts shims for every installed version on PATH; those not selected exit 127
    _script(tmp_path / "python3.11", "echo 'pyenv: python3.11: command not found' >&2; exit 127")
    _script(tmp_path / "python3.12", f'exec {sys.executable} "$@"')
    monkeypatch.delenv("ROWBATCH_SERVER_PYTHON", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert server_python() == str(tmp_path / "python3.12")


def test_an_interpreter_that_does_not_run_is_named(tmp_path: Path) -> None:
    broken = _script(tmp_path / "python", "exit 3")
    with pytest.raises(PrerequisiteMissing, match="ROWBATCH_SERVER_PYTHON") as err:
        python_info(str(broken))
    assert str(broken) in str(err.value)


def test_python_info_names_version_and_libdir() -> None:
    info = python_info(sys.executable)
    assert info.version == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert info.libpython.name == f"libpython{info.version}.so.1.0"
    assert Path(info.executable).is_file()


def test_venv_path_is_cached_per_interpreter_and_requirements(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROWBATCH_CACHE", str(tmp_path))
    a = ServerVenv("demo", ("pkg==1",), python=sys.executable)
    b = ServerVenv("demo", ("pkg==2",), python=sys.executable)
    version = python_info(sys.executable).version
    assert a.path().parent == tmp_path / "venvs"
    assert a.path().name.startswith(f"demo-py{version}-")
    assert a.path() != b.path()
    assert a.path() == ServerVenv("demo", ("pkg==1",), python=sys.executable).path()
    assert not a.is_ready()


def test_a_venv_without_its_stamp_is_not_ready(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROWBATCH_CACHE", str(tmp_path))
    venv = ServerVenv("demo", ("pkg==1",), python=sys.executable)
    (venv.path() / "bin").mkdir(parents=True)
    (venv.path() / "bin" / "python").symlink_to(sys.executable)
    assert not venv.is_ready()  # half-made: ensure() would make it again


def test_unknown_server_venvs_are_named() -> None:
    with pytest.raises(ValueError, match=r"known: .*triton"):
        ensure_all(["nope"])


def test_triton_runs_with_its_own_venv_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.triton import TritonService, _Install

    venv = tmp_path / "venv"
    install = _Install(
        server=venv / "tritonserver",
        backend_lib=venv / "libtriton_python.so",
        backend_utils=venv / "triton_python_backend_utils.py",
        stub=venv / "triton_python_backend_stub",
        bundled_libs=venv / "nvidia_pytriton.libs",
        venv_bin=venv / "bin",
        libpython_dir=Path("/opt/python/lib"),
    )
    monkeypatch.setenv("PYTHONPATH", "/work/project/.venv/lib/python3.11/site-packages")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/lib")
    env = TritonService(RunDir(tmp_path / "run"))._env(install)
    assert env["PATH"].split(os.pathsep)[0] == str(venv / "bin")
    assert env["LD_LIBRARY_PATH"].split(os.pathsep) == [
        str(venv / "nvidia_pytriton.libs"),
        "/opt/python/lib",
        "/usr/local/lib",
    ]
    assert "PYTHONPATH" not in env  # the stub imports numpy from the Triton venv only


def test_prune_removes_only_venvs_no_server_uses(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ROWBATCH_CACHE", str(tmp_path))
    current = ServerVenv("demo", ("pkg==2",), python=sys.executable)
    monkeypatch.setattr(server_venv, "SERVER_VENVS", {"demo": current})
    venvs = tmp_path / "venvs"
    stale = venvs / "demo-py3.11-000000000000"
    busy = venvs / "demo-py3.11-111111111111"  # being made by another caller
    for path in (current.path(), stale, busy):
        path.mkdir(parents=True)
    with server_venv._locked(venvs / f"{busy.name}.lock") as held:
        assert held
        assert server_venv.prune_stale() == [stale]
    assert current.path().is_dir()
    assert busy.is_dir()
    assert not stale.exists()
