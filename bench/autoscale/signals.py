"""The scaling signals the simulator compares, each as the HPA sees it: the metric's value
when it was sampled, the delay before the HPA can read it, and the HPA metric spec it feeds
(the replica proposal per sync). rowbatch's figures come from
:mod:`rowbatch.consumer.observe.scaling` (``fleet_replicas``, ``replicas_needed``, ``balanced``),
the functions the consumers export them with."""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from bench.autoscale.hpa import external_average_value, pods_average_value
from rowbatch.consumer.observe.scaling import balanced, fleet_replicas, replicas_needed

__all__ = [
    "CLOUD_MONITORING",
    "PROMETHEUS",
    "Delay",
    "Delayed",
    "DesiredFormula",
    "DesiredReplicas",
    "Either",
    "Formula",
    "KedaLag",
    "Observation",
    "ReplicaLoad",
    "Signal",
    "UndeliveredMessages",
    "balanced",
    "keda",
]


@dataclass(frozen=True)
class Observation:
    """What the metrics could report at the end of second ``t``."""

    t: int
    backlog_messages: float
    """Messages (records) the broker counts as not done: Pub/Sub's undelivered messages,
    Kafka's lag. Those waiting, plus those written but not yet acked or committed."""
    oldest_age_s: float
    """Age of the oldest row not yet written (on Pub/Sub, what messages are received at)."""
    arrival_rows_per_s: float
    """Rows published per second, mean of the last minute."""
    written_rows_per_s: float
    """Rows written per second by the group, mean of the last minute."""
    rows_per_message: float
    """Mean rows per message (record) published so far."""
    ready: int
    """Replicas started (reporting metrics)."""
    server_saturated: bool = False
    """The model server set the pace in second ``t`` (:meth:`FleetParams.server_saturated`):
    what ``rowbatch_server_saturated`` reports, before the consumers read it."""


@dataclass(frozen=True)
class Delay:
    """A metric sampled every ``period_s`` and readable ``delay_min_s..delay_max_s`` after
    the sample (uniform, seeded)."""

    name: str
    period_s: int
    delay_min_s: float
    delay_max_s: float


#: ``pubsub.googleapis.com/subscription/num_undelivered_messages``: sampled every 60 s,
#: reaches the HPA through the Stackdriver adapter 2-4 minutes late.
CLOUD_MONITORING = Delay("Cloud Monitoring", 60, 120, 240)
#: rowbatch's gauges through Prometheus (15 s scrape) and the Prometheus adapter: 15-30 s old.
PROMETHEUS = Delay("Prometheus adapter", 15, 15, 15)


def keda(polling_interval_s: int) -> Delay:
    """KEDA's kafka scaler: lag read every ``pollingInterval``."""
    return Delay(f"KEDA, polled every {polling_interval_s} s", polling_interval_s, 0, 0)


@dataclass
class Delayed:
    """Sample-and-hold of one metric, read through its :class:`Delay`."""

    delay: Delay
    rng: random.Random
    pending: deque[tuple[float, int, float]] = field(default_factory=deque)
    sampled_at: int = -1
    value: float | None = None

    def offer(self, t: int, value: float) -> None:
        if t % self.delay.period_s:
            return
        lag = self.rng.uniform(self.delay.delay_min_s, self.delay.delay_max_s)
        self.pending.append((t + lag, t, value))

    def read(self, t: float) -> float | None:
        still: deque[tuple[float, int, float]] = deque()
        for visible_at, sampled_at, value in self.pending:
            if visible_at > t:
                still.append((visible_at, sampled_at, value))
            elif sampled_at > self.sampled_at:
                self.sampled_at, self.value = sampled_at, value
        self.pending = still
        return self.value


class Signal(Protocol):
    """One way of feeding the HPA."""

    def observe(self, obs: Observation) -> None:
        """The state at the end of a second (sampled when its metric is due)."""

    def proposals(self, t: int, current: int) -> list[int]:
        """The HPA's per-metric replica proposals at a sync (none while nothing is readable)."""


@dataclass
class UndeliveredMessages:
    """Cloud Monitoring's ``num_undelivered_messages`` as an External metric, ``AverageValue``
    ``target_per_pod`` messages."""

    target_per_pod: float
    metric: Delayed

    def observe(self, obs: Observation) -> None:
        self.metric.offer(obs.t, obs.backlog_messages)

    def proposals(self, t: int, current: int) -> list[int]:
        value = self.metric.read(t)
        if value is None:
            return []
        return [external_average_value(value, self.target_per_pod, current)]


