"""deploy/k8s/overlays/kafka-share-keda, checked offline beyond tests/unit/deploy/test_k8s.py: a
Kafka share group's consumers (``kind = "kafka-share"``) scaled by KEDA's prometheus scaler on
the sum of their ``rowbatch_replica_load`` with threshold 1 (replicas = ceil(sum of the
loads)), capped by what the model servers can feed and not by the partitions, with a fallback
KEDA accepts (AverageValue) and a query that never hands KEDA a NaN, and reads "nothing known"
as an error (so the fallback) rather than as 0; promtool runs the query on series with NaN in
them. The brokers, the SASL users and the CA are kafka-keda's: the patches are copies (kustomize
refuses patch files outside the overlay), held equal to kafka-keda's here."""

from __future__ import annotations

import json
import re
import subprocess
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.config import ConsumerConfig, load_config
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from tests.required_tools import require_tool
from tests.unit.deploy.kustomize import kustomize, one, only_container, pod_spec
from tests.unit.deploy.test_k8s_kafka_keda import STRIMZI_BOOTSTRAP, bootstrap_addresses

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAY = K8S / "overlays" / "kafka-share-keda"
KAFKA_KEDA = K8S / "overlays" / "kafka-keda"
WORKLOADS = ("Deployment", "Job")  # the consumers and admin ensure: both talk to the brokers
LOAD = "rowbatch_replica_load"
SASL_ENV = ("ROWBATCH_SOURCE__SASL_PLAIN_USERNAME", "ROWBATCH_SOURCE__SASL_PLAIN_PASSWORD")
CA_VOLUME = "kafka-ca"
# sum(<metric>{<matchers>} >= 0): the loads of this install's consumers, NaN ones left out.
QUERY = re.compile(r"sum\((?P<metric>[a-z_]+)\{(?P<matchers>[^}]*)\} >= 0\)")
MATCHER = re.compile(r'(?P<label>[a-z_]+)="(?P<value>[^"]*)"')


@cache
def _render(overlay: Path = OVERLAY) -> tuple[dict[str, Any], ...]:
    return kustomize(overlay)


def _one(kind: str, name: str | None = None, overlay: Path = OVERLAY) -> dict[str, Any]:
    return one(_render(overlay), kind, name)


def _config(kind: str, tmp_path: Path, overlay: Path = OVERLAY) -> ConsumerConfig:
    """The configuration the ``kind`` pod loads: the ConfigMap's TOML mounted at its
    ``--config`` path plus its env (Secret values replaced by placeholders), through
    rowbatch's own loader."""
    workload = _one(kind, overlay=overlay)
    container = only_container(workload)
    args = container["args"]
    path = PurePosixPath(args[args.index("--config") + 1])
    (mount,) = [
        m for m in container["volumeMounts"] if path.parent == PurePosixPath(m["mountPath"])
    ]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    text = _one("ConfigMap", volume["configMap"]["name"], overlay)["data"][path.name]
    file = tmp_path / f"{overlay.name}-{kind}.toml"
    file.write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        for var in container.get("env", []):
            if "valueFrom" in var:
                key = var["valueFrom"]["secretKeyRef"]["key"]
                value = "postgresql://u:p@postgres:5432/db" if "dsn" in key else "secret"
            else:
                value = var["value"]
            mp.setenv(var["name"], value)
        return load_config(file)


def _source(kind: str, tmp_path: Path) -> KafkaShareSettings:
    source = _config(kind, tmp_path).source
    assert isinstance(source, KafkaShareSettings), type(source).__name__
    return source


def _trigger() -> dict[str, Any]:
    (trigger,) = _one("ScaledObject")["spec"]["triggers"]
    assert isinstance(trigger, dict)
    return trigger


def _query() -> tuple[str, dict[str, str]]:
    """The trigger's query: the metric it sums and its label matchers."""
    query = _trigger()["metadata"]["query"]
    parsed = QUERY.fullmatch(query)
    assert parsed is not None, f"{query!r} is not sum(<metric>{{...}} >= 0)"
    matchers = dict(MATCHER.findall(parsed["matchers"]))
    assert ",".join(f'{k}="{v}"' for k, v in matchers.items()) == parsed["matchers"]
    return parsed["metric"], matchers


