"""deploy/k8s/overlays/vllm, checked offline: the consumers of kafka-keda against a vLLM fleet.
The overlay renders with ``kubectl kustomize`` and every object validates (built-in kinds
against the Kubernetes 1.32 OpenAPI schemas, KEDA and Prometheus Operator objects against
deploy/k8s/schemas, as in tests/unit/deploy/test_k8s.py); the consumers' configuration loads as
a ``[model]`` of kind ``openai`` whose URL is the vLLM Service's port and whose model is the
one vLLM serves; the vLLM HPA scales on ``vllm:num_requests_waiting`` as prometheus-adapter
exports it; and the sizing rule of docs/generative-deploy.md holds between the consumers'
maxReplicaCount and window and the vLLM HPA's maxReplicas and ``--max-num-seqs``."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from rowbatch.consumer.model.openai.server_queue import QUEUE_METRICS
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.service.config import ConsumerConfig, load_config
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from tests.unit.deploy.kustomize import kustomize, one, only_container, pod_spec

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAY = K8S / "overlays" / "vllm"
ADAPTER_VALUES = OVERLAY / "prometheus-adapter-values.yaml"
K8S_VERSION = "1.32.0"
CRD_GROUPS = ("keda.sh", "monitoring.coreos.com", "monitoring.googleapis.com")
VLLM = "vllm"  # the Deployment, Service, PodMonitor and HPA of the overlay
CONSUMER = "rowbatch-consumer"
# vLLM's queue gauges, as the consumer itself reads them (server_queue.py), and the names the
# HPA asks the custom metrics API for (prometheus-adapter renames them without the colon).
VLLM_WAITING, VLLM_RUNNING = QUEUE_METRICS[0]
HPA_WAITING, HPA_RUNNING = (name.replace(":", "_") for name in QUEUE_METRICS[0])
# docs/generative-deploy.md: consumers x window per consumer <= servers x max_num_seqs x 1.1.
SLACK = 1.1
IMAGE = re.compile(r"vllm/vllm-openai:v\d+\.\d+\.\d+(\.\w+)?")


@cache
def _render() -> tuple[dict[str, Any], ...]:
    return kustomize(OVERLAY)


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    return one(_render(), kind, name)


def _consumers(kind: str) -> dict[str, Any]:
    """The consumers' Deployment, or admin ensure's Job (one of each in the overlay)."""
    found = [d for d in _render() if d["kind"] == kind and d["metadata"]["name"] != VLLM]
    assert len(found) == 1, f"{len(found)} {kind}"
    return found[0]


def _secret_placeholder(key: str) -> str:
    return "postgresql://rowbatch:secret@postgres:5432/rowbatch" if "dsn" in key else "secret"


def _pod_config(kind: str, tmp_path: Path) -> ConsumerConfig:
    """The configuration ``kind``'s pod loads: the ConfigMap's TOML mounted at its ``--config``
    path plus its ``ROWBATCH_*`` env (Secret values replaced by placeholders), through the real
    loader."""
    workload = _consumers(kind)
    container = only_container(workload)
    args = container["args"]
    path = args[args.index("--config") + 1]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    data = _one("ConfigMap", volume["configMap"]["name"])["data"]
    file = tmp_path / f"{kind}.toml"
    file.write_text(data[path[len(mount["mountPath"]) + 1 :]])
    with pytest.MonkeyPatch.context() as mp:
        for var in container.get("env", []):
            if "valueFrom" in var:
                value = _secret_placeholder(var["valueFrom"]["secretKeyRef"]["key"])
            else:
                value = var["value"]
            mp.setenv(var["name"], value)
        return load_config(file)


def _model(tmp_path: Path) -> OpenAISettings:
    config = _pod_config("Deployment", tmp_path)
    assert isinstance(config.model, OpenAISettings)
    return config.model


def _vllm_args() -> list[str]:
    args: list[str] = only_container(_one("Deployment", VLLM))["args"]
    return args


def _flag(name: str) -> str:
    """The value of vLLM's ``--name value`` or ``--name=value`` argument (exactly once)."""
    args = _vllm_args()
    found = [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    found += [a.split("=", 1)[1] for a in args if a.startswith(name + "=")]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def _max_num_seqs() -> int:
    return int(_flag("--max-num-seqs"))


def _container_port(workload: dict[str, Any], port: int | str) -> int:
    """A named or numbered port of the workload's container, as a number."""
    if isinstance(port, int):
        return port
    ports = {p["name"]: p["containerPort"] for p in only_container(workload)["ports"]}
    number: int = ports[port]
    return number


def _hpa_metric(name: str) -> dict[str, Any]:
    metrics = _one("HorizontalPodAutoscaler", VLLM)["spec"]["metrics"]
    found = [m for m in metrics if m["type"] == "Pods" and m["pods"]["metric"]["name"] == name]
    assert len(found) == 1, f"the vLLM HPA has {len(found)} Pods metrics {name}"
    target: dict[str, Any] = found[0]["pods"]["target"]
    return target


def _adapter_rules() -> list[dict[str, Any]]:
    values = yaml.safe_load(ADAPTER_VALUES.read_text())
    rules: list[dict[str, Any]] = values["rules"]["custom"]
    return rules


def test_renders_and_validates_against_the_schemas() -> None:
    kinds = set()
    for doc in _render():
        kinds.add(doc["kind"])
        if doc["apiVersion"].split("/")[0] in CRD_GROUPS:
            group, version = doc["apiVersion"].split("/")
            path = K8S / "schemas" / f"{group}_{doc['kind'].lower()}_{version}.json"
            schema = json.loads(path.read_text())
            jsonschema.Draft202012Validator.check_schema(schema)
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(doc))
            assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    for kind in ("Deployment", "Service", "PodMonitor", "HorizontalPodAutoscaler"):
        assert _one(kind, VLLM)
    assert {"ScaledObject", "TriggerAuthentication", "Job"} <= kinds, "kafka-keda's consumers"
    # HPA and KEDA own the replica counts: a replicas field would reset them on every apply.
    assert "replicas" not in _one("Deployment", VLLM)["spec"]
    assert "replicas" not in _consumers("Deployment")["spec"]


