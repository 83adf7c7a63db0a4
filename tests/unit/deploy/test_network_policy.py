"""deploy/k8s/components/network-policy, included as its comments say: in an overlay of the
consumers (kafka-keda and kafka-share-keda with the kafka sub-component, gke-pubsub with
google-apis), it renders and validates, isolates every pod of rowbatch's (the consumers and
admin ensure) in both directions, and lets through only what they need. The test asks a
small evaluator of NetworkPolicy's rules (selectors, namespaces, ipBlocks, named ports)
whether a connection is allowed: DNS to kube-dns, the brokers the consumers are configured
with (Strimzi's pods in the namespace the bootstrap address names), the model servers
(Triton's and vLLM's pods, as their overlays render them, on the port the consumers'
model.url names), the sink, Google's APIs and the GKE metadata server; metrics scraped from
the monitoring namespaces only; and nothing else. It leaves the model servers' pods alone (it
does not select them), and holds under an operator's namePrefix and instance label."""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from rowbatch.consumer.model.endpoints import DnsName, parse_endpoints
from tests.unit.deploy.kustomize import kustomize, overlay
from tests.unit.deploy.test_k8s_kafka_keda import STRIMZI_BOOTSTRAP, bootstrap_addresses

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"
COMPONENT = K8S / "components" / "network-policy"
K8S_VERSION = "1.32.0"
NAMESPACE = "rowbatch"  # where the operator applies the overlay
MONITORING = ("monitoring", "gmp-system")  # kube-prometheus-stack's, GKE managed collection's
POSTGRES_PORT = 5432
# Which sub-component each consumer overlay takes with the component.
BROKERS = {"kafka-keda": "kafka", "kafka-share-keda": "kafka", "gke-pubsub": "google-apis"}
KAFKA_OVERLAYS = [where for where, broker in BROKERS.items() if broker == "kafka"]
ROWBATCH = ("rowbatch-consumer", "rowbatch-admin")  # app.kubernetes.io/name of their pods
GOOGLE_API_IP = "142.250.72.10"  # one of Google's public addresses (pubsub.googleapis.com)
GKE_METADATA = (("169.254.169.254", 80), ("169.254.169.252", 988))


@dataclass(frozen=True)
class Pod:
    """One end of a connection: a pod (labels, namespace, named ports) or an address outside
    the cluster (no namespace)."""

    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)


