"""Jaeger (v2, all-in-one, in-memory storage) built from the Go module proxy: the trace backend
the tracing tests and the local stack send spans to (OTLP over gRPC) and read back through its
query API.

The binary is built once per machine into the cache (``go get -tool`` in a scratch module, then
``go build``: ``go install`` refuses the module for its ``replace`` directives); that takes
minutes on two cores, so ``scripts/setup.sh`` starts it in the background early."""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from harness.errors import PrerequisiteMissing
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.service import ManagedService, RunDir, cache_dir

JAEGER_MODULE: Final = "github.com/jaegertracing/jaeger"
JAEGER_VERSION: Final = "v1.76.0"
_READY_TIMEOUT_S: Final = 60.0
_HTTP_TIMEOUT_S: Final = 10.0


def binary_path() -> Path:
    """Where the built binary is kept: ``<cache>/jaeger-<version>/jaeger``."""
    return cache_dir() / f"jaeger-{JAEGER_VERSION}" / "jaeger"


def build_jaeger(*, log: Path | None = None) -> Path:
    """The Jaeger binary, built first if the cache lacks it (minutes). The build output goes
    to ``log`` when given. Builds are serialized by a lock file, so a test that needs the binary
    while ``scripts/setup.sh``'s background build runs waits for that one."""
    binary = binary_path()
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    with (binary.parent / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.is_file():
            return binary
        return _build(binary, log)


def _build(binary: Path, log: Path | None) -> Path:
    go = shutil.which("go")
    if go is None:
        raise PrerequisiteMissing("Go (to build Jaeger)", "install Go 1.24 or newer")
    work = binary.parent / "module"
    work.mkdir(parents=True, exist_ok=True)
    steps = [
        [go, "mod", "init", "rowbatch-jaeger"],
        [go, "get", "-tool", f"{JAEGER_MODULE}/cmd/jaeger@{JAEGER_VERSION}"],
        [go, "build", "-o", str(binary) + ".part", f"{JAEGER_MODULE}/cmd/jaeger"],
    ]
    if (work / "go.mod").exists():
        steps = steps[1:]
    with contextlib.ExitStack() as stack:
        # Go's output to the log, or (no log: python -m harness jaeger-build) to ours
        out = stack.enter_context(log.open("ab")) if log is not None else None
        for argv in steps:
            done = subprocess.run(argv, cwd=work, stdout=out, stderr=out, check=False)
            if done.returncode != 0:
                raise RuntimeError(
                    f"building Jaeger failed: {' '.join(argv)} exited {done.returncode}"
                    + (f" (see {log})" if log is not None else "")
                )
    Path(str(binary) + ".part").replace(binary)
    return binary


def render_config(otlp_port: int, query_port: int, health_port: int) -> dict[str, Any]:
    """A Jaeger v2 configuration: OTLP/gRPC in, in-memory storage, the query API, a health
    check, every port on the loopback and no internal metrics server."""
    return {
        "service": {
            "extensions": ["jaeger_storage", "jaeger_query", "healthcheckv2"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch"],
                    "exporters": ["jaeger_storage_exporter"],
                }
            },
            "telemetry": {"metrics": {"level": "none"}, "logs": {"level": "info"}},
        },
        "extensions": {
            "healthcheckv2": {
                "use_v2": True,
                "http": {"endpoint": f"{LOOPBACK}:{health_port}"},
            },
            "jaeger_query": {
                "storage": {"traces": "memory"},
                "http": {"endpoint": f"{LOOPBACK}:{query_port}"},
                "grpc": {"endpoint": f"{LOOPBACK}:{free_port()}"},
            },
            "jaeger_storage": {"backends": {"memory": {"memory": {"max_traces": 100000}}}},
        },
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"{LOOPBACK}:{otlp_port}"}}}},
        "processors": {"batch": {"timeout": "200ms"}},
        "exporters": {"jaeger_storage_exporter": {"trace_storage": "memory"}},
    }


class JaegerApiError(RuntimeError):
    """The query API answered with an error."""


