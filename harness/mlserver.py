"""Launcher for a real Seldon MLServer (1.7.1, from a venv of its own: see
:mod:`harness.server_venv`) serving the custom models in ``deploy/oip_models/mlserver/`` over the
Open Inference Protocol (gRPC and HTTP), on CPU.

Each start copies the model repository into the run directory and writes a ``settings.json``
beside the models (MLServer reads both from the folder ``mlserver start`` is given): every
listener on 127.0.0.1 (``host`` applies to gRPC, HTTP and metrics), free ports, the metrics
server and the per-request access log off, ``parallel_workers`` as asked (MLServer's default
1: the model runs in a worker process; 0: in the server process). The server runs in a session
of its own, so stopping it by its pid's process group also ends its workers.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import PrerequisiteMissing
from harness.oip_ready import ReadyCheck
from harness.proc import LOOPBACK, ProcessGroupService, ServiceProcess, free_port
from harness.server_venv import SERVER_VENVS, ServerVenv
from harness.service import REPO_ROOT, ManagedService, RunDir

log = logging.getLogger(__name__)

MLSERVER_VERSION = "1.7.1"
#: The venv MLServer runs from (made once per machine, cached; see harness.server_venv).
MLSERVER_VENV = SERVER_VENVS["mlserver"]
MODEL_REPOSITORY = REPO_ROOT / "deploy" / "oip_models" / "mlserver"
READY_TIMEOUT_S = 120.0
_SETTINGS = "model-settings.json"


@dataclass(frozen=True)
class MLServerEndpoint:
    """Where a running MLServer listens, and what it serves."""

    grpc_url: str  # "127.0.0.1:PORT", as tritonclient.grpc and the consumer's model.url want it
    http_url: str  # "http://127.0.0.1:PORT"
    models: tuple[str, ...]
    repository: Path  # the copy it serves (model-settings.json as started)


@dataclass(frozen=True)
class MLServerPorts:
    """The ports one MLServer is given (127.0.0.1); metrics stays unbound while disabled."""

    grpc: int
    http: int
    metrics: int

    @classmethod
    def free(cls) -> MLServerPorts:
        return cls(free_port(), free_port(), free_port())


def model_names(repository: Path) -> list[str]:
    """The models of an MLServer repository: each ``model-settings.json``'s ``name``, else its
    folder's name (as MLServer names them)."""
    names = []
    for path in sorted(repository.glob(f"**/{_SETTINGS}")):
        settings = json.loads(path.read_text())
        names.append(str(settings.get("name") or path.parent.name))
    return names


def server_settings(ports: MLServerPorts, parallel_workers: int) -> dict[str, Any]:
    """The ``settings.json`` the launcher writes (MLServer's server-wide ``Settings``)."""
    return {
        "host": LOOPBACK,
        "grpc_port": ports.grpc,
        "http_port": ports.http,
        "metrics_port": ports.metrics,
        "metrics_endpoint": None,  # no metrics server, no Prometheus interceptor
        "debug": False,  # no access-log line per request
        "parallel_workers": parallel_workers,
        "load_models_at_startup": True,
    }


class MLServerService(ProcessGroupService, ManagedService[MLServerEndpoint]):
    """``with MLServerService(run) as endpoint:`` runs MLServer until the block ends.

    ``model_overrides`` maps a model name to fields merged into its ``model-settings.json``
    (e.g. ``{"scorer": {"max_batch_size": 1}}`` turns adaptive batching off);
    ``parallel_workers`` is MLServer's server-wide setting of that name (default 1, as in
    MLServer: the model runs in one worker process; 0 runs it in the server process).

    :meth:`stop` SIGTERMs the server (it stops its workers, which ignore signals themselves),
    then SIGKILLs whatever of its process group outlived it (a worker or multiprocessing's
    resource tracker)."""

    name = "mlserver"

    def __init__(
        self,
        run: RunDir,
        model_repository: Path = MODEL_REPOSITORY,
        *,
        parallel_workers: int = 1,
        model_overrides: Mapping[str, Mapping[str, Any]] | None = None,
        name: str | None = None,
        ports: MLServerPorts | None = None,
        venv: ServerVenv = MLSERVER_VENV,
    ) -> None:
        if name is not None:
            self.name = name
        self.run = run
        self.model_repository = model_repository.resolve()
        self.parallel_workers = parallel_workers
        self.model_overrides = dict(model_overrides or {})
        self.ports = ports
        self.venv = venv
        self._process: ServiceProcess | None = None

    def _prepare(self, ports: MLServerPorts) -> Path:
        """A fresh copy of the repository with ``settings.json`` and the overrides applied."""
        root = self.run.data(self.name) / "repository"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(self.model_repository, root, ignore=shutil.ignore_patterns("__pycache__"))
        (root / "settings.json").write_text(
            json.dumps(server_settings(ports, self.parallel_workers), indent=2)
        )
        unknown = set(self.model_overrides)
        for path in root.glob(f"**/{_SETTINGS}"):
            settings = json.loads(path.read_text())
            model = str(settings.get("name") or path.parent.name)
            if model in self.model_overrides:
                unknown.discard(model)
                settings.update(self.model_overrides[model])
                path.write_text(json.dumps(settings, indent=2))
        if unknown:
            raise ValueError(f"model_overrides name models not in {root}: {sorted(unknown)}")
        return root

    def _env(self, venv_bin: Path) -> dict[str, str]:
        dropped = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("MLSERVER_") and k not in dropped
        }
        env["PATH"] = os.pathsep.join([str(venv_bin), env.get("PATH", "")])
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self) -> MLServerEndpoint:
        models = model_names(self.model_repository)
        if not models:
            raise PrerequisiteMissing(
                f"MLServer models ({_SETTINGS}) in {self.model_repository}",
                "the repository's deploy/oip_models/mlserver",
            )
        executable = self.venv.bin("mlserver")
        if not executable.is_file():
            raise PrerequisiteMissing(
                f"{executable}", f"a working {self.venv.name} venv (remove it to remake it)"
            )
        self.ports = self.ports or MLServerPorts.free()
        repository = self._prepare(self.ports)
        self._process = ServiceProcess(
            self.name,
            [str(executable), "start", str(repository)],
            self.run.log(self.name),
            env=self._env(executable.parent),
            cwd=self.run.data(self.name),  # MLServer keeps .envs / .metrics in its cwd
        )
        started = time.monotonic()
        self._process.start()
        grpc_url = f"{LOOPBACK}:{self.ports.grpc}"
        self._process.wait_ready(ReadyCheck(grpc_url, models), READY_TIMEOUT_S, 0.25)
        log.info(
            "mlserver ready in %.1f s on %s (models %s)",
            time.monotonic() - started,
            grpc_url,
            models,
        )
        return MLServerEndpoint(
            grpc_url=grpc_url,
            http_url=f"http://{LOOPBACK}:{self.ports.http}",
            models=tuple(models),
            repository=repository,
        )
