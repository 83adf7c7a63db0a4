"""Model servers in virtual environments of their own (tritonserver from ``nvidia-pytriton``,
MLServer, KServe), so their pins (numpy < 2, an older protobuf...) never constrain the project's
own dependencies. Each venv is made once per machine under :func:`harness.service.cache_dir`
(``~/.cache/rowbatch/venvs/``, like the Kafka jars), keyed by its interpreter and requirements,
and reused after.

The interpreter is ``$ROWBATCH_SERVER_PYTHON``, else the first of :data:`PREFERRED_PYTHONS`
that runs, else the one running this code. Concurrent callers (two test sessions) take a file
lock; a half-made venv (no stamp) is removed and made again. Venvs of older pins stay until
:func:`prune_stale` (``python -m harness server-venvs --prune``) removes them.

:data:`SERVER_VENVS` lists every server venv the harness uses; ``python -m harness
server-venvs`` (run by ``scripts/setup.sh``) makes them all ahead of the tests.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.errors import PrerequisiteMissing
from harness.service import cache_dir

log = logging.getLogger(__name__)

#: Interpreter for the servers' venvs when ``ROWBATCH_SERVER_PYTHON`` is not set: the first of
#: these on PATH that runs (the servers' wheels cover these versions), else the running one.
PREFERRED_PYTHONS = ("python3.11", "python3.12")
SERVER_PYTHON_ENV = "ROWBATCH_SERVER_PYTHON"
INSTALL_TIMEOUT_S = 1800.0
_STAMP = ".rowbatch-server-venv"
_PYTHON_HINT = (
    f"set {SERVER_PYTHON_ENV} to a CPython 3.11 or 3.12 with venv and pip "
    "(Debian: apt-get install python3.11-venv)"
)

_PROBE = """\
import json, sys, sysconfig
print(json.dumps({
    "executable": sys.executable,
    "version": "%d.%d" % sys.version_info[:2],
    "full_version": "%d.%d.%d" % sys.version_info[:3],
    "libdir": sysconfig.get_config_var("LIBDIR") or "",
    "shared": bool(sysconfig.get_config_var("Py_ENABLE_SHARED")),
}))
"""


@dataclass(frozen=True)
class PythonInfo:
    """What a server venv's users need to know of an interpreter."""

    executable: str  # sys.executable, resolved (a pyenv shim becomes the real binary)
    version: str  # "3.11"
    full_version: str  # "3.11.7"
    libdir: Path  # sysconfig LIBDIR: where its shared libpython lives, when it has one
    shared: bool  # built with --enable-shared (a libpython*.so to embed)

    @property
    def libpython(self) -> Path:
        """The shared libpython an embedding binary (Triton's Python-backend stub) loads."""
        return self.libdir / f"libpython{self.version}.so.1.0"


