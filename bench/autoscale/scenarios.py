"""What the simulator compares: the per-replica rates measured by the benchmark, the deploy
overlays' HPA behaviour, and one scenario per broker and signal (a signal, its HPA target,
the replica bounds), at the targets the manifests use or at any other target for the sweep."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from bench.autoscale.fleet import FleetParams
from bench.autoscale.hpa import DEFAULT_BEHAVIOR, Behavior, Policy, Rules
from bench.autoscale.signals import (
    CLOUD_MONITORING,
    PROMETHEUS,
    Delay,
    Delayed,
    DesiredFormula,
    DesiredReplicas,
    Either,
    InflightMessages,
    KedaLag,
    Signal,
    UndeliveredMessages,
    keda,
)

Broker = Literal["pubsub", "kafka"]

#: deploy/k8s/overlays/gke-pubsub/hpa.yaml: up 100 % per 30 s; down 1 pod per 60 s after 300 s.
PUBSUB_OVERLAY_BEHAVIOR = Behavior(
    scale_up=Rules(0, (Policy("Percent", 100, 30),)),
    scale_down=Rules(300, (Policy("Pods", 1, 60),)),
)
#: deploy/k8s/overlays/kafka-keda/scaledobject.yaml: the default scale-up; down 1 pod per
#: 60 s after 300 s.
KEDA_OVERLAY_BEHAVIOR = Behavior(
    scale_up=DEFAULT_BEHAVIOR.scale_up,
    scale_down=Rules(300, (Policy("Pods", 1, 60),)),
)


@dataclass(frozen=True)
class Params:
    """The simulator's inputs (each a ``python -m bench autoscale`` option)."""

    pubsub_rows_per_s: float = 19_368
    """One replica, Pub/Sub -> PostgreSQL, ``embedder`` (docs/benchmarks.md, section 2)."""
    kafka_rows_per_s: float = 24_409
    """One replica, Kafka -> PostgreSQL, ``embedder`` (docs/benchmarks.md, section 2)."""
    server_rows_per_s: float = 200_000
    """The model servers' capacity, all replicas together."""
    partitions: int = 12
    """The Kafka topic's partitions (the KEDA overlay's ``maxReplicaCount``)."""
    pubsub_max_replicas: int = 20
    """The gke-pubsub overlay's ``maxReplicas``."""
    pod_startup_s: float = 30.0
    rebalance_pause_s: float = 3.0
    max_messages: int = 1000
    unsettled_s: float = 1.0
    """Seconds written work stays in the broker's count (commit interval, ack batching)."""
    latency_objective_s: float = 30.0
    """End-to-end latency the report holds each run to (``target_latency_s``'s default)."""
    hpa_messages_per_pod: float = 580
    """The gke-pubsub overlay's ``num_undelivered_messages`` ``averageValue``."""
    inflight_per_pod: float = 800
    """The gke-pubsub overlay's ``rowbatch_inflight_messages`` ``averageValue``."""
    keda_lag_threshold: float = 730
    """The kafka-keda overlay's ``lagThreshold``."""
    keda_polling_s: int = 15
    """The kafka-keda overlay's ``pollingInterval`` (KEDA's default: 30)."""
    keda_allow_idle_consumers: bool = False
    """The kafka-keda overlay's ``allowIdleConsumers``: false caps the lag KEDA reports at
    partitions x ``lagThreshold``."""
    target_latency_s: float = 30.0
    """rowbatch's ``target_latency_s`` (the consumer's default)."""

    def fleet(self, broker: Broker) -> FleetParams:
        return FleetParams(
            self.pubsub_rows_per_s if broker == "pubsub" else self.kafka_rows_per_s,
            self.server_rows_per_s,
            partitions=None if broker == "pubsub" else self.partitions,
            pod_startup_s=self.pod_startup_s,
            rebalance_pause_s=self.rebalance_pause_s,
            max_messages=self.max_messages,
            unsettled_s=self.unsettled_s,
        )

    def max_replicas(self, broker: Broker) -> int:
        return self.pubsub_max_replicas if broker == "pubsub" else self.partitions


SignalFactory = Callable[[Callable[[Delay], Delayed]], Signal]