@dataclass
class KedaLag:
    """KEDA's kafka scaler: the group's total lag (records) as an External metric with
    ``AverageValue`` ``lag_threshold``; capped at ``partitions x lag_threshold`` with
    ``allowIdleConsumers: false`` (``partitions`` given), so the HPA's proposal never exceeds
    the partitions."""

    lag_threshold: float
    partitions: int | None
    metric: Delayed

    def observe(self, obs: Observation) -> None:
        lag = obs.backlog_messages
        if self.partitions is not None:
            lag = min(lag, self.partitions * self.lag_threshold)
        self.metric.offer(obs.t, lag)

    def proposals(self, t: int, current: int) -> list[int]:
        value = self.metric.read(t)
        return [] if value is None else [external_average_value(value, self.lag_threshold, current)]


@dataclass(frozen=True)
class DesiredFormula:
    """rowbatch's figure over a backlog in rows, as the consumers compute it.

    - ``kafka``: lag (records) x mean rows per record, as the Kafka source computes it;
    - ``pubsub``: the age of the rows being received x the rate they are received at (Little's
      law: what waits is what arrived during the wait), the subscribers' view of their backlog
      (summed over them: they receive what the group writes);
    - ``with_rate``: adds the group's written rows/s, so the figure asks for the replicas that
      keep up with what is written plus those that drain the backlog within the target
      (``ceil(backlog / (T x r) + written / r)``), rather than 1 whenever the backlog is
      empty; on Kafka it also rounds up to a count that spreads the partitions evenly
      (``ceil(P / floor(P / n))``: 12 partitions drain no faster with 7..11 members than
      with 6).

    Capped at ``max_replicas`` (the partitions on Kafka, and the replicas the model server can
    feed: the consumers count only the rate term while the server is full, which comes to
    the same)."""

    broker: str
    target_latency_s: float
    rows_per_s_per_replica: float
    max_replicas: int
    with_rate: bool = False
    partitions: int | None = None

    def backlog_rows(self, obs: Observation) -> float:
        if self.broker == "kafka":
            return obs.backlog_messages * obs.rows_per_message
        return obs.oldest_age_s * obs.written_rows_per_s

    def needed(self, obs: Observation) -> float:
        """The replicas needed, unrounded (:func:`replicas_needed`), at most the cap."""
        written = obs.written_rows_per_s if self.with_rate else 0.0
        need = replicas_needed(
            self.backlog_rows(obs), written, self.target_latency_s, self.rows_per_s_per_replica
        )
        return min(float(self.max_replicas), need)

    def __call__(self, obs: Observation) -> int:
        """The figure (:func:`fleet_replicas`)."""
        return fleet_replicas(
            self.backlog_rows(obs),
            obs.written_rows_per_s if self.with_rate else 0.0,
            self.target_latency_s,
            self.rows_per_s_per_replica,
            self.max_replicas,
            partitions=self.partitions if self.with_rate else None,
        )


class Formula(Protocol):
    """A figure the consumers export: :class:`DesiredFormula`, or one with state
    (``bench.autoscale.consumer_figure``). Called once a second, in order."""

    def needed(self, obs: Observation) -> float:
        """The replicas needed, unrounded (``rowbatch_replica_load`` summed)."""

    def __call__(self, obs: Observation) -> int:
        """The figure (``rowbatch_desired_replicas``)."""


@dataclass
class DesiredReplicas:
    """``max(rowbatch_desired_replicas)`` over the replicas as an External metric with
    ``AverageValue`` 1 (so the HPA's proposal is the figure itself, within the tolerance)."""

    formula: Formula
    metric: Delayed

    def observe(self, obs: Observation) -> None:
        self.metric.offer(obs.t, self.formula(obs))

    def proposals(self, t: int, current: int) -> list[int]:
        value = self.metric.read(t)
        return [] if value is None else [external_average_value(value, 1, current)]


@dataclass
class ReplicaLoad:
    """``rowbatch_replica_load`` as a Pods metric with ``AverageValue`` 1: each started
    replica reports its share of the need (here the fleet's need over the started replicas),
    so the HPA's ``ceil(current x mean)`` is the fleet's need; starting pods count as the Pods
    algorithm counts them."""

    formula: Formula
    metric: Delayed
    reporting: Delayed

    def observe(self, obs: Observation) -> None:
        needed = self.formula.needed(obs)  # every second: a formula with state sees each one
        self.metric.offer(obs.t, needed / obs.ready if obs.ready else 0.0)
        self.reporting.offer(obs.t, obs.ready)

    def proposals(self, t: int, current: int) -> list[int]:
        per_pod, reporting = self.metric.read(t), self.reporting.read(t)
        if per_pod is None or reporting is None:
            return []
        count = min(int(reporting), current)
        got = pods_average_value([per_pod] * count, current - count, 1.0)
        return [] if got is None else [got]


@dataclass
class Either:
    """Several metrics in one HPA: it takes the largest proposal."""

    signals: tuple[Signal, ...]

    def observe(self, obs: Observation) -> None:
        for s in self.signals:
            s.observe(obs)

    def proposals(self, t: int, current: int) -> list[int]:
        return [p for s in self.signals for p in s.proposals(t, current)]
