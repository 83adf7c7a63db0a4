"""Launcher for a real NVIDIA Triton Inference Server (the ``tritonserver`` binary shipped in the
``nvidia-pytriton`` wheel), serving the Python-backend models in ``deploy/models/`` on CPU.

tritonserver runs from a venv of its own (:data:`harness.server_venv.TRITON_VENV`, made once
per machine under ``~/.cache/rowbatch/venvs/``), so the wheel's pins (numpy < 2) never reach
the project's environment. Recipe (see HARNESS.md): a backend dir
``<run>/triton/backends/python/`` with the wheel's ``libtriton_python.so``,
``triton_python_backend_utils.py`` and the Python-backend stub for the venv interpreter's
version; ``LD_LIBRARY_PATH`` naming the wheel's bundled libs and that interpreter's own
``libpython`` (else the stub loads another one and fails); the venv's ``bin`` first on ``PATH``
so the stub imports numpy from it. Ports are picked free at start; everything binds to
127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import tritonclient.grpc as grpcclient

from harness.chaos import CONTROL_ENV, ChaosControl
from harness.errors import PrerequisiteMissing
from harness.oip_ready import ReadyCheck
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.server_venv import SERVER_PYTHON_ENV, TRITON_VENV, ServerVenv
from harness.service import REPO_ROOT, ManagedService, RunDir
from rowbatch.consumer.model.server_stats import QueueTotals, queue_totals

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 90.0
_INSTALL_HINT = (
    "the harness makes the venv itself (python -m harness server-venvs, run by "
    "scripts/setup.sh); the nvidia-pytriton wheel that ships tritonserver needs Linux "
    "x86_64/aarch64 with glibc >= 2.35 and, for the Python-backend stub, a CPython 3.8-3.13 "
    f"built with a shared libpython ({SERVER_PYTHON_ENV} chooses it)"
)


@dataclass(frozen=True)
class TritonEndpoint:
    """Where a running Triton listens, and the files that steer its test models."""

    grpc_url: str  # "127.0.0.1:PORT", as tritonclient.grpc wants it
    http_url: str  # "http://127.0.0.1:PORT"
    metrics_url: str  # "http://127.0.0.1:PORT/metrics" (Prometheus text)
    model_repository: Path
    chaos_control: Path  # write harness.chaos.ChaosControl here to steer the "chaos" model
    tls: TritonTls | None = None  # set when gRPC serves TLS only


@dataclass(frozen=True)
class TritonPorts:
    """The three ports one tritonserver listens on (127.0.0.1)."""

    grpc: int
    http: int
    metrics: int

    @classmethod
    def free(cls) -> TritonPorts:
        return cls(free_port(), free_port(), free_port())


@dataclass(frozen=True)
class TritonTls:
    """TLS on Triton's gRPC endpoint (HTTP stays plain). ``ca_cert`` is the CA the readiness
    check trusts for the server's certificate and, with ``mutual``, the CA client certificates
    must chain to (``--grpc-root-cert``); the readiness check then presents ``client_cert`` /
    ``client_key``."""

    server_cert: Path
    server_key: Path
    ca_cert: Path
    mutual: bool = False
    client_cert: Path | None = None
    client_key: Path | None = None

    def __post_init__(self) -> None:
        if self.mutual and (self.client_cert is None or self.client_key is None):
            raise ValueError("mutual TLS needs client_cert and client_key for the ready check")

    def server_args(self) -> list[str]:
        args = [
            "--grpc-use-ssl=true",
            f"--grpc-server-cert={self.server_cert}",
            f"--grpc-server-key={self.server_key}",
            f"--grpc-root-cert={self.ca_cert}",
        ]
        if self.mutual:
            args.append("--grpc-use-ssl-mutual=true")
        return args


@dataclass(frozen=True)
class _Install:
    """The pieces of the nvidia-pytriton wheel (in the Triton venv) that running tritonserver
    needs, and the venv interpreter's paths its Python-backend stub needs."""

    server: Path
    backend_lib: Path
    backend_utils: Path
    stub: Path
    bundled_libs: Path
    venv_bin: Path  # first on the server's PATH: the stub imports numpy from this venv
    libpython_dir: Path  # the venv interpreter's LIBDIR, holding its shared libpython


_SITE_PROBE = "import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent)"


def find_install(venv: ServerVenv = TRITON_VENV) -> _Install:
    """Make (once) the Triton venv and locate the wheel's files for its interpreter, or say
    what is missing."""
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else None
    python = venv.venv_python()
    if not python.shared or not python.libpython.exists():
        raise PrerequisiteMissing(
            f"{python.libpython} (the Python-backend stub embeds the Triton venv's "
            f"interpreter {python.executable}, which needs a shared libpython)",
            f"set {SERVER_PYTHON_ENV} to a CPython built with --enable-shared (Debian's "
            "/usr/bin/python3.11 is; pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared pyenv install "
            "3.11)",
        )
    root = _pytriton_dir(venv)
    bundle = root / "tritonserver"
    install = _Install(
        server=bundle / "bin" / "tritonserver",
        backend_lib=bundle / "backends" / "python" / "libtriton_python.so",
        backend_utils=bundle / "backends" / "python" / "triton_python_backend_utils.py",
        stub=bundle / "python_backend_stubs" / python.version / "triton_python_backend_stub",
        bundled_libs=root.parent / "nvidia_pytriton.libs",
        venv_bin=Path(python.executable).parent,
        libpython_dir=python.libdir,
    )
    for path in (install.server, install.backend_lib, install.backend_utils, install.stub):
        if not path.is_file():
            raise PrerequisiteMissing(
                f"{path} (Python {python.version} in {venv.path()}; glibc here: {glibc})",
                _INSTALL_HINT,
            )
    return install