@dataclass(frozen=True)
class Scenario:
    """One broker, one signal, one setting of its target."""

    family: str
    """The signal, without its setting (the sweep groups by it)."""
    broker: Broker
    setting: float
    """The swept figure: messages/pod, lagThreshold or target_latency_s."""
    setting_name: str
    fleet: FleetParams
    behavior: Behavior
    max_replicas: int
    make_signal: SignalFactory
    min_replicas: int = 1

    @property
    def name(self) -> str:
        return f"{self.broker}/{self.family}"

    def signal(self, rng: random.Random) -> Signal:
        return self.make_signal(lambda delay: Delayed(delay, rng))


#: The signals compared, broker by the name (``-lag``: Kafka, else Pub/Sub):
#:
#: - ``cloud-monitoring``: ``num_undelivered_messages`` (Cloud Monitoring) per pod;
#: - ``overlay``: the gke-pubsub overlay as deployed: that, or ``rowbatch_inflight_messages``
#:   per pod, whichever asks for more;
#: - ``rowbatch-age``: ``rowbatch_desired_replicas`` from the age of the oldest row waiting;
#: - ``rowbatch-age+rate``: the same plus the rate term (see :class:`DesiredFormula`);
#: - ``rowbatch-age+rate+fast-up``: that with the HPA's default scale-up (max(4 pods, 100 %)
#:   per 15 s) instead of the overlay's 100 % per 30 s;
#: - ``keda-lag``: KEDA's kafka scaler (the kafka-keda overlay);
#: - ``rowbatch-lag``: ``rowbatch_desired_replicas`` from lag, as the Kafka source exports it;
#: - ``rowbatch-lag+rate``: the same plus the rate term and partition-balanced counts.
FAMILIES = (
    "cloud-monitoring",
    "overlay",
    "rowbatch-age",
    "rowbatch-age+rate",
    "rowbatch-age+rate+fast-up",
    "keda-lag",
    "rowbatch-lag",
    "rowbatch-lag+rate",
)


def scenario(family: str, p: Params, setting: float | None = None) -> Scenario:
    """``family`` at ``setting`` (default: the manifests' target, or ``target_latency_s``)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown signal {family!r}; choose from {', '.join(FAMILIES)}")
    broker: Broker = "kafka" if "-lag" in family else "pubsub"
    fleet = p.fleet(broker)
    top = p.max_replicas(broker)
    fast_up = broker == "kafka" or family.endswith("+fast-up")
    behavior = KEDA_OVERLAY_BEHAVIOR if fast_up else PUBSUB_OVERLAY_BEHAVIOR
    make: SignalFactory
    if family in ("cloud-monitoring", "overlay"):
        value, name = (p.hpa_messages_per_pod if setting is None else setting), "messages/pod"

        def make(delayed: Callable[[Delay], Delayed]) -> Signal:
            backlog = UndeliveredMessages(value, delayed(CLOUD_MONITORING))
            if family == "cloud-monitoring":
                return backlog
            inflight = InflightMessages(
                p.inflight_per_pod, p.max_messages, delayed(PROMETHEUS), delayed(PROMETHEUS)
            )
            return Either((backlog, inflight))

    elif family == "keda-lag":
        value, name = (p.keda_lag_threshold if setting is None else setting), "lagThreshold"
        polling = keda(p.keda_polling_s)

        def make(delayed: Callable[[Delay], Delayed]) -> Signal:
            cap = None if p.keda_allow_idle_consumers else p.partitions
            return KedaLag(value, cap, delayed(polling))

    else:
        value, name = (p.target_latency_s if setting is None else setting), "target_latency_s"
        formula = DesiredFormula(
            broker,
            value,
            fleet.rows_per_s_per_replica,
            min(top, fleet.useful_replicas()),
            with_rate="+rate" in family,
            partitions=fleet.partitions,
        )

        def make(delayed: Callable[[Delay], Delayed]) -> Signal:
            return DesiredReplicas(formula, delayed(PROMETHEUS))

    return Scenario(family, broker, value, name, fleet, behavior, top, make)


def sweep_settings(family: str, p: Params) -> tuple[float, ...]:
    """The settings the sweep tries for ``family``: the manifests' target x 1/8..2, or
    ``target_latency_s`` values up to the latency objective."""
    if family in ("cloud-monitoring", "overlay"):
        base = p.hpa_messages_per_pod
    elif family == "keda-lag":
        base = p.keda_lag_threshold
    else:
        return tuple(t for t in (10.0, 15.0, 20.0, 30.0) if t <= p.latency_objective_s) or (
            p.latency_objective_s,
        )
    return tuple(float(round(base * k)) for k in (0.125, 0.25, 0.5, 1.0, 2.0))
