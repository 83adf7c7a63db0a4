"""Prometheus from Debian's package: a throwaway server on a free loopback port that scrapes the
given targets and evaluates rowbatch's rules (``deploy/prometheus/rules``), with the few HTTP API
calls the tests and the local stack make (instant queries, alerts, rule health)."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import PrerequisiteMissing
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.service import REPO_ROOT, ManagedService, RunDir
from rowbatch.consumer.service.config import ServerSettings

RULES_DIR = REPO_ROOT / "deploy" / "prometheus" / "rules"
RULES_GLOB = "*.rules.yml"
CONSUMER_JOB = "rowbatch-consumer"
_READY_TIMEOUT_S = 60.0
_HTTP_TIMEOUT_S = 10.0


def default_rule_files() -> list[Path]:
    """rowbatch's rule files (``deploy/prometheus/rules/*.rules.yml``; not the tests beside)."""
    return sorted(RULES_DIR.glob(RULES_GLOB))


def find_binary(name: str = "prometheus") -> Path:
    """``prometheus`` (or ``promtool``) on the PATH, from Debian's ``prometheus`` package."""
    found = shutil.which(name)
    if found is None:
        raise PrerequisiteMissing(
            f"Prometheus ({name})", "apt-get update && apt-get install -y prometheus"
        )
    return Path(found)


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: ``targets`` are ``host:port``; ``file_sd_dir`` (optional) is watched for
    ``*.json`` target files (``[{"targets": ["127.0.0.1:9465"]}]``) added while it runs."""

    name: str
    targets: tuple[str, ...] = ()
    metrics_path: str = "/metrics"
    file_sd_dir: Path | None = None


def _duration(seconds: float) -> str:
    """A Prometheus duration, in whole milliseconds (``1000ms``)."""
    return f"{max(1, math.ceil(seconds * 1000))}ms"


def render_config(
    jobs: Sequence[ScrapeJob],
    rule_files: Sequence[Path],
    scrape_interval_s: float,
    evaluation_interval_s: float,
) -> dict[str, Any]:
    """The server's configuration file (written as JSON, which is YAML)."""
    scrape_configs: list[dict[str, Any]] = []
    for job in jobs:
        entry: dict[str, Any] = {"job_name": job.name, "metrics_path": job.metrics_path}
        if job.targets:
            entry["static_configs"] = [{"targets": list(job.targets)}]
        if job.file_sd_dir is not None:
            entry["file_sd_configs"] = [
                {"files": [str(job.file_sd_dir / "*.json")], "refresh_interval": "5s"}
            ]
        scrape_configs.append(entry)
    return {
        "global": {
            "scrape_interval": _duration(scrape_interval_s),
            "scrape_timeout": _duration(min(scrape_interval_s, 10.0)),
            "evaluation_interval": _duration(evaluation_interval_s),
        },
        "rule_files": [str(path.resolve()) for path in rule_files],
        "scrape_configs": scrape_configs,
    }


class PrometheusApiError(RuntimeError):
    """The HTTP API answered with an error (a bad query, an unknown endpoint)."""