def _crd_validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    group, version = doc["apiVersion"].split("/")
    path = K8S / "schemas" / f"{group}_{doc['kind'].lower()}_{version}.json"
    return jsonschema.Draft202012Validator(json.loads(path.read_text()))


@pytest.mark.parametrize("kind", WORKLOADS)
def test_the_pods_load_a_share_group_source_over_sasl_ssl(kind: str, tmp_path: Path) -> None:
    source = _source(kind, tmp_path)
    assert source.kind == "kafka-share"
    assert source.security_protocol == "SASL_SSL"
    assert source.sasl_mechanism == "SCRAM-SHA-512"
    assert source.sasl_plain_username == "secret", "the user from the Secret, not the file"
    kafka_keda = _config(kind, tmp_path, KAFKA_KEDA).source
    assert isinstance(kafka_keda, KafkaSettings)
    # a group id a classic group holds cannot join as a share group: never kafka-keda's
    assert source.group_id != kafka_keda.group_id


@pytest.mark.parametrize("kind", WORKLOADS)
def test_the_bootstrap_servers_are_kafka_kedas_strimzi_brokers(kind: str, tmp_path: Path) -> None:
    source = _source(kind, tmp_path)
    kafka_keda = _config(kind, tmp_path, KAFKA_KEDA).source
    assert isinstance(kafka_keda, KafkaSettings)
    assert source.bootstrap_servers == kafka_keda.bootstrap_servers, "the same placeholders"
    for host, port in bootstrap_addresses(source.bootstrap_servers):
        assert STRIMZI_BOOTSTRAP.fullmatch(host), host
        assert port == 9093, "Strimzi's TLS listener (SASL_SSL)"
    assert source.tls


@pytest.mark.parametrize("kind", WORKLOADS)
def test_the_sasl_users_and_the_ca_are_kafka_kedas(kind: str, tmp_path: Path) -> None:
    """The copied patches render as kafka-keda's: the same Secrets and keys for the SASL user
    (the consumers' for the Deployment, admin ensure's own for the Job), the same CA Secret
    mounted at the same place, which ``ssl_cafile`` names."""

    def security(overlay: Path) -> tuple[list[Any], list[Any], list[Any]]:
        workload = _one(kind, overlay=overlay)
        container = only_container(workload)
        env = [v for v in container.get("env", []) if v["name"] in SASL_ENV]
        mounts = [m for m in container["volumeMounts"] if m["name"] == CA_VOLUME]
        volumes = [v for v in pod_spec(workload)["volumes"] if v["name"] == CA_VOLUME]
        return env, mounts, volumes

    env, mounts, volumes = security(OVERLAY)
    assert [v["name"] for v in env] == list(SASL_ENV)
    assert (env, mounts, volumes) == security(KAFKA_KEDA)
    (mount,) = mounts
    source = _source(kind, tmp_path)
    assert source.ssl_cafile is not None
    assert PurePosixPath(source.ssl_cafile).is_relative_to(mount["mountPath"])


def test_keda_owns_the_replicas_of_the_consumers() -> None:
    scaled = _one("ScaledObject")
    deployment = _one("Deployment")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert "replicas" not in deployment["spec"], "KEDA owns it"
    assert _crd_validator(scaled).is_valid(scaled)
    kinds = {d["kind"] for d in _render()}
    assert "TriggerAuthentication" not in kinds, "KEDA reads Prometheus, not the brokers"


def test_the_trigger_is_prometheus_on_the_sum_of_the_replica_load_with_threshold_1() -> None:
    """Each consumer's load is its share of the replicas needed; KEDA serves the query as an
    External metric with AverageValue = threshold, so threshold 1 makes the HPA ask for
    ceil(sum of the loads)."""
    trigger = _trigger()
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert float(meta["threshold"]) == 1
    metric, _ = _query()
    assert metric == LOAD
    assert metric in {family.name for family in Metrics().registry.collect()}
    # a Service of Prometheus' qualified with its namespace: KEDA's operator resolves the name
    # from its own namespace
    address = urlsplit(meta["serverAddress"])
    assert address.scheme in ("http", "https")
    assert address.hostname is not None
    assert re.fullmatch(r"[a-z0-9-]+\.[a-z0-9-]+\.svc(\.cluster\.local)?", address.hostname)
    assert address.port == 9090


