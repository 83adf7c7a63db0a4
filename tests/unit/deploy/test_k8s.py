"""deploy/k8s, checked offline: base, every overlay and the backfill Job render with ``kubectl
kustomize``, every rendered object validates against the Kubernetes 1.32 OpenAPI schemas
(kubernetes-validate) or, for KEDA and Prometheus Operator objects, against the CRD schemas in
deploy/k8s/schemas; and the facts that break deployments hold: the config the pods get loads,
probes hit what the consumer serves, the grace period outlasts the drain, autoscaling metrics
exist and stay within the partition count, the targets follow from the measured throughput, and
the backfill's Indexed Job gives each shard its own retries over a table-mode config whose
shard count is the Job's completions."""

from __future__ import annotations

import importlib
import json
import re
import tomllib
import typing
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel, create_model

from rowbatch.consumer.model.endpoints import DnsName, parse_endpoints
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.admin import EXIT_CONFIG, EXIT_DIFFERS
from rowbatch.consumer.service.config import ConsumerConfig, SourceSettings, load_config
from rowbatch.consumer.service.shutdown import CLOSE_MARGIN_S
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from tests.unit.deploy.kustomize import kustomize

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("gke-pubsub", "kafka-keda", "kafka-share-keda", "triton")
CONSUMER_OVERLAYS = ("gke-pubsub", "kafka-keda", "kafka-share-keda")
STANDALONE = ("base", "backfill")  # kustomizations of their own, not under overlays/
K8S_VERSION = "1.32.0"
CONFIG_PATH = "/etc/rowbatch/consumer.toml"

# The backfill (deploy/k8s/backfill): offline table mode, `rowbatch-consumer table`, as an
# Indexed Job. Its exit codes: 0 the shard is done, 1 failed, 2 bad configuration or a failed
# start-up check, 3 stopped by SIGTERM before the end (a rerun resumes from [source] state), 4
# a part of the input could not be read (a corrupt file: a rerun cannot help until it is mended).
BACKFILL = "backfill"
TABLE_CONFIG_PATH = "/etc/rowbatch/table.toml"
TABLE_EXIT_FAILED = 1
TABLE_EXIT_CONFIG = 2
TABLE_EXIT_STOPPED = 3
TABLE_EXIT_UNREADABLE = 4
JOB_INDEX_VARIABLE = "JOB_COMPLETION_INDEX"  # set by Kubernetes in each pod of an Indexed Job
OBJECT_STORES = ("gs://", "s3://", "abfs://", "az://")

# The autoscaling targets' inputs (docs/deploy.md "Autoscaling targets"): one replica's
# measured end-to-end rows/s into PostgreSQL (docs/benchmarks.md, section 2), the share of it a
# target may count on, the drain time each target aims at (docs/autoscaling.md: the latency
# objective / 4 for KEDA's lag; twice the objective for the Pub/Sub backlog, only a backstop
# next to rowbatch's load), and the rows per message the producers send; rowbatch's own
# target_latency_s with the rate term, per broker.
MEASURED_ROWS_PER_S = {"pubsub": 19_368, "kafka": 24_409}
HEADROOM = 0.5
LATENCY_OBJECTIVE_S = 30
TARGET_DRAIN_S = {"pubsub": 2 * LATENCY_OBJECTIVE_S, "kafka": LATENCY_OBJECTIVE_S / 4}
ROWS_PER_MESSAGE = 500
TARGET_LATENCY_S = {"pubsub": 10, "kafka": 20}


@cache
def _render(where: str) -> tuple[dict[str, Any], ...]:
    directory = K8S / (where if where in STANDALONE else f"overlays/{where}")
    return kustomize(directory)


def _one(where: str, kind: str, name: str | None = None) -> dict[str, Any]:
    found = [
        d
        for d in _render(where)
        if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]
    assert len(found) == 1, f"{where}: {len(found)} {kind} {name or ''}"
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def _secret_placeholder(key: str) -> str:
    return "postgresql://rowbatch:secret@postgres:5432/rowbatch" if "dsn" in key else "secret"