def test_the_consumers_config_is_openai_at_the_vllm_service(tmp_path: Path) -> None:
    consumer = _pod_config("Deployment", tmp_path)
    admin = _pod_config("Job", tmp_path)
    assert isinstance(consumer, ConsumerConfig)
    assert consumer.model_dump() == admin.model_dump(), "admin ensure reads what consumers read"
    model = consumer.model
    assert isinstance(model, OpenAISettings)
    assert model.kind == "openai"
    assert model.name == _flag("--served-model-name"), "the model vLLM serves under that name"
    # One URL, the Service: the pods come and go with the HPA, and every URL listed must answer
    # at start-up (an OpenAI URL is not re-resolved: no dns:/// for HTTP).
    (url,) = model.url
    parts = urlsplit(url)
    assert parts.scheme == "http"
    assert parts.hostname is not None
    service = _one("Service", VLLM)
    host, _, domain = parts.hostname.partition(".")
    assert host == service["metadata"]["name"]
    assert domain in ("", "svc", "svc.cluster.local") or domain.endswith(
        (".svc", ".svc.cluster.local")
    ), parts.hostname
    (port,) = [p for p in service["spec"]["ports"] if p["port"] == parts.port]
    deployment = _one("Deployment", VLLM)
    assert _container_port(deployment, port["targetPort"]) == int(_flag("--port"))
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )
    # A ClusterIP: kube-proxy spreads each new connection over the ready pods. A headless name
    # would give each connection whichever address the resolver returns first.
    assert service["spec"].get("clusterIP") != "None"


