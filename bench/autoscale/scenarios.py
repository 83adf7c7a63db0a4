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
    KedaLag,
    ReplicaLoad,
    Signal,
    UndeliveredMessages,
    keda,
)

Broker = Literal["pubsub", "kafka"]

#: deploy/k8s/overlays/gke-pubsub/hpa.yaml: the default scale-up (max(4 pods, 100 %) per 15 s,
#: written out); down 1 pod per 60 s after 300 s.
PUBSUB_OVERLAY_BEHAVIOR = Behavior(
    scale_up=DEFAULT_BEHAVIOR.scale_up,
    scale_down=Rules(300, (Policy("Pods", 1, 60),)),
)
#: The Pub/Sub signals without ``+fast-up`` scale up by 100 % per 30 s (what the gke-pubsub
#: overlay had before the simulation), to show what the default scale-up buys.
PUBSUB_SLOW_UP_BEHAVIOR = Behavior(
    scale_up=Rules(0, (Policy("Percent", 100, 30),)),
    scale_down=PUBSUB_OVERLAY_BEHAVIOR.scale_down,
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
    """End-to-end latency the report holds each run to."""
    hpa_messages_per_pod: float = 1160
    """The gke-pubsub overlay's ``num_undelivered_messages`` ``averageValue`` (its backstop)."""
    load_per_pod: float = 1
    """The gke-pubsub overlay's ``rowbatch_replica_load`` ``averageValue``."""
    keda_lag_threshold: float = 180
    """The kafka-keda overlay's ``lagThreshold``."""
    keda_polling_s: int = 15
    """The kafka-keda overlay's ``pollingInterval`` (KEDA's default: 30)."""
    keda_allow_idle_consumers: bool = True
    """The kafka-keda overlay's ``allowIdleConsumers``: false caps the lag KEDA reports at
    partitions x ``lagThreshold``."""
    pubsub_target_latency_s: float = 10.0
    """rowbatch's Pub/Sub ``target_latency_s`` (the consumer's default and the overlay's)."""
    kafka_target_latency_s: float = 20.0
    """rowbatch's Kafka ``target_latency_s`` (the consumer's default and the overlay's)."""

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

    def target_latency_s(self, broker: Broker) -> float:
        return self.pubsub_target_latency_s if broker == "pubsub" else self.kafka_target_latency_s


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
#: - ``overlay``: the gke-pubsub overlay as deployed: ``rowbatch_replica_load`` with the rate
#:   term per pod, or that backstop, whichever asks for more, with the default scale-up;
#: - ``rowbatch-age``: ``rowbatch_replica_load`` (a Pods metric) from the age of the rows
#:   received, without the rate term;
#: - ``rowbatch-age+rate``: the same plus the rate term (see :class:`DesiredFormula`);
#: - ``rowbatch-age+rate+fast-up``: that with the HPA's default scale-up (max(4 pods, 100 %)
#:   per 15 s) instead of 100 % per 30 s (the Pub/Sub signals without it scale up so);
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
    if broker == "kafka":
        behavior = KEDA_OVERLAY_BEHAVIOR
    elif family in ("overlay", "rowbatch-age+rate+fast-up"):
        behavior = PUBSUB_OVERLAY_BEHAVIOR
    else:
        behavior = PUBSUB_SLOW_UP_BEHAVIOR
    make: SignalFactory
    if family in ("cloud-monitoring", "overlay"):
        value, name = (p.hpa_messages_per_pod if setting is None else setting), "messages/pod"
        load = DesiredFormula(
            broker,
            p.target_latency_s(broker),
            fleet.rows_per_s_per_replica,
            min(top, fleet.useful_replicas()),
            with_rate=True,
        )

        def make(delayed: Callable[[Delay], Delayed]) -> Signal:
            backlog = UndeliveredMessages(value, delayed(CLOUD_MONITORING))
            if family == "cloud-monitoring":
                return backlog
            return Either((backlog, ReplicaLoad(load, delayed(PROMETHEUS), delayed(PROMETHEUS))))

    elif family == "keda-lag":
        value, name = (p.keda_lag_threshold if setting is None else setting), "lagThreshold"
        polling = keda(p.keda_polling_s)

        def make(delayed: Callable[[Delay], Delayed]) -> Signal:
            cap = None if p.keda_allow_idle_consumers else p.partitions
            return KedaLag(value, cap, delayed(polling))

    else:
        value = p.target_latency_s(broker) if setting is None else setting
        name = "target_latency_s"
        formula = DesiredFormula(
            broker,
            value,
            fleet.rows_per_s_per_replica,
            min(top, fleet.useful_replicas()),
            with_rate="+rate" in family,
            partitions=fleet.partitions,
        )

        def make(delayed: Callable[[Delay], Delayed]) -> Signal:
            if broker == "pubsub":
                return ReplicaLoad(formula, delayed(PROMETHEUS), delayed(PROMETHEUS))
            return DesiredReplicas(formula, delayed(PROMETHEUS))

    return Scenario(family, broker, value, name, fleet, behavior, top, make)


def sweep_settings(family: str, p: Params) -> tuple[float, ...]:
    """The settings the sweep tries for ``family``: the manifests' backlog target x 1/16..1,
    their ``lagThreshold`` x 1/2..8 (each was chosen at one end of such a range), or
    ``target_latency_s`` values up to the latency objective."""
    if family in ("cloud-monitoring", "overlay"):
        base, factors = p.hpa_messages_per_pod, (0.0625, 0.125, 0.25, 0.5, 1.0)
    elif family == "keda-lag":
        base, factors = p.keda_lag_threshold, (0.5, 1.0, 2.0, 4.0, 8.0)
    else:
        return tuple(t for t in (10.0, 15.0, 20.0, 30.0) if t <= p.latency_objective_s) or (
            p.latency_objective_s,
        )
    return tuple(float(round(base * k)) for k in factors)
