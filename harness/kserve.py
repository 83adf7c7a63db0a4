"""Launcher for KServe's Python model server (``kserve`` 0.21.0, from a venv of its own: see
:mod:`harness.server_venv`) serving the custom ``scorer`` model in
``deploy/oip_models/kserve/scorer.py`` over the Open Inference Protocol (gRPC and REST), on CPU.

The model script is KServe's documented way of serving a custom model: a ``kserve.Model``
subclass handed to ``kserve.ModelServer().start``, run as ``python scorer.py --grpc_port P
--http_port Q``. One process (``workers`` 1), free ports, both listeners on 127.0.0.1 (KServe
itself binds all interfaces; the script rebinds them, see its ``bind_to``), the per-request
latency log off. The server runs in a session of its own and is stopped by its process group.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from harness.errors import PrerequisiteMissing
from harness.oip_ready import ReadyCheck
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.server_venv import SERVER_VENVS, ServerVenv
from harness.service import REPO_ROOT, ManagedService, RunDir

log = logging.getLogger(__name__)

KSERVE_VERSION = "0.21.0"
#: The venv KServe runs from (``kserve==KSERVE_VERSION``; made once per machine, cached; see
#: harness.server_venv, where every server venv is listed).
KSERVE_VENV = SERVER_VENVS["kserve"]
MODEL_SCRIPT = REPO_ROOT / "deploy" / "oip_models" / "kserve" / "scorer.py"
READY_TIMEOUT_S = 90.0
#: COUNT values the scorer model answers with an error instead of a score (keep equal to
#: ``INVALID_COUNT`` / ``CRASH_COUNT`` in the model script): ``kserve.errors.InvalidInput``
#: (gRPC INVALID_ARGUMENT, its message kept) and a plain ``RuntimeError`` (gRPC INTERNAL,
#: "Internal server error").
INVALID_COUNT = -7777
CRASH_COUNT = -9999


@dataclass(frozen=True)
class KServeEndpoint:
    """Where a running KServe model server listens, and what it serves."""

    grpc_url: str  # "127.0.0.1:PORT", as tritonclient.grpc and the consumer's model.url want it
    http_url: str  # "http://127.0.0.1:PORT"
    model: str
    model_version: str  # what every response's model_version says
    pid: int  # the server process (its process group's id too)


@dataclass(frozen=True)
class KServeModel:
    """What a KServe model server serves: the scorer of ``script`` under the name ``name``,
    its responses carrying ``version``; ``declare_tensors`` False: ModelMetadata lists no
    inputs or outputs (as for a ``kserve.Model`` that does not declare them)."""

    name: str = "scorer"
    version: str = "1"
    declare_tensors: bool = True
    script: Path = MODEL_SCRIPT


@dataclass(frozen=True)
class KServePorts:
    """The two ports one KServe model server listens on (127.0.0.1)."""

    grpc: int
    http: int

    @classmethod
    def free(cls) -> KServePorts:
        return cls(free_port(), free_port())


class KServeService(ManagedService[KServeEndpoint]):
    """``with KServeService(run) as endpoint:`` runs the model server until the block ends.

    ``model``: what it serves (:class:`KServeModel`); ``log_level``: KServe's
    (``KSERVE_LOGLEVEL``; INFO logs a line per gRPC call, WARNING keeps benchmarks quiet)."""

    name = "kserve"

    def __init__(
        self,
        run: RunDir,
        *,
        model: KServeModel | None = None,
        log_level: str = "INFO",
        name: str | None = None,
        ports: KServePorts | None = None,
        venv: ServerVenv = KSERVE_VENV,
    ) -> None:
        if name is not None:
            self.name = name
        self.run = run
        model = model or KServeModel()
        self.model = model.name
        self.model_version = model.version
        self.declare_tensors = model.declare_tensors
        self.script = model.script.resolve()
        self.log_level = log_level
        self.ports = ports
        self.venv = venv
        self._process: ServiceProcess | None = None

    def _env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("KSERVE_") and k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        }
        env["KSERVE_LOGLEVEL"] = self.log_level
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def argv(self, python: Path, ports: KServePorts) -> list[str]:
        """The command line that starts the server."""
        return [
            str(python),
            str(self.script),
            f"--model_name={self.model}",
            f"--model_version={self.model_version}",
            f"--declare_tensors={str(self.declare_tensors).lower()}",
            f"--bind_address={LOOPBACK}",
            f"--grpc_port={ports.grpc}",
            f"--http_port={ports.http}",
            "--workers=1",
            "--enable_latency_logging=false",
        ]

    def start(self) -> KServeEndpoint:
        if not self.script.is_file():
            raise PrerequisiteMissing(
                f"the KServe model script {self.script}",
                "the repository's deploy/oip_models/kserve",
            )
        python = self.venv.bin("python")
        if not python.is_file():
            raise PrerequisiteMissing(
                f"{python}", f"a working {self.venv.name} venv (remove it to remake it)"
            )
        self.ports = self.ports or KServePorts.free()
        self._process = ServiceProcess(
            self.name,
            self.argv(python, self.ports),
            self.run.log(self.name),
            env=self._env(),
            cwd=self.run.data(self.name),
        )
        started = time.monotonic()
        self._process.start()
        grpc_url = f"{LOOPBACK}:{self.ports.grpc}"
        self._process.wait_ready(ReadyCheck(grpc_url, [self.model]), READY_TIMEOUT_S, 0.25)
        log.info(
            "kserve ready in %.1f s on %s (model %s)",
            time.monotonic() - started,
            grpc_url,
            self.model,
        )
        assert self._process.pid is not None
        return KServeEndpoint(
            grpc_url=grpc_url,
            http_url=f"http://{LOOPBACK}:{self.ports.http}",
            model=self.model,
            model_version=self.model_version,
            pid=self._process.pid,
        )

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None

    def kill(self) -> None:
        """SIGKILL the server (its process group), as a crash would; :meth:`start` brings it
        back on the same ports."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