@dataclass(frozen=True)
class PrometheusEndpoint:
    host: str
    port: int

    @property
    def url(self) -> str:
        """The web UI and API, e.g. ``http://127.0.0.1:9090``."""
        return f"http://{self.host}:{self.port}"

    def api(self, path: str, **params: str) -> Any:
        """``GET /api/v1/<path>``: the ``data`` of a successful answer."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(
                f"http://{self.host}:{self.port}/api/v1/{path}{query}", timeout=_HTTP_TIMEOUT_S
            ) as answer:
                body = json.load(answer)
        except urllib.error.HTTPError as exc:
            with exc:
                body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusApiError(f"{path} {params}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query: the result's series (``metric`` labels and ``value``)."""
        data = self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"] if data["resultType"] == "vector" else []
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Every active alert (pending or firing) with its labels and ``state``."""
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def firing(self, alertname: str) -> list[dict[str, Any]]:
        """The firing alerts named ``alertname``."""
        return [
            a
            for a in self.alerts()
            if a["labels"].get("alertname") == alertname and a["state"] == "firing"
        ]

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule, each with its group, ``health`` and ``lastError``."""
        out: list[dict[str, Any]] = []
        for group in self.api("rules")["groups"]:
            out += [{**rule, "group": group["name"]} for rule in group["rules"]]
        return out

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets, each with ``health`` (``up``, ``down``, ``unknown``)."""
        active: list[dict[str, Any]] = self.api("targets", state="active")["activeTargets"]
        return active


class PrometheusService(ManagedService[PrometheusEndpoint]):
    """``with PrometheusService(run, jobs) as endpoint:`` runs a Prometheus that scrapes
    ``jobs`` and evaluates ``rule_files`` (default: rowbatch's rules), every
    ``scrape_interval_s`` / ``evaluation_interval_s`` (short ones suit tests). Its config file
    is kept in the run directory, its time series in a temporary directory removed at stop.
    ``name`` names its data dir and log."""

    name = "prometheus"

    def __init__(
        self,
        run: RunDir,
        jobs: Sequence[ScrapeJob],
        rule_files: Sequence[Path] | None = None,
        *,
        scrape_interval_s: float = 1.0,
        evaluation_interval_s: float = 1.0,
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self._run = run
        self.jobs = list(jobs)
        self.rule_files = list(default_rule_files() if rule_files is None else rule_files)
        self._intervals = (scrape_interval_s, evaluation_interval_s)
        self._proc: ServiceProcess | None = None
        self._tsdb: Path | None = None

    def start(self) -> PrometheusEndpoint:
        binary = find_binary()
        data = self._run.data(self.name)
        config_path = data / "prometheus.yml"
        for job in self.jobs:
            if job.file_sd_dir is not None:
                job.file_sd_dir.mkdir(parents=True, exist_ok=True)
        config = render_config(self.jobs, self.rule_files, *self._intervals)
        config_path.write_text(json.dumps(config, indent=2) + "\n")
        endpoint = PrometheusEndpoint(LOOPBACK, free_port())
        self._tsdb = Path(tempfile.mkdtemp(prefix="rowbatch-prometheus-"))
        self._proc = ServiceProcess(
            name=self.name,
            argv=[
                str(binary),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self._tsdb}",
                "--storage.tsdb.retention.time=1d",
                f"--web.listen-address={LOOPBACK}:{endpoint.port}",
            ],
            log_path=self._run.log(self.name),
            cwd=data,
        )
        self._proc.start()
        self._proc.wait_ready(lambda: _ready(endpoint), timeout_s=_READY_TIMEOUT_S)
        return endpoint

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._tsdb is not None:
            shutil.rmtree(self._tsdb, ignore_errors=True)
            self._tsdb = None


def local_stack_prometheus(run: RunDir, triton_metrics_url: str) -> PrometheusService:
    """The local stack's Prometheus (5 s intervals, rowbatch's rules): job ``rowbatch-consumer``
    scrapes a consumer on the default metrics address (``server.host:server.port``) and every
    consumer listed in ``<run>/prometheus/targets/*.json``; job ``triton`` scrapes Triton."""
    server = ServerSettings()
    consumers = ScrapeJob(
        CONSUMER_JOB,
        (f"{server.host}:{server.port}",),
        file_sd_dir=run.data("prometheus") / "targets",
    )
    triton = urllib.parse.urlsplit(triton_metrics_url)
    jobs = [consumers, ScrapeJob("triton", (triton.netloc,), metrics_path=triton.path)]
    return PrometheusService(run, jobs, scrape_interval_s=5.0, evaluation_interval_s=5.0)


def _ready(endpoint: PrometheusEndpoint) -> bool:
    try:
        with urllib.request.urlopen(
            f"http://{endpoint.host}:{endpoint.port}/-/ready", timeout=2
        ) as answer:
            return int(answer.status) == 200
    except OSError:  # refused, or 503 while it loads (HTTPError is an OSError)
        return False


__all__ = [
    "CONSUMER_JOB",
    "PrometheusApiError",
    "PrometheusEndpoint",
    "PrometheusService",
    "ScrapeJob",
    "default_rule_files",
    "find_binary",
    "local_stack_prometheus",
    "render_config",
]
