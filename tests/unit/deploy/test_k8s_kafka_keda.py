"""deploy/k8s/overlays/kafka-keda, checked offline beyond tests/unit/deploy/test_k8s.py: KEDA's
fallback when the group's lag cannot be read, the brokers' private CA (Strimzi's default)
given to KEDA's kafka scaler and to the pods from the same Secret, as a file the consumer's
``ssl_cafile`` names; the brokers named by a name Strimzi's broker certificates carry and that
resolves from KEDA's namespace as from the pods'; and admin ensure on a Kafka user of its own."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest

from rowbatch.consumer.service.config import load_config
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from tests.unit.deploy.kustomize import kustomize, one, only_container, pod_spec

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
OVERLAY = K8S / "overlays" / "kafka-keda"
WORKLOADS = ("Deployment", "Job")  # the consumers and admin ensure: both talk to the brokers
# Strimzi's Kafka cluster: the bootstrap Service <cluster>-kafka-bootstrap, its TLS listener.
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
STRIMZI_BOOTSTRAP = re.compile(
    rf"(?P<cluster>{_DNS_LABEL})-kafka-bootstrap\.(?P<namespace>{_DNS_LABEL})\.svc"
    r"(?:\.cluster\.local)?"
)
STRIMZI_TLS_PORT = 9093
SASL_ENV = ("ROWBATCH_SOURCE__SASL_PLAIN_USERNAME", "ROWBATCH_SOURCE__SASL_PLAIN_PASSWORD")


@cache
def _render() -> tuple[dict[str, Any], ...]:
    return kustomize(OVERLAY)


def _one(kind: str, name: str | None = None) -> dict[str, Any]:
    return one(_render(), kind, name)


def _crd_validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    group, version = doc["apiVersion"].split("/")
    path = K8S / "schemas" / f"{group}_{doc['kind'].lower()}_{version}.json"
    return jsonschema.Draft202012Validator(json.loads(path.read_text()))


def _source(kind: str, tmp_path: Path) -> KafkaSettings:
    """The ``[source]`` the ``kind`` pod loads: the ConfigMap's TOML mounted at its
    ``--config`` path plus its env (Secret values replaced by placeholders), through the real
    loader."""
    workload = _one(kind)
    container = only_container(workload)
    args = container["args"]
    path = PurePosixPath(args[args.index("--config") + 1])
    (mount,) = [
        m for m in container["volumeMounts"] if path.parent == PurePosixPath(m["mountPath"])
    ]
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    text = _one("ConfigMap", volume["configMap"]["name"])["data"][path.name]
    file = tmp_path / f"{kind}.toml"
    file.write_text(text)
    with pytest.MonkeyPatch.context() as mp:
        for var in container.get("env", []):
            if "valueFrom" in var:
                key = var["valueFrom"]["secretKeyRef"]["key"]
                value = "postgresql://u:p@postgres:5432/db" if "dsn" in key else "secret"
            else:
                value = var["value"]
            mp.setenv(var["name"], value)
        source = load_config(file).source
    assert isinstance(source, KafkaSettings)
    return source


def _auth_params() -> dict[str, dict[str, str]]:
    """The TriggerAuthentication of the ScaledObject's kafka trigger: KEDA parameter -> the
    Secret ``name`` and ``key`` it comes from."""
    (trigger,) = _one("ScaledObject")["spec"]["triggers"]
    auth = _one("TriggerAuthentication", trigger["authenticationRef"]["name"])
    assert set(auth["spec"]) == {"secretTargetRef"}, "every parameter from a Secret"
    refs = auth["spec"]["secretTargetRef"]
    params = {r["parameter"]: {"name": r["name"], "key": r["key"]} for r in refs}
    assert len(params) == len(refs), "a parameter given twice"
    return params


def test_the_fallback_holds_a_partition_capped_count_when_the_lag_cannot_be_read(
    tmp_path: Path,
) -> None:
    source = _source("Deployment", tmp_path)
    scaled = _one("ScaledObject")
    spec = scaled["spec"]
    fallback = spec["fallback"]
    assert fallback["failureThreshold"] == 3
    # a count the HPA may hold: within the ScaledObject's bounds, at most one per partition
    assert spec["minReplicaCount"] <= fallback["replicas"] <= spec["maxReplicaCount"]
    assert fallback["replicas"] <= source.partitions
    # KEDA refuses a fallback on a trigger whose metricType is not AverageValue (explicit here,
    # so a change to Value cannot silently disable the ScaledObject), and on cpu/memory ones.
    for trigger in spec["triggers"]:
        assert trigger["type"] not in ("cpu", "memory")
        assert trigger["metricType"] == "AverageValue"
    validator = _crd_validator(scaled)
    assert validator.is_valid(scaled)
    incomplete = json.loads(json.dumps(scaled))
    del incomplete["spec"]["fallback"]["replicas"]
    assert not validator.is_valid(incomplete), "the schema requires the fallback's replicas"


def test_keda_verifies_the_brokers_with_the_ca_from_a_secret(tmp_path: Path) -> None:
    source = _source("Deployment", tmp_path)
    assert source.tls, "the overlay's brokers speak TLS"
    (trigger,) = _one("ScaledObject")["spec"]["triggers"]
    params = _auth_params()
    # tls "enable" in exactly one place: KEDA's kafka scaler refuses it in both the trigger's
    # metadata and the TriggerAuthentication.
    places = [p for p in (trigger["metadata"].get("tls"), params.get("tls")) if p is not None]
    assert len(places) == 1, "tls in both the trigger and the TriggerAuthentication"
    if "tls" in trigger["metadata"]:
        assert trigger["metadata"]["tls"] == "enable"
    # the CA's PEM, from a Secret
    ca = params["ca"]
    assert ca["key"] == "ca.crt"
    assert ca["name"] != "rowbatch-secrets", "the CA is not a secret: its own Secret"
    # client certificates only as a pair, and only with the consumer's own
    assert ("cert" in params) == ("key" in params)
    assert ("cert" in params) == (source.ssl_certfile is not None)
    auth = _one("TriggerAuthentication")
    assert _crd_validator(auth).is_valid(auth)


@pytest.mark.parametrize("kind", WORKLOADS)
def test_the_pods_trust_the_same_ca_as_a_file_mounted_from_that_secret(
    kind: str, tmp_path: Path
) -> None:
    source = _source(kind, tmp_path)
    assert source.ssl_cafile is not None, "the brokers' private CA: ssl_cafile"
    cafile = PurePosixPath(source.ssl_cafile)
    assert cafile.is_absolute()
    workload = _one(kind)
    mounts = only_container(workload)["volumeMounts"]
    holding = [m for m in mounts if cafile.is_relative_to(m["mountPath"])]
    (mount,) = holding  # not nested in another mount (the ConfigMap's is read-only)
    assert mount.get("readOnly") is True
    assert "subPath" not in mount, "a subPath mount never sees a renewed CA"
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    secret = volume["secret"]
    ca = _auth_params()["ca"]
    assert secret["secretName"] == ca["name"], "KEDA and the pods trust the same CA"
    assert not secret.get("optional", False), "no pod without the CA"
    relative = str(cafile.relative_to(mount["mountPath"]))
    files = {i["path"]: i["key"] for i in secret.get("items", [])} or {ca["key"]: ca["key"]}
    assert files[relative] == ca["key"], f"{cafile} is not the Secret's key {ca['key']}"


def strimzi_bootstrap_sans(cluster: str, namespace: str) -> set[str]:
    """The names Strimzi's cluster CA puts in every broker certificate for the bootstrap
    Service (``ModelUtils.generateAllServiceDnsNames`` in strimzi-kafka-operator), with the
    default cluster domain."""
    service = f"{cluster}-kafka-bootstrap"
    return {
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
    }


def bootstrap_addresses(servers: str) -> list[tuple[str, int]]:
    """``host:port[,host:port...]`` as pairs."""
    pairs = []
    for server in servers.split(","):
        host, _, port = server.strip().rpartition(":")
        pairs.append((host, int(port)))
    return pairs


@pytest.mark.parametrize("kind", WORKLOADS)
def test_the_brokers_are_named_as_strimzis_certificates_name_them_from_any_namespace(
    kind: str, tmp_path: Path
) -> None:
    """KEDA's operator resolves ``bootstrapServers`` from its own namespace (keda), so a short
    name (``kafka-0.kafka``) finds nothing there; and TLS verifies the name against the
    brokers' certificates. The bootstrap Service's name qualified with its namespace and
    ``.svc`` does both, in the pods and in KEDA, and the two name the same brokers."""
    source = _source(kind, tmp_path)
    (trigger,) = _one("ScaledObject")["spec"]["triggers"]
    keda = trigger["metadata"]["bootstrapServers"]
    assert keda == source.bootstrap_servers, "KEDA reads the lag of the brokers the pods use"
    for host, port in bootstrap_addresses(keda):
        named = STRIMZI_BOOTSTRAP.fullmatch(host)
        assert named is not None, f"{host}: not <cluster>-kafka-bootstrap.<namespace>.svc"
        assert host in strimzi_bootstrap_sans(named["cluster"], named["namespace"])
        assert port == STRIMZI_TLS_PORT, "Strimzi's TLS listener (SASL_SSL)"
    assert source.tls


def _sasl_secrets(workload: dict[str, Any]) -> set[str]:
    """The Secrets the SASL user and password of ``workload``'s container come from."""
    env = {v["name"]: v for v in only_container(workload).get("env", [])}
    assert set(SASL_ENV) <= env.keys(), "the SASL user and password from the environment"
    return {env[name]["valueFrom"]["secretKeyRef"]["name"] for name in SASL_ENV}


def test_admin_ensure_creates_topics_as_a_kafka_user_of_its_own() -> None:
    """Creating topics needs Create (and DescribeConfigs) on the cluster's topics: rights the
    consumers, and KEDA reading their lag, should not hold. The Job's user and password come
    from a Secret of their own; the consumers' and KEDA's from another."""
    (consumers,) = _sasl_secrets(_one("Deployment"))
    (admin,) = _sasl_secrets(_one("Job"))
    assert admin != consumers
    params = _auth_params()
    assert {params["username"]["name"], params["password"]["name"]} == {consumers}
    job_refs = {
        (var["valueFrom"]["secretKeyRef"]["name"], var["valueFrom"]["secretKeyRef"]["key"])
        for var in only_container(_one("Job")).get("env", [])
        if "valueFrom" in var
    }
    consumer_user = {(p["name"], p["key"]) for p in (params["username"], params["password"])}
    assert not job_refs & consumer_user, "the Job never sees the consumers' Kafka user"