def _mounted_config(where: str, kind: str) -> tuple[str, str]:
    """The ``--config`` path ``kind``'s container is given, and that file's text as the
    ConfigMap mounted over it holds it."""
    workload = _one(where, kind)
    container = _container(workload)
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
    args = container["args"]
    path = args[args.index("--config") + 1]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    config_map = volumes[mount["name"]]["configMap"]["name"]
    data = _one(where, "ConfigMap", config_map)["data"]
    text: str = data[path[len(mount["mountPath"]) + 1 :]]
    return path, text


def _pod_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's env as the process sees it, Secret values replaced by placeholders."""
    return {
        var["name"]: (
            var["value"]
            if "value" in var
            else _secret_placeholder(var["valueFrom"]["secretKeyRef"]["key"])
        )
        for var in container.get("env", [])
    }


def _pod_config(where: str, kind: str, tmp_path: Path) -> ConsumerConfig:
    """The configuration ``kind``'s pod loads: the ConfigMap's TOML as mounted, plus its
    ``ROWBATCH_*`` env (Secret values replaced by placeholders), through the real loader."""
    _, text = _mounted_config(where, kind)
    file = tmp_path / f"{where}-{kind}.toml"
    file.write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        for name, value in _pod_env(_container(_one(where, kind))).items():
            mp.setenv(name, value)
        return load_config(file)