@functools.cache
def python_info(python: str) -> PythonInfo:
    """Ask the interpreter ``python`` about itself (cached per name for this process)."""
    try:
        out = subprocess.run(
            [python, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
        )
        data = json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        detail = str(getattr(exc, "stderr", None) or exc).strip()
        raise PrerequisiteMissing(
            f"a working Python interpreter at {python!r} for the model servers' venvs ({detail})",
            _PYTHON_HINT,
        ) from exc
    return PythonInfo(
        executable=str(data["executable"]),
        version=str(data["version"]),
        full_version=str(data["full_version"]),
        libdir=Path(str(data["libdir"])),
        shared=bool(data["shared"]),
    )


@functools.cache
def _runs(python: str) -> bool:
    try:
        python_info(python)
    except PrerequisiteMissing:
        return False
    return True


def server_python() -> str:
    """The interpreter server venvs are made with: ``$ROWBATCH_SERVER_PYTHON``, else the first
    of :data:`PREFERRED_PYTHONS` on PATH that runs (pyenv installs shims for versions that are
    not selected, which fail), else this process's base interpreter."""
    configured = os.environ.get(SERVER_PYTHON_ENV)
    if configured:
        return configured
    for name in PREFERRED_PYTHONS:
        found = shutil.which(name)
        if found and _runs(found):
            return found
    return str(getattr(sys, "_base_executable", sys.executable))


@dataclass(frozen=True)
class ServerVenv:
    """A venv named ``name`` holding ``requirements`` (pip specifiers, pinned for
    reproducibility), made with ``python`` (default: :func:`server_python`, resolved when first
    needed). :meth:`ensure` makes it when absent and returns its directory."""

    name: str
    requirements: tuple[str, ...]
    python: str | None = None
    pip_args: tuple[str, ...] = ()
    """Extra ``pip install`` arguments (e.g. ``--only-binary=:all:``)."""

    def base_python(self) -> PythonInfo:
        """The interpreter this venv is (or will be) made with."""
        return python_info(self.python or server_python())

    def key(self, base: PythonInfo) -> str:
        """Changes with the interpreter (a new patch release breaks a venv's links to it) and
        with the requirements."""
        spec = "\n".join([base.executable, base.full_version, *self.requirements, *self.pip_args])
        return hashlib.sha256(spec.encode()).hexdigest()[:12]

    def path(self) -> Path:
        """Where this venv lives (it may not exist yet)."""
        base = self.base_python()
        return cache_dir() / "venvs" / f"{self.name}-py{base.version}-{self.key(base)}"

    def is_ready(self) -> bool:
        """Made completely and its interpreter still runs (its base was not removed)."""
        root = self.path()
        return (root / _STAMP).is_file() and (root / "bin" / "python").exists()

    def ensure(self) -> Path:
        """The venv's directory, made (under a lock) when it is absent or half-made. The first
        call on a machine downloads and installs the requirements (minutes); later ones only
        check the stamp."""
        root = self.path()
        if self.is_ready():
            return root
        root.parent.mkdir(parents=True, exist_ok=True)
        with _locked(root.parent / f"{root.name}.lock"):
            if self.is_ready():
                return root
            shutil.rmtree(root, ignore_errors=True)  # half-made by a caller that was stopped
            base = self.base_python()
            started = time.monotonic()
            log.info(
                "making the %s server venv at %s with Python %s (once per machine; minutes)",
                self.name,
                root,
                base.full_version,
            )
            self._run([base.executable, "-m", "venv", str(root)], "python -m venv")
            py = str(root / "bin" / "python")
            pip = [py, "-m", "pip", "--disable-pip-version-check"]
            self._run([*pip, "install", "-q", "--upgrade", "pip"], "pip upgrade")
            self._run(
                [*pip, "install", "-q", *self.pip_args, *self.requirements],
                f"pip install {' '.join(self.requirements)}",
            )
            (root / _STAMP).write_text("\n".join(self.requirements) + "\n")
            log.info("%s server venv ready in %.0f s", self.name, time.monotonic() - started)
        return root

    def bin(self, executable: str) -> Path:
        """``<venv>/bin/<executable>`` of the made venv."""
        return self.ensure() / "bin" / executable

    def venv_python(self) -> PythonInfo:
        """The made venv's own interpreter, asked about itself (its LIBDIR is its base's)."""
        return python_info(str(self.bin("python")))

    def _run(self, argv: Sequence[str], what: str) -> None:
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise PrerequisiteMissing(
                f"the {self.name} server venv ({what} failed: {exc})",
                f"network access to the package index, and {_PYTHON_HINT}",
            ) from exc
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-2000:]
            raise PrerequisiteMissing(
                f"the {self.name} server venv ({what} exited {done.returncode}: {tail})",
                "network access to the package index (pip's output is quoted above); "
                f"{_PYTHON_HINT}",
            )


@contextlib.contextmanager
def _locked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold ``path``'s lock; with ``wait=False`` yields False at once when another holds it."""
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


#: The venv tritonserver and its Python-backend stub run from: the ``nvidia-pytriton`` wheel
#: ships the real binary (Linux, glibc >= 2.35) and pins numpy < 2, which the stub (and so the
#: models in ``deploy/models``) imports.
TRITON_VENV = ServerVenv("triton", ("nvidia-pytriton==0.7.0", "numpy>=1.26,<2"))

#: llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``) and the ``gguf``
#: writer the harness makes its tiny model with.
LLAMA_VENV = ServerVenv("llama", ("llama-cpp-python[server]==0.3.36", "gguf==0.19.0"))

#: Every server venv the harness uses, by name; ``python -m harness server-venvs`` makes them.
SERVER_VENVS: dict[str, ServerVenv] = {
    "triton": TRITON_VENV,
    # harness/mlserver.py; uvloop 0.22+ kills MLServer 1.7.1's workers (no current event loop)
    "mlserver": ServerVenv("mlserver", ("mlserver==1.7.1", "uvloop==0.21.0")),
    "kserve": ServerVenv("kserve", ("kserve==0.21.0",)),  # harness/kserve.py
    # harness/llama.py: llama.cpp's OpenAI-compatible server; PyPI has only the source, which
    # compiles for ~8-9 minutes on 2 cores, so scripts/test.sh makes it in the background
    "llama": LLAMA_VENV,
}


def ensure_all(names: Sequence[str] | None = None) -> dict[str, Path]:
    """Make the named server venvs (default: all of :data:`SERVER_VENVS`); their directories."""
    chosen = list(SERVER_VENVS) if names is None else list(names)
    unknown = sorted(set(chosen) - set(SERVER_VENVS))
    if unknown:
        raise ValueError(f"unknown server venvs {unknown}; known: {sorted(SERVER_VENVS)}")
    return {name: SERVER_VENVS[name].ensure() for name in chosen}


def prune_stale() -> list[Path]:
    """Remove the venvs under the cache that no entry of :data:`SERVER_VENVS` uses any more
    (older pins or interpreters), skipping any being made now; the removed directories."""
    venvs = cache_dir() / "venvs"
    current = {venv.path().name for venv in SERVER_VENVS.values()}
    removed: list[Path] = []
    for path in sorted(venvs.glob("*")) if venvs.is_dir() else []:
        if not path.is_dir() or path.name in current:
            continue
        with _locked(venvs / f"{path.name}.lock", wait=False) as mine:
            if mine:
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