def _pytriton_dir(venv: ServerVenv) -> Path:
    python = str(venv.bin("python"))
    try:
        out = subprocess.run(
            [python, "-c", _SITE_PROBE], capture_output=True, text=True, check=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", None) or exc
        raise PrerequisiteMissing(
            f"the nvidia-pytriton package in the Triton venv {venv.path()} ({detail})",
            "remove that directory so the harness makes it again; " + _INSTALL_HINT,
        ) from exc
    return Path(out.stdout.strip())


def _backend_dir(install: _Install, root: Path) -> Path:
    """``root/backends`` with ``python/`` laid out as tritonserver's --backend-directory wants."""
    python_dir = root / "backends" / "python"
    python_dir.mkdir(parents=True, exist_ok=True)
    for src in (install.backend_lib, install.backend_utils, install.stub):
        shutil.copy2(src, python_dir / src.name)
    return root / "backends"


def _model_names(repository: Path) -> list[str]:
    return sorted(p.parent.name for p in repository.glob("*/config.pbtxt"))


class TritonService(ManagedService[TritonEndpoint]):
    """``with TritonService(run) as endpoint:`` runs tritonserver until the block ends.

    Optional: ``tls`` serves gRPC over TLS (or mutual TLS) only; ``models`` loads just these
    models of the repository (explicit model control); ``name`` names its data dir and log, so
    a second server in the same run does not share the first one's files; ``ports`` fixes its
    ports (default: free ones, kept for the next :meth:`start`, so a server stopped or
    :meth:`kill`-ed comes back on the same address)."""

    name = "triton"

    def __init__(
        self,
        run: RunDir,
        model_repository: Path = REPO_ROOT / "deploy" / "models",
        chaos_control: Path | None = None,
        *,
        tls: TritonTls | None = None,
        models: Sequence[str] | None = None,
        name: str | None = None,
        ports: TritonPorts | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self.ports = ports
        self.run = run
        self.tls = tls
        self.models = list(models) if models is not None else None
        self.model_repository = model_repository.resolve()
        self.chaos_control = chaos_control or run.data(self.name) / "chaos-control.json"
        self._process: ServiceProcess | None = None

    def _env(self, install: _Install) -> dict[str, str]:
        env = dict(os.environ)
        libs = [str(install.bundled_libs), str(install.libpython_dir)]
        if env.get("LD_LIBRARY_PATH"):
            libs.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(libs)
        env["PATH"] = os.pathsep.join([str(install.venv_bin), env.get("PATH", "")])
        # The stub's interpreter must see the Triton venv, not the caller's
        for name in ("VIRTUAL_ENV", "PYTHONHOME", "PYTHONPATH"):
            env.pop(name, None)
        env[CONTROL_ENV] = str(self.chaos_control)
        return env

    def start(self) -> TritonEndpoint:
        install = find_install()
        available = _model_names(self.model_repository)
        models = available if self.models is None else self.models
        if not models:
            raise PrerequisiteMissing(
                f"models in {self.model_repository}", "a Triton model repository (deploy/models)"
            )
        if not set(models) <= set(available):
            raise PrerequisiteMissing(
                f"models {sorted(set(models) - set(available))} in {self.model_repository} "
                f"(it has {available})",
                "a Triton model repository (deploy/models)",
            )
        backends = _backend_dir(install, self.run.data(self.name))
        ChaosControl().write(self.chaos_control)  # every run starts without faults
        self.ports = self.ports or TritonPorts.free()
        grpc_port, http_port, metrics_port = self.ports.grpc, self.ports.http, self.ports.metrics
        argv = [
            str(install.server),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={grpc_port}",
            "--allow-http=true",
            f"--http-address={LOOPBACK}",
            f"--http-port={http_port}",
            f"--metrics-address={LOOPBACK}",
            f"--metrics-port={metrics_port}",
            "--allow-gpu-metrics=false",
            "--exit-on-error=true",
        ]
        if self.models is not None:
            argv += ["--model-control-mode=explicit", *(f"--load-model={m}" for m in models)]
        if self.tls is not None:
            argv += self.tls.server_args()
        self._process = ServiceProcess(
            self.name, argv, self.run.log(self.name), env=self._env(install)
        )
        started = time.monotonic()
        self._process.start()
        grpc_url = f"{LOOPBACK}:{grpc_port}"
        self._process.wait_ready(ReadyCheck(grpc_url, models, self.tls), READY_TIMEOUT_S, 0.25)
        log.info(
            "triton ready in %.1f s on %s (models %s)", time.monotonic() - started, grpc_url, models
        )
        return TritonEndpoint(
            grpc_url=grpc_url,
            http_url=f"http://{LOOPBACK}:{http_port}",
            metrics_url=f"http://{LOOPBACK}:{metrics_port}/metrics",
            model_repository=self.model_repository,
            chaos_control=self.chaos_control,
            tls=self.tls,
        )

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def kill(self) -> None:
        """SIGKILL the server and its backend stubs (its process group), as a crash would;
        :meth:`start` brings it back on the same ports."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()


def model_queue_totals(grpc_url: str, model: str) -> QueueTotals:
    """``model``'s queue and compute totals from the server's statistics now (what the
    consumer's admission reads; tests and benchmarks compare two)."""
    client = grpcclient.InferenceServerClient(grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    totals = queue_totals(stats, model, time.monotonic())
    if totals is None:
        raise RuntimeError(f"Triton at {grpc_url} keeps no statistics for {model}")
    return totals