def test_the_query_selects_this_installs_consumers() -> None:
    """The Prometheus Operator labels what a PodMonitor scrapes with job <namespace>/<name>:
    the query names the namespace (a placeholder) and the job of the overlay's own PodMonitor,
    which selects the consumers' pods."""
    _, matchers = _query()
    assert set(matchers) == {"namespace", "job"}
    monitor = _one("PodMonitor")
    assert matchers["job"] == f"{matchers['namespace']}/{monitor['metadata']['name']}"
    labels = _one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_the_fallback_holds_a_count_keda_accepts_when_the_load_cannot_be_read() -> None:
    scaled = _one("ScaledObject")
    spec = scaled["spec"]
    fallback = spec["fallback"]
    assert fallback["failureThreshold"] >= 1
    assert spec["minReplicaCount"] <= fallback["replicas"] <= spec["maxReplicaCount"]
    # KEDA refuses a fallback on a trigger whose metricType is not AverageValue
    assert all(t["metricType"] == "AverageValue" for t in spec["triggers"])
    # no data is an error (counted towards the fallback), not a load of 0 (KEDA's default)
    assert _trigger()["metadata"]["ignoreNullValues"] == "false"
    validator = _crd_validator(scaled)
    incomplete = json.loads(json.dumps(scaled))
    del incomplete["spec"]["fallback"]["replicas"]
    assert not validator.is_valid(incomplete), "the schema requires the fallback's replicas"


def test_the_replicas_are_capped_by_the_model_servers_not_the_partitions(tmp_path: Path) -> None:
    source = _source("Deployment", tmp_path)
    spec = _one("ScaledObject")["spec"]
    # the cap is the consumers' own max_replicas (what the model servers can feed)...
    assert spec["maxReplicaCount"] == source.max_replicas
    # ...and the shipped example goes past the partitions: a share group's members share them
    assert spec["maxReplicaCount"] > source.partitions
    # no replica, no load reported: nothing could scale the fleet up from zero
    assert spec["minReplicaCount"] >= 1


def test_the_scale_down_is_kafka_kedas() -> None:
    def scale_down(overlay: Path) -> Any:
        spec = _one("ScaledObject", overlay=overlay)["spec"]
        return spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]

    assert scale_down(OVERLAY) == scale_down(KAFKA_KEDA)


@pytest.fixture
def promtool() -> None:
    require_tool("promtool", "the ScaledObject's PromQL query", "apt-get install -y prometheus")


def test_promtool_the_query_sums_the_known_loads_and_is_empty_when_none_is(
    promtool: None, tmp_path: Path
) -> None:
    """The query, as KEDA sends it, over this install's consumers (one of which stops knowing
    its load, then both) and another install's in the same namespace: the sum of the known
    loads, never NaN (KEDA before 2.20 turns NaN into an undefined number), and no sample at
    all once nothing is known (an error for KEDA with ignoreNullValues false: the fallback)."""
    query = _trigger()["metadata"]["query"]
    _, matchers = _query()
    namespace, job = matchers["namespace"], matchers["job"]

    other = job.replace("/", "/staging-", 1)  # another install's PodMonitor, prefixed

    def series(of_job: str, pod: str) -> str:
        return f'{LOAD}{{namespace="{namespace}",job="{of_job}",pod="{pod}"}}'

    (tmp_path / "rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "keda", "rules": [{"record": "q", "expr": query}]}]})
    )
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": [
                    {"series": series(job, "a"), "values": "0.6 NaN NaN"},
                    {"series": series(job, "b"), "values": "0.9 0.9 NaN"},
                    {"series": series(other, "c"), "values": "5 5 5"},
                ],
                "promql_expr_test": [
                    {"expr": query, "eval_time": "0s", "exp_samples": [{"value": 1.5}]},
                    {"expr": query, "eval_time": "15s", "exp_samples": [{"value": 0.9}]},
                    {"expr": query, "eval_time": "30s", "exp_samples": []},
                ],
            }
        ],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        ["promtool", "test", "rules", "test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