def _check_hardened(workload: dict[str, Any]) -> None:
    """Runs as the image's non-root user, read-only root filesystem, /tmp writable."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    uid = int(re.search(r"^USER (\d+)$", dockerfile, re.MULTILINE).group(1))  # type: ignore[union-attr]
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == uid
    security = _container(workload)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert "/tmp" in [m["mountPath"] for m in _container(workload)["volumeMounts"]]


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith(("Mi", "Gi")), quantity
    return int(quantity[:-2]) * (1024 if quantity.endswith("Gi") else 1)


@cache
def _crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    group, version = api_version.split("/")
    schema: dict[str, Any] = json.loads(
        (K8S / "schemas" / f"{group}_{kind.lower()}_{version}.json").read_text()
    )
    return schema


def _validate(doc: dict[str, Any]) -> None:
    """``doc`` against its CRD's schema (deploy/k8s/schemas), or Kubernetes' own."""
    if doc["apiVersion"].split("/")[0] in (
        "keda.sh",
        "monitoring.coreos.com",
        "monitoring.googleapis.com",
    ):
        schema = _crd_schema(doc["apiVersion"], doc["kind"])
        jsonschema.Draft202012Validator.check_schema(schema)
        errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
        assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    else:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("where", ["base", *OVERLAYS, BACKFILL])
def test_renders_and_validates_offline(where: str) -> None:
    kinds = []
    for doc in _render(where):
        kinds.append(doc["kind"])
        _validate(doc)
    assert kinds


def test_the_crd_schemas_reject_what_the_api_server_would() -> None:
    """The vendored schemas are strict: an unknown field or a missing required one fails."""
    so = _one("kafka-keda", "ScaledObject")
    schema = _crd_schema(so["apiVersion"], so["kind"])
    validator = jsonschema.Draft202012Validator(schema)
    typo = json.loads(json.dumps(so))
    typo["spec"]["maxReplicas"] = typo["spec"].pop("maxReplicaCount")
    assert not validator.is_valid(typo)
    missing = json.loads(json.dumps(so))
    del missing["spec"]["triggers"]
    assert not validator.is_valid(missing)
    pm = _one("gke-pubsub", "PodMonitoring")
    gmp = jsonschema.Draft202012Validator(_crd_schema(pm["apiVersion"], pm["kind"]))
    assert gmp.is_valid(pm)
    operator_style = json.loads(json.dumps(pm))
    operator_style["spec"]["podMetricsEndpoints"] = operator_style["spec"].pop("endpoints")
    assert not gmp.is_valid(operator_style)


@pytest.mark.parametrize("where", CONSUMER_OVERLAYS)
def test_the_pods_configuration_loads(where: str, tmp_path: Path) -> None:
    consumer = _pod_config(where, "Deployment", tmp_path)
    admin = _pod_config(where, "Job", tmp_path)
    assert consumer.model_dump() == admin.model_dump(), "admin ensure reads what consumers read"
    assert consumer.server.host == "0.0.0.0"
    assert consumer.sink.kind == "postgres"


@pytest.mark.parametrize("where", CONSUMER_OVERLAYS)
def test_probes_hit_what_the_consumer_serves(where: str, tmp_path: Path) -> None:
    config = _pod_config(where, "Deployment", tmp_path)
    container = _container(_one(where, "Deployment"))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    served = (ROOT / "rowbatch" / "consumer" / "service" / "health.py").read_text()
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        assert f'path == "{path}"' in served
        assert ports[get["port"]] == config.server.port
    startup = container["startupProbe"]
    allowed_s = startup["periodSeconds"] * startup["failureThreshold"]
    # The health server starts before the start-up waits (service/runner.py; the integration
    # test of a consumer waiting for its model server reads /healthz meanwhile), so the
    # startup probe covers only the interpreter's start and imports.
    assert 30 <= allowed_s <= 120


@pytest.mark.parametrize("where", CONSUMER_OVERLAYS)
def test_the_grace_period_outlasts_the_drain(where: str, tmp_path: Path) -> None:
    config = _pod_config(where, "Deployment", tmp_path)
    deployment = _one(where, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    pre_stop = _container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    # What the consumer may take after SIGTERM before its own watchdog ends it: the drain
    # (shutdown_grace_s), then the bounded close steps and teardown (CLOSE_MARGIN_S).
    worst = float(pre_stop[1]) + config.shutdown_grace_s + CLOSE_MARGIN_S
    assert pod["terminationGracePeriodSeconds"] > worst


@pytest.mark.parametrize("where", CONSUMER_OVERLAYS)
def test_pods_run_hardened_with_a_memory_limit_above_the_budget(where: str, tmp_path: Path) -> None:
    config = _pod_config(where, "Deployment", tmp_path)
    for kind in ("Deployment", "Job"):
        _check_hardened(_one(where, kind))
    limits = _container(_one(where, "Deployment"))["resources"]["limits"]
    assert limits["memory"].endswith("Mi")
    assert int(limits["memory"][:-2]) * 2**20 >= config.budget_bytes + 256 * 2**20


@pytest.mark.parametrize("where", ["base", *CONSUMER_OVERLAYS, "vllm", BACKFILL])
def test_rowbatch_is_deployed_by_digest_not_by_tag(where: str) -> None:
    """Every rowbatch container names the image by digest (a placeholder of zeros as shipped):
    a tag such as ``latest`` can move under a running Deployment."""
    images = [
        container["image"]
        for doc in _render(where)
        if doc["kind"] in ("Deployment", "Job")
        for container in doc["spec"]["template"]["spec"]["containers"]
        if container["image"].split("@")[0].split(":")[0].endswith("rowbatch")
    ]
    assert images, f"{where}: no rowbatch container"
    for image in images:
        assert re.search(r"@sha256:[0-9a-f]{64}$", image), f"{where}: {image} is not by digest"


@pytest.mark.parametrize("where", CONSUMER_OVERLAYS)
def test_the_job_runs_admin_ensure_and_the_deployment_the_images_command(where: str) -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd is not None
    assert _container(_one(where, "Deployment"))["args"] == json.loads(cmd.group(1))
    job = _one(where, "Job")
    assert _container(job)["args"] == ["admin", "ensure", "--config", CONFIG_PATH]
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    # A bad configuration or a difference cannot be fixed by retrying: it fails the Job at once.
    (rule,) = job["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    assert rule["onExitCodes"] == {
        "containerName": _container(job)["name"],
        "operator": "In",
        "values": [EXIT_CONFIG, EXIT_DIFFERS],
    }


@pytest.mark.parametrize("where", CONSUMER_OVERLAYS)
def test_monitoring_and_disruption_budget_select_the_consumer_pods(
    where: str, tmp_path: Path
) -> None:
    config = _pod_config(where, "Deployment", tmp_path)
    deployment = _one(where, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for p in _container(deployment)["ports"]}
    # GKE collects with its managed Prometheus (PodMonitoring), elsewhere the Operator's
    # PodMonitor: exactly one of them, selecting the consumer pods.
    monitor = "PodMonitoring" if where == "gke-pubsub" else "PodMonitor"
    kinds = {doc["kind"] for doc in _render(where)}
    assert {"PodMonitor", "PodMonitoring"} & kinds == {monitor}
    for kind in (monitor, "PodDisruptionBudget"):
        selector = _one(where, kind)["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        job_labels = _one(where, "Job")["spec"]["template"]["metadata"]["labels"]
        assert not selector.items() <= job_labels.items(), "the Job's pod is not a consumer"
    spec = _one(where, monitor)["spec"]
    (endpoint,) = spec["endpoints" if monitor == "PodMonitoring" else "podMetricsEndpoints"]
    assert ports[endpoint["port"]] == config.server.port
    assert endpoint["path"] == "/metrics"
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.server.port)


def _exported_metrics() -> set[str]:
    return {family.name for family in Metrics().registry.collect()}


def _target(broker: str) -> int:
    """Messages (or records) per replica: what one replica clears in the target drain time,
    to the nearest ten."""
    per_replica = MEASURED_ROWS_PER_S[broker] * HEADROOM * TARGET_DRAIN_S[broker] / ROWS_PER_MESSAGE
    return int(round(per_replica, -1))


def test_the_targets_are_the_recommended_ones() -> None:
    assert (_target("kafka"), _target("pubsub")) == (180, 1160)


def test_the_targets_come_from_the_measured_figures() -> None:
    """The per-replica rates behind the targets (an end-to-end run of 2026-12-01) are the ones
    the recorded simulation states as its inputs, and docs/deploy.md derives the same."""
    simulated = (ROOT / "bench" / "results" / "autoscale-sim-2026-12-02.txt").read_text()
    deploy = (ROOT / "docs" / "deploy.md").read_text()
    for broker, rows in MEASURED_ROWS_PER_S.items():
        name = {"pubsub": "Pub/Sub", "kafka": "Kafka"}[broker]
        assert re.search(rf"\b{rows:,} (rows/s )?\({name}", simulated), (
            f"{rows:,} rows/s is not the recorded simulation's {name} rate"
        )
        assert f"{rows:,}" in deploy
        assert f"**{_target(broker)}**" in deploy
        assert f"{TARGET_DRAIN_S[broker]:g} s" in deploy


def test_the_consumers_signal_settings_are_the_recommended_ones(tmp_path: Path) -> None:
    for where, broker in (("gke-pubsub", "pubsub"), ("kafka-keda", "kafka")):
        source = _pod_config(where, "Deployment", tmp_path).source
        assert isinstance(source, PubSubSettings | KafkaSettings)
        assert source.target_latency_s == TARGET_LATENCY_S[broker]
        assert source.rows_per_s_per_replica == MEASURED_ROWS_PER_S[broker]
    # the consumer's defaults are the same targets
    assert PubSubSettings.model_fields["target_latency_s"].default == TARGET_LATENCY_S["pubsub"]
    assert KafkaSettings.model_fields["target_latency_s"].default == TARGET_LATENCY_S["kafka"]


def test_gke_hpa_scales_on_the_replica_load_with_the_backlog_as_backstop(tmp_path: Path) -> None:
    config = _pod_config("gke-pubsub", "Deployment", tmp_path)
    source = config.source
    assert isinstance(source, PubSubSettings)
    hpa = _one("gke-pubsub", "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "rowbatch-consumer")
    assert "replicas" not in _one("gke-pubsub", "Deployment")["spec"], "the HPA owns it"
    external, pods = hpa["spec"]["metrics"]
    metric = external["external"]["metric"]
    assert metric["name"] == "pubsub.googleapis.com|subscription|num_undelivered_messages"
    subscription_id = source.subscription.rsplit("/", 1)[1]
    assert metric["selector"]["matchLabels"] == {"resource.labels.subscription_id": subscription_id}
    assert int(external["external"]["target"]["averageValue"]) == _target("pubsub")
    # Each replica's share of the need, summed by the Pods metric's average: a target of 1
    # per pod makes the HPA ask for ceil(sum of the shares).
    prefix, name, kind = pods["pods"]["metric"]["name"].split("|")
    assert (prefix, kind) == ("prometheus.googleapis.com", "gauge")
    assert name in _exported_metrics(), f"{name} is not a metric the consumer exports"
    assert name == "rowbatch_replica_load"
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # The HPA's default scale-up (max(4 pods, 100 %) per 15 s), the simulator's recommendation.
    up = hpa["spec"]["behavior"]["scaleUp"]
    assert up["stabilizationWindowSeconds"] == 0
    assert up.get("selectPolicy", "Max") == "Max"
    policies = {(p["type"], p["value"], p["periodSeconds"]) for p in up["policies"]}
    assert policies == {("Pods", 4, 15), ("Percent", 100, 15)}


def test_gke_uses_workload_identity_in_the_configs_project(tmp_path: Path) -> None:
    config = _pod_config("gke-pubsub", "Deployment", tmp_path)
    assert isinstance(config.source, PubSubSettings)
    project = config.source.subscription.split("/")[1]
    for name in ("rowbatch-consumer", "rowbatch-admin"):
        account = _one("gke-pubsub", "ServiceAccount", name)
        gsa = account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
        assert gsa == f"{name}@{project}.iam.gserviceaccount.com"
    pods = {
        kind: _one("gke-pubsub", kind)["spec"]["template"]["spec"]["serviceAccountName"]
        for kind in ("Deployment", "Job")
    }
    assert pods == {"Deployment": "rowbatch-consumer", "Job": "rowbatch-admin"}


def test_keda_scales_on_the_groups_lag_capped_at_the_partitions(tmp_path: Path) -> None:
    config = _pod_config("kafka-keda", "Deployment", tmp_path)
    source = config.source
    assert isinstance(source, KafkaSettings)
    scaled = _one("kafka-keda", "ScaledObject")["spec"]
    assert scaled["scaleTargetRef"]["name"] == "rowbatch-consumer"
    assert "replicas" not in _one("kafka-keda", "Deployment")["spec"], "KEDA owns it"
    assert scaled["maxReplicaCount"] <= source.partitions
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["bootstrapServers"] == source.bootstrap_servers
    assert meta["consumerGroup"] == source.group_id, "the group whose commits are the lag"
    assert meta["topic"] == source.topic
    assert meta["offsetResetPolicy"] == source.auto_offset_reset
    # "true": KEDA reports the whole lag, not min(lag, partitions x lagThreshold), so the
    # count can reach the partitions (maxReplicaCount still caps it there).
    assert meta["allowIdleConsumers"] == "true"
    assert scaled["maxReplicaCount"] == source.partitions
    assert int(meta["lagThreshold"]) == _target("kafka")
    keda_sasl = {
        "PLAIN": "plaintext",
        "SCRAM-SHA-256": "scram_sha256",
        "SCRAM-SHA-512": "scram_sha512",
    }
    assert meta["sasl"] == keda_sasl[source.sasl_mechanism or ""]
    assert (meta["tls"] == "enable") == (source.security_protocol in ("SSL", "SASL_SSL"))
    auth = _one("kafka-keda", "TriggerAuthentication", trigger["authenticationRef"]["name"])
    keys = {r["parameter"]: r["key"] for r in auth["spec"]["secretTargetRef"]}
    env = {
        v["name"]: v["valueFrom"]["secretKeyRef"]["key"]
        for v in _container(_one("kafka-keda", "Deployment"))["env"]
        if "valueFrom" in v
    }
    assert keys["username"] == env["ROWBATCH_SOURCE__SASL_PLAIN_USERNAME"]
    assert keys["password"] == env["ROWBATCH_SOURCE__SASL_PLAIN_PASSWORD"]


def test_triton_serves_the_model_url_on_cpu_from_an_object_store_repository(
    tmp_path: Path,
) -> None:
    service = _one("triton", "Service")
    assert service["spec"]["clusterIP"] == "None", "headless: clients see every pod"
    deployment = _one("triton", "Deployment")
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    container = _container(deployment)
    pod = deployment["spec"]["template"]["spec"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    loaded = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--load-model=")]
    for where in CONSUMER_OVERLAYS:
        model = _pod_config(where, "Deployment", tmp_path).model
        (target,) = parse_endpoints(model.url).targets
        # dns:///: every pod behind the headless Service, not one long connection to one pod
        assert isinstance(target, DnsName)
        assert target.name == service["metadata"]["name"]
        (grpc,) = [p for p in service["spec"]["ports"] if p["port"] == target.port]
        assert ports[grpc["targetPort"]] == target.port
        assert model.name in loaded, f"{where}'s model is not one Triton loads"
    # CPU only by default (the gpu component adds the GPU): CPU and memory requested and
    # limited, no GPU asked for or tolerated, and the models it loads run on CPU.
    resources = container["resources"]
    for kind in ("requests", "limits"):
        assert set(resources[kind]) == {"cpu", "memory"}, kind
    cpu = {k: str(resources[k]["cpu"]) for k in ("requests", "limits")}
    cores = {k: float(q[:-1]) / 1000 if q.endswith("m") else float(q) for k, q in cpu.items()}
    assert 0 < cores["requests"] <= cores["limits"]
    memory = {k: _mebibytes(resources[k]["memory"]) for k in ("requests", "limits")}
    assert 0 < memory["requests"] <= memory["limits"]
    assert not [t for t in pod.get("tolerations", []) if "nvidia.com" in t.get("key", "")]
    for name in loaded:
        model_config = (ROOT / "deploy" / "models" / name / "config.pbtxt").read_text()
        assert "KIND_GPU" not in model_config, f"{name} asks for a GPU"
    # The repository is read from object storage by Triton itself: nothing mounted, no volume
    # to fill; the pod's identity is the one given the bucket (Workload Identity on GKE).
    (repository,) = [a for a in container["args"] if a.startswith("--model-repository=")]
    assert repository.split("=", 1)[1].startswith(("gs://", "s3://"))
    assert not [v for v in pod.get("volumes", []) if "persistentVolumeClaim" in v]
    assert "PersistentVolumeClaim" not in {d["kind"] for d in _render("triton")}
    account = _one("triton", "ServiceAccount", pod["serviceAccountName"])
    if repository.split("=", 1)[1].startswith("gs://"):
        gsa = account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"]
        assert gsa.endswith(".iam.gserviceaccount.com")
    probe = container["readinessProbe"]["httpGet"]
    assert (probe["path"], ports[probe["port"]]) == ("/v2/health/ready", 8000)


def _table_settings() -> type[BaseModel] | None:
    """Offline table mode's ``[source]`` settings class, or None while it does not import
    (the mode is being written beside these manifests)."""
    try:
        module = importlib.import_module("rowbatch.consumer.sources.table.settings")
    except ImportError:
        return None
    settings: type[BaseModel] | None = getattr(module, "TableSettings", None)
    return settings


def _loader_source_kinds() -> set[str]:
    """The ``[source]`` kinds the real config loader accepts."""
    (union, _) = typing.get_args(SourceSettings)
    return {cls.model_fields["kind"].default for cls in typing.get_args(union)}


def _backfill_toml() -> dict[str, Any]:
    path, text = _mounted_config(BACKFILL, "Job")
    assert path == TABLE_CONFIG_PATH
    return tomllib.loads(text)


def test_the_backfill_is_an_indexed_job_retried_per_shard() -> None:
    spec = _one(BACKFILL, "Job")["spec"]
    assert spec["completionMode"] == "Indexed"
    assert 1 <= spec["parallelism"] <= spec["completions"]
    # What the API server requires beyond the schema: backoffLimitPerIndex only in an Indexed
    # Job, maxFailedIndexes only with it and at most the completions; a podFailurePolicy only
    # with restartPolicy Never, and with it podReplacementPolicy Failed (so a shard's next pod
    # starts once the last one has ended: never two pods on one shard's state).
    assert spec["backoffLimitPerIndex"] >= 1
    assert "backoffLimit" not in spec, "the per-index limit alone counts retries"
    assert 0 <= spec["maxFailedIndexes"] < spec["completions"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["ttlSecondsAfterFinished"] > 0


def test_the_backfill_fails_a_bad_config_at_once_and_resumes_a_stopped_shard() -> None:
    job = _one(BACKFILL, "Job")
    rules = job["spec"]["podFailurePolicy"]["rules"]
    first_match: dict[int, str] = {}
    for rule in rules:
        codes = rule.get("onExitCodes")
        if codes is None:
            continue
        assert codes["containerName"] == _container(job)["name"]
        assert codes["operator"] == "In"
        for code in codes["values"]:
            first_match.setdefault(code, rule["action"])
    assert 0 not in first_match, "the API server refuses 0 with operator In"
    # exit 2: retrying cannot fix a bad configuration; the index fails, the others go on
    assert first_match[TABLE_EXIT_CONFIG] == "FailIndex"
    # exit 3 (SIGTERM) and evictions/preemptions use no retry: the next pod resumes
    assert first_match[TABLE_EXIT_STOPPED] == "Ignore"
    # exit 4 (a corrupt file): a retry reads the same bytes; the index fails (no endless pods)
    assert first_match[TABLE_EXIT_UNREADABLE] == "FailIndex"
    assert TABLE_EXIT_FAILED not in first_match, "a failure counts against backoffLimitPerIndex"
    disruption = [r for r in rules if "onPodConditions" in r]
    assert disruption == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    ]


def test_the_backfill_runs_table_mode_with_the_jobs_shard_count() -> None:
    job = _one(BACKFILL, "Job")
    container = _container(job)
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    entrypoint = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.MULTILINE)
    assert entrypoint is not None
    assert json.loads(entrypoint.group(1)) == ["rowbatch-consumer"]
    assert container["args"] == ["table", "--config", TABLE_CONFIG_PATH]
    config = _backfill_toml()
    source = config["source"]
    assert source["kind"] == "table"
    # N from the env (the Job's completions), K from $JOB_COMPLETION_INDEX: neither in the file
    env = _pod_env(container)
    assert int(env["ROWBATCH_SOURCE__SHARDS"]) == job["spec"]["completions"]
    assert "shards" not in source
    assert "shard" not in source
    assert not source.get("new_run", False), "a retried shard must resume, not start over"
    assert source["state"].startswith(OBJECT_STORES), "progress must outlive the pods"
    assert "dsn" not in config["sink"], "the DSN comes from the Secret"
    assert env["ROWBATCH_SINK__DSN"] == _secret_placeholder("sink-dsn")
    base_env = {v["name"]: v for v in _container(_one("base", "Deployment"))["env"]}
    (dsn,) = [v for v in container["env"] if v["name"] == "ROWBATCH_SINK__DSN"]
    assert dsn == base_env["ROWBATCH_SINK__DSN"], "the same Secret and key as the consumers"
    assert config["server"]["host"] == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert ports["metrics"] == config["server"]["port"] == int(annotations["prometheus.io/port"])


def test_the_backfill_source_validates_and_each_index_is_a_shard(tmp_path: Path) -> None:
    table = _table_settings()
    if table is None:
        pytest.skip("rowbatch.consumer.sources.table.settings.TableSettings does not import yet")
    job = _one(BACKFILL, "Job")
    completions = job["spec"]["completions"]
    env = _pod_env(_container(job))
    config = _backfill_toml()
    settings: Any = table.model_validate(
        {**config["source"], "shards": env["ROWBATCH_SOURCE__SHARDS"]}
    )
    assert settings.kind == "table"
    assert settings.shards == completions
    assert settings.new_run is False
    with pytest.MonkeyPatch.context() as mp:
        for index in range(completions):
            mp.setenv(JOB_INDEX_VARIABLE, str(index))
            assert settings.shard_index() == index
        mp.setenv(JOB_INDEX_VARIABLE, str(completions))
        with pytest.raises(ValueError):
            settings.shard_index()
    # The whole file plus the pod's env, as the consumer's configuration with this source (the
    # real loader's [source] may not accept "table" yet): model, binding, sink, server and the
    # top-level settings validate, the DSN and the shard count from the env.
    whole = create_model("TableConsumerConfig", __base__=ConsumerConfig, source=(table, ...))
    with pytest.MonkeyPatch.context() as mp:
        for name, value in env.items():
            mp.setenv(name, value)
        loaded: Any = whole(**config)
    assert loaded.source.shards == completions
    assert loaded.sink.kind == "postgres"
    assert loaded.sink.dsn.get_secret_value() == _secret_placeholder("sink-dsn")
    if "table" in _loader_source_kinds():
        real = _pod_config(BACKFILL, "Job", tmp_path)
        assert real.model_dump() == loaded.model_dump()


def test_the_backfill_pods_run_hardened_and_drain_within_the_grace_period() -> None:
    job = _one(BACKFILL, "Job")
    _check_hardened(job)
    config = _backfill_toml()
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] > config["shutdown_grace_s"] + CLOSE_MARGIN_S
    limits = _container(job)["resources"]["limits"]
    assert _mebibytes(limits["memory"]) * 2**20 >= config["budget_bytes"] + 256 * 2**20
    # Its own identity, ConfigMap and labels: applied beside base it changes nothing of the
    # consumers', and their PodDisruptionBudget and PodMonitor do not select its pods.
    assert _one(BACKFILL, "ServiceAccount", pod["serviceAccountName"])
    ours = {d["metadata"]["name"] for d in _render(BACKFILL)}
    theirs = {d["metadata"]["name"] for d in _render("base")}
    assert not ours & theirs
    labels = job["spec"]["template"]["metadata"]["labels"]
    for kind in ("PodDisruptionBudget", "PodMonitor"):
        selector = _one("base", kind)["spec"]["selector"]["matchLabels"]
        assert not selector.items() <= labels.items()


def test_the_triton_gpu_component_adds_a_gpu_limit_and_toleration(tmp_path: Path) -> None:
    """deploy/k8s/overlays/triton/gpu, used as its comments say (the overlay under resources,
    the component under components), renders and validates, and changes only the Deployment:
    one nvidia.com/gpu limit and the GPU taint tolerated, CPU and memory as they were."""
    overlay = K8S / "overlays" / "triton"
    component = overlay / "gpu"
    assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component"
    # kustomize takes only relative paths to other kustomizations: up from tmp_path to /
    root = "/".join([".."] * (len(tmp_path.parts) - 1))
    (tmp_path / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [f"{root}{overlay}"],
                "components": [f"{root}{component}"],
            }
        )
    )
    docs = list(kustomize(tmp_path))
    for doc in docs:
        _validate(doc)
    (gpu,) = [d for d in docs if d["kind"] == "Deployment"]
    cpu = _one("triton", "Deployment")
    resources = _container(gpu)["resources"]
    gpus = resources["limits"]["nvidia.com/gpu"]
    assert gpus >= 1
    # an extended resource's request defaults to its limit, and may not differ from it
    assert resources["requests"].get("nvidia.com/gpu", gpus) == gpus
    tolerations = gpu["spec"]["template"]["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    for kind in ("requests", "limits"):
        without_gpu = {k: v for k, v in resources[kind].items() if k != "nvidia.com/gpu"}
        assert without_gpu == _container(cpu)["resources"][kind]
    assert [d for d in docs if d["kind"] != "Deployment"] == [
        d for d in _render("triton") if d["kind"] != "Deployment"
    ]