def selects(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector against labels (the empty selector selects everything)."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        present = key in labels
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def _peer_matches(peer: Mapping[str, Any], policy_namespace: str, other: Pod) -> bool:
    if "ipBlock" in peer:
        ip = ipaddress.ip_address(other.ip)
        block = peer["ipBlock"]
        excepted = any(ip in ipaddress.ip_network(e) for e in block.get("except", []))
        return ip in ipaddress.ip_network(block["cidr"]) and not excepted
    if other.namespace is None:  # selectors match pods only
        return False
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": other.namespace}
        if not selects(peer["namespaceSelector"], namespace_labels):
            return False
    elif other.namespace != policy_namespace:
        return False
    return selects(peer.get("podSelector", {}), other.labels)


def _port_matches(
    ports: list[dict[str, Any]] | None, port: int, protocol: str, named: Mapping[str, int]
) -> bool:
    if not ports:
        return True
    for rule in ports:
        if rule.get("protocol", "TCP") != protocol:
            continue
        if "port" not in rule:
            return True
        value = rule["port"]
        number = named.get(value) if isinstance(value, str) else value
        if number is not None and number <= port <= rule.get("endPort", number):
            return True
    return False


def allowed(
    docs: tuple[dict[str, Any], ...],
    direction: str,
    pod: Pod,
    other: Pod,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Whether the rendered NetworkPolicies (applied in the pod's namespace) let ``pod`` open
    (``Egress``) or accept (``Ingress``) a connection to or from ``other`` on ``port``."""
    rules_key, peers_key = ("egress", "to") if direction == "Egress" else ("ingress", "from")
    # a named port is the destination's: the other end's on egress, the pod's own on ingress
    named = other.ports if direction == "Egress" else pod.ports
    isolating = []
    for policy in (d for d in docs if d["kind"] == "NetworkPolicy"):
        spec = policy["spec"]
        types = spec.get("policyTypes", ["Ingress", *(["Egress"] if "egress" in spec else [])])
        if direction in types and selects(spec["podSelector"], pod.labels):
            isolating.append(spec)
    if not isolating:
        return True
    assert pod.namespace is not None
    for spec in isolating:
        for rule in spec.get(rules_key, []):
            peers = rule.get(peers_key)
            if peers and not any(_peer_matches(p, pod.namespace, other) for p in peers):
                continue
            if _port_matches(rule.get("ports"), port, protocol, named):
                return True
    return False


def _include(tmp_path: Path, where: str, **fields: Any) -> tuple[dict[str, Any], ...]:
    up = "/".join([".."] * (len(tmp_path.parts) - 1))
    components = [f"{up}{COMPONENT}", f"{up}{COMPONENT / BROKERS[where]}"]
    return kustomize(overlay(tmp_path, K8S / "overlays" / where, components=components, **fields))


@cache
def _render(where: str) -> tuple[dict[str, Any], ...]:
    return kustomize(K8S / "overlays" / where)


def _pod(workload: dict[str, Any], ip: str, namespace: str = NAMESPACE) -> Pod:
    template = workload["spec"]["template"]
    ports = {
        p["name"]: p["containerPort"]
        for c in template["spec"]["containers"]
        for p in c.get("ports", [])
        if "name" in p
    }
    return Pod(ip, namespace, template["metadata"]["labels"], ports)


def _workload(docs: tuple[dict[str, Any], ...], name: str) -> dict[str, Any]:
    (found,) = [
        d
        for d in docs
        if d["kind"] in ("Deployment", "Job")
        and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/name") == name
    ]
    return found


def _rowbatch_pods(docs: tuple[dict[str, Any], ...]) -> dict[str, Pod]:
    return {
        name: _pod(_workload(docs, name), f"10.8.0.{i + 10}") for i, name in enumerate(ROWBATCH)
    }


def _config(docs: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    parsed: dict[str, Any] = tomllib.loads(config_map["data"]["consumer.toml"])
    return parsed


def _model_servers() -> list[tuple[Pod, int]]:
    """Triton's and vLLM's pods as their overlays render them, each with the port the
    consumers that use it name in model.url."""
    (triton_url,) = parse_endpoints(_config(_render("kafka-keda"))["model"]["url"]).targets
    assert isinstance(triton_url, DnsName)
    vllm_port = urlsplit(_config(_render("vllm"))["model"]["url"]).port
    assert vllm_port is not None
    return [
        (_pod(_workload(_render("triton"), "triton"), "10.8.2.10"), triton_url.port),
        (_pod(_workload(_render("vllm"), "vllm"), "10.8.2.11"), vllm_port),
    ]


def _brokers(where: str) -> list[tuple[Pod, int]]:
    """A pod of the Strimzi cluster the overlay's bootstrap address (its consumer.toml's; in
    kafka-keda KEDA's is held the same) names, in its namespace, with Strimzi's labels for a
    Kafka broker."""
    brokers = []
    servers = _config(_render(where))["source"]["bootstrap_servers"]
    for host, port in bootstrap_addresses(servers):
        named = STRIMZI_BOOTSTRAP.fullmatch(host)
        assert named is not None, host
        labels = {
            "strimzi.io/cluster": named["cluster"],
            "strimzi.io/kind": "Kafka",
            "strimzi.io/name": f"{named['cluster']}-kafka",
            "strimzi.io/broker-role": "true",
        }
        brokers.append((Pod("10.8.3.10", named["namespace"], labels), port))
    return brokers


KUBE_DNS = Pod("10.8.1.2", "kube-system", {"k8s-app": "kube-dns"})
STRANGER = Pod("10.8.9.9", NAMESPACE, {"app.kubernetes.io/name": "something-else"})


@pytest.mark.parametrize("where", BROKERS)
def test_the_component_renders_and_validates_in_an_overlay(where: str, tmp_path: Path) -> None:
    docs = _include(tmp_path, where)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies
    for policy in policies:
        kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    others = [d for d in docs if d["kind"] != "NetworkPolicy"]
    assert others == list(_render(where)), "the component adds policies and changes nothing"
    assert yaml.safe_load((COMPONENT / "kustomization.yaml").read_text())["kind"] == "Component"


@pytest.mark.parametrize("where", BROKERS)
def test_rowbatch_pods_are_isolated_both_ways_and_the_model_servers_are_not(
    where: str, tmp_path: Path
) -> None:
    docs = _include(tmp_path, where)
    for name, pod in _rowbatch_pods(docs).items():
        assert not allowed(docs, "Egress", pod, STRANGER, 8080), name
        assert not allowed(docs, "Ingress", pod, STRANGER, 9464), name
        assert not allowed(docs, "Egress", pod, Pod("203.0.113.7"), 8443), name
    for server, port in _model_servers():
        assert allowed(docs, "Ingress", server, STRANGER, port), "not the component's to isolate"


@pytest.mark.parametrize("where", BROKERS)
def test_dns_reaches_kube_dns_only(where: str, tmp_path: Path) -> None:
    docs = _include(tmp_path, where)
    for pod in _rowbatch_pods(docs).values():
        for protocol in ("UDP", "TCP"):
            assert allowed(docs, "Egress", pod, KUBE_DNS, 53, protocol)
            assert not allowed(docs, "Egress", pod, STRANGER, 53, protocol)


@pytest.mark.parametrize("where", KAFKA_OVERLAYS)
def test_the_consumers_and_admin_ensure_reach_the_configured_brokers(
    where: str, tmp_path: Path
) -> None:
    docs = _include(tmp_path, where)
    for broker, port in _brokers(where):
        for name, pod in _rowbatch_pods(docs).items():
            assert allowed(docs, "Egress", pod, broker, port), name
            assert not allowed(docs, "Egress", pod, broker, port + 1), name
        elsewhere = Pod(broker.ip, "default", broker.labels)
        assert not allowed(
            docs, "Egress", _rowbatch_pods(docs)["rowbatch-consumer"], elsewhere, port
        )
    # no Google APIs on a Kafka cluster: the internet stays closed
    for pod in _rowbatch_pods(docs).values():
        assert not allowed(docs, "Egress", pod, Pod(GOOGLE_API_IP), 443)


def test_on_gke_pubsub_and_the_metadata_server_are_reachable(tmp_path: Path) -> None:
    docs = _include(tmp_path, "gke-pubsub")
    for name, pod in _rowbatch_pods(docs).items():
        assert allowed(docs, "Egress", pod, Pod(GOOGLE_API_IP), 443), name
        for ip, port in GKE_METADATA:  # Workload Identity's tokens
            assert allowed(docs, "Egress", pod, Pod(ip), port), f"{name} -> {ip}:{port}"
        assert not allowed(docs, "Egress", pod, STRANGER, 443), "not in-cluster pods on 443"
        assert not allowed(docs, "Egress", pod, Pod(GOOGLE_API_IP), 80)


@pytest.mark.parametrize("where", BROKERS)
def test_the_consumers_reach_the_model_servers_and_the_sink(where: str, tmp_path: Path) -> None:
    docs = _include(tmp_path, where)
    pods = _rowbatch_pods(docs)
    consumer, admin = pods["rowbatch-consumer"], pods["rowbatch-admin"]
    for server, port in _model_servers():
        assert allowed(docs, "Egress", consumer, server, port)
        assert not allowed(docs, "Egress", admin, server, port), "admin ensure needs no model"
        elsewhere = Pod(server.ip, "default", server.labels)
        assert not allowed(docs, "Egress", consumer, elsewhere, port)
    # the sink: the placeholder address the component documents, on PostgreSQL's port
    sinks = [
        block["ipBlock"]["cidr"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
        for rule in d["spec"].get("egress", [])
        if any(p.get("port") == POSTGRES_PORT for p in rule.get("ports", []))
        for block in rule.get("to", [])
        if "ipBlock" in block
    ]
    assert sinks, "no egress to PostgreSQL"
    sink = Pod(str(ipaddress.ip_network(sinks[0])[0]))
    assert allowed(docs, "Egress", consumer, sink, POSTGRES_PORT)
    assert not allowed(docs, "Egress", consumer, sink, POSTGRES_PORT + 1)
    assert not allowed(docs, "Egress", consumer, STRANGER, POSTGRES_PORT)


@pytest.mark.parametrize("where", BROKERS)
def test_metrics_are_scraped_from_the_monitoring_namespaces_only(
    where: str, tmp_path: Path
) -> None:
    docs = _include(tmp_path, where)
    pods = _rowbatch_pods(docs)
    consumer = pods["rowbatch-consumer"]
    metrics = consumer.ports["metrics"]
    for namespace in MONITORING:
        prometheus = Pod("10.8.4.10", namespace, {"app.kubernetes.io/name": "prometheus"})
        assert allowed(docs, "Ingress", consumer, prometheus, metrics), namespace
        assert not allowed(docs, "Ingress", consumer, prometheus, metrics + 1), namespace
        assert not allowed(docs, "Ingress", pods["rowbatch-admin"], prometheus, metrics)
    for namespace in (NAMESPACE, "default", "kube-system"):
        peer = Pod("10.8.4.11", namespace, {"app.kubernetes.io/name": "prometheus"})
        assert not allowed(docs, "Ingress", consumer, peer, metrics), namespace


@pytest.mark.parametrize("where", BROKERS)
def test_an_instance_under_a_prefix_and_its_own_label_keeps_the_same_rules(
    where: str, tmp_path: Path
) -> None:
    """Two installs in one namespace (docs): namePrefix plus an instance label in the
    selectors. The policies select that instance's pods; the peers outside rowbatch (kube-dns,
    the brokers, the model servers, the monitoring namespaces) keep their selectors."""
    instance = {"app.kubernetes.io/instance": "staging"}
    docs = _include(
        tmp_path,
        where,
        namePrefix="staging-",
        labels=[{"pairs": instance, "includeSelectors": True}],
    )
    pods = _rowbatch_pods(docs)
    consumer = pods["rowbatch-consumer"]
    assert instance.items() <= consumer.labels.items()
    for pod in pods.values():
        assert allowed(docs, "Egress", pod, KUBE_DNS, 53, "UDP")
        assert not allowed(docs, "Egress", pod, STRANGER, 8080)
    for server, port in _model_servers():
        assert allowed(docs, "Egress", consumer, server, port)
    prometheus = Pod("10.8.4.10", MONITORING[0], {"app.kubernetes.io/name": "prometheus"})
    assert allowed(docs, "Ingress", consumer, prometheus, consumer.ports["metrics"])
    if BROKERS[where] == "kafka":
        for broker, port in _brokers(where):
            assert allowed(docs, "Egress", consumer, broker, port)
    # another instance's pods are not this one's to open
    other = Pod(consumer.ip, NAMESPACE, {**consumer.labels, "app.kubernetes.io/instance": "prod"})
    assert allowed(docs, "Egress", other, STRANGER, 8080), "prod's pods: prod's policies"