@dataclass(frozen=True)
class JaegerEndpoint:
    otlp_port: int
    query_port: int

    @property
    def otlp(self) -> str:
        """Where spans go (OTLP over gRPC), e.g. ``http://127.0.0.1:4317``."""
        return f"http://{LOOPBACK}:{self.otlp_port}"

    @property
    def ui(self) -> str:
        return f"http://{LOOPBACK}:{self.query_port}"

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            url = f"{self.ui}{path}{query}"  # http on the loopback, built here
            with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as r:  # noqa: S310
                return json.load(r)
        except urllib.error.HTTPError as exc:
            with exc:
                raise JaegerApiError(f"{path} {params}: {exc.code} {exc.read()[:500]!r}") from None

    def services(self) -> list[str]:
        return list(self.get("/api/services").get("data") or [])

    def spans(self, service: str, *, hours: float = 1.0) -> list[dict[str, Any]]:
        """Every span of ``service`` stored in the last ``hours``, as OTLP JSON (the v3 API:
        links keep their attributes), each with ``service`` added."""
        now = datetime.now(UTC)
        try:
            answer = self.get(
                "/api/v3/traces",
                **{
                    "query.service_name": service,
                    "query.start_time_min": (now - timedelta(hours=hours)).isoformat(),
                    "query.start_time_max": (now + timedelta(minutes=5)).isoformat(),
                    "query.num_traces": "100000",
                },
            )
        except JaegerApiError as exc:
            if "404" in str(exc):  # no trace found
                return []
            raise
        return _flatten(answer)

    def trace(self, trace_id: str) -> list[dict[str, Any]]:
        """Every span of one trace (all services), as OTLP JSON."""
        return _flatten(self.get(f"/api/v3/traces/{trace_id}"))


def _flatten(answer: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for resource in (answer.get("result") or {}).get("resourceSpans") or []:
        attrs = {a["key"]: a["value"] for a in resource["resource"].get("attributes", [])}
        service = attrs.get("service.name", {}).get("stringValue", "")
        for scope in resource.get("scopeSpans") or []:
            out += [{**span, "service": service} for span in scope.get("spans") or []]
    return out


def attribute(item: dict[str, Any], key: str) -> Any:
    """The value of attribute ``key`` of an OTLP JSON span or link (None when absent)."""
    for attr in item.get("attributes") or []:
        if attr["key"] == key:
            value = attr["value"]
            for kind in ("stringValue", "boolValue", "doubleValue"):
                if kind in value:
                    return value[kind]
            if "intValue" in value:
                return int(value["intValue"])
            return value
    return None


class JaegerService(ManagedService[JaegerEndpoint]):
    """``with JaegerService(run) as jaeger:`` runs an all-in-one Jaeger on free loopback ports
    (spans kept in memory, gone at stop)."""

    name = "jaeger"

    def __init__(self, run: RunDir) -> None:
        self._run = run
        self._proc: ServiceProcess | None = None

    def start(self) -> JaegerEndpoint:
        binary = build_jaeger(log=self._run.log("jaeger-build"))
        data = self._run.data(self.name)
        otlp, query, health = free_port(), free_port(), free_port()
        config = data / "jaeger.json"
        config.write_text(json.dumps(render_config(otlp, query, health), indent=2) + "\n")
        self._proc = ServiceProcess(
            name=self.name,
            argv=[str(binary), f"--config=file:{config}"],
            log_path=self._run.log(self.name),
            cwd=data,
        )
        self._proc.start()
        endpoint = JaegerEndpoint(otlp, query)
        self._proc.wait_ready(lambda: _ready(endpoint, health), timeout_s=_READY_TIMEOUT_S)
        return endpoint

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None


def _ready(endpoint: JaegerEndpoint, health_port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{health_port}/status", timeout=2) as r:
            if int(r.status) != 200:
                return False
        with socket.create_connection((LOOPBACK, endpoint.otlp_port), timeout=2):
            pass
        endpoint.services()
    except (OSError, JaegerApiError, ValueError):
        return False
    return True


__all__ = [
    "JAEGER_VERSION",
    "JaegerApiError",
    "JaegerEndpoint",
    "JaegerService",
    "attribute",
    "binary_path",
    "build_jaeger",
    "render_config",
]