def test_vllm_runs_a_pinned_image_on_one_gpu_ready_on_health() -> None:
    deployment = _one("Deployment", VLLM)
    container = only_container(deployment)
    assert IMAGE.fullmatch(container["image"]), f"{container['image']}: pin a release tag"
    for flag in ("--model", "--served-model-name", "--max-num-seqs", "--port"):
        assert _flag(flag)
    resources = container["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == 1
    assert resources["limits"]["nvidia.com/gpu"] == 1, "an extended resource: limit = request"
    tolerations = pod_spec(deployment).get("tolerations", [])
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    port = int(_flag("--port"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/health"
        assert _container_port(deployment, get["port"]) == port
    # The Hugging Face token from a Secret, optional (public models start without it).
    (token,) = [v for v in container["env"] if v["name"] == "HF_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"]["optional"] is True
    # The model cache: a volume at Hugging Face's cache, an emptyDir or a claim.
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    (cache_mount,) = [
        m for m in container["volumeMounts"] if m["mountPath"].endswith("/.cache/huggingface")
    ]
    assert {"emptyDir", "persistentVolumeClaim"} & set(volumes[cache_mount["name"]])


def test_the_podmonitor_scrapes_each_vllm_pods_metrics() -> None:
    deployment = _one("Deployment", VLLM)
    monitor = _one("PodMonitor", VLLM)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    assert _container_port(deployment, endpoint["port"]) == int(_flag("--port"))
    # kube-prometheus-stack selects PodMonitors by its release label: the consumers' one's.
    release = _one("PodMonitor", CONSUMER)["metadata"]["labels"]["release"]
    assert monitor["metadata"]["labels"]["release"] == release


def test_the_hpa_scales_vllm_on_requests_waiting_through_prometheus_adapter() -> None:
    hpa = _one("HorizontalPodAutoscaler", VLLM)
    spec = hpa["spec"]
    target = spec["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"], target["name"]) == ("apps/v1", "Deployment", VLLM)
    assert 1 <= spec["minReplicas"] <= spec["maxReplicas"]
    slots = _max_num_seqs()
    # A few waiting per pod: far below the slots, so a shortfall scales at once.
    waiting = _hpa_metric(HPA_WAITING)
    assert waiting["type"] == "AverageValue"
    assert 1 <= int(waiting["averageValue"]) <= slots // 16
    # The slots in use, targeted at the slots: holds the pods while they are full and no
    # request waits, never asks for more than there are.
    running = _hpa_metric(HPA_RUNNING)
    assert running == {"type": "AverageValue", "averageValue": str(slots)}
    # prometheus-adapter serves each HPA metric from vLLM's gauge of that name, per pod.
    rules = _adapter_rules()
    for exported, series in ((HPA_WAITING, VLLM_WAITING), (HPA_RUNNING, VLLM_RUNNING)):
        (rule,) = [r for r in rules if r["name"]["as"] == exported]
        assert rule["seriesQuery"].split("{")[0] == series
        assert re.fullmatch(rule["name"]["matches"], series)
        overrides = rule["resources"]["overrides"]
        assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "<<.Series>>" in rule["metricsQuery"]
        assert "<<.GroupBy>>" in rule["metricsQuery"]


def test_the_consumers_are_capped_at_what_the_servers_can_take(tmp_path: Path) -> None:
    config = _pod_config("Deployment", tmp_path)
    model = config.model
    source = config.source
    assert isinstance(model, OpenAISettings)
    assert isinstance(source, KafkaSettings)
    slots = _max_num_seqs()
    servers = _one("HorizontalPodAutoscaler", VLLM)["spec"]["maxReplicas"]
    scaled = _one("ScaledObject")["spec"]
    assert scaled["scaleTargetRef"]["name"] == CONSUMER
    consumers = scaled["maxReplicaCount"]
    # The window's ceiling is the most a consumer may hold in flight.
    assert consumers * model.window_ceiling <= servers * slots * SLACK
    # max_in_flight = --max-num-seqs over the consumers per server at full scale.
    per_server, rest = divmod(consumers, servers)
    assert rest == 0, "a whole number of consumers per server"
    assert model.max_in_flight == slots // per_server
    assert model.window_ceiling == model.max_in_flight, "no consumer grows past its share"
    # With adapt, the consumers would hold vllm:num_requests_waiting at a couple themselves,
    # below the vLLM HPA's target, and the HPA that scales on it would never grow the fleet.
    assert model.adapt is False
    # KEDA's fallback holds a count within the cap; a group has no more busy members than
    # the topic has partitions.
    assert scaled["minReplicaCount"] <= scaled["fallback"]["replicas"] <= consumers
    assert consumers <= source.partitions


def test_keda_reads_the_lag_of_the_consumers_topic_and_group(tmp_path: Path) -> None:
    source = _pod_config("Deployment", tmp_path).source
    assert isinstance(source, KafkaSettings)
    (trigger,) = _one("ScaledObject")["spec"]["triggers"]
    assert trigger["type"] == "kafka"
    meta = trigger["metadata"]
    assert meta["topic"] == source.topic
    assert meta["consumerGroup"] == source.group_id
    assert meta["bootstrapServers"] == source.bootstrap_servers
    assert int(meta["lagThreshold"]) >= 1


def test_admin_ensure_runs_once_per_configuration() -> None:
    """The Job's name carries the replaced ConfigMap's hash (base's var, through two overlays),
    and it mounts that ConfigMap as the consumers do."""
    job = _consumers("Job")
    config_maps = [d for d in _render() if d["kind"] == "ConfigMap"]
    (config_map,) = config_maps
    name = config_map["metadata"]["name"]
    assert job["metadata"]["name"] == f"admin-{name}"
    for workload in (job, _consumers("Deployment")):
        mounted = [
            v["configMap"]["name"] for v in pod_spec(workload)["volumes"] if "configMap" in v
        ]
        assert mounted == [name]
