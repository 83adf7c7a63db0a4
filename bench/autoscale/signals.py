"""The scaling signals the simulator compares, each as the HPA sees it: the metric's value
when it was sampled, the delay before the HPA can read it, and the HPA metric spec it feeds
(the replica proposal per sync). rowbatch's desired-replicas figure comes from
:func:`consumer.observe.lag.desired_replicas`, the function the consumers export it with."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from bench.autoscale.hpa import external_average_value, pods_average_value
from consumer.observe.lag import desired_replicas


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
class InflightMessages:
    """``rowbatch_inflight_messages`` as a Pods metric, ``AverageValue`` ``target_per_pod``:
    each started replica holds up to ``max_messages`` of the backlog (flow control)."""

    target_per_pod: float
    max_messages: int
    metric: Delayed
    reporting: Delayed

    def observe(self, obs: Observation) -> None:
        per_pod = min(self.max_messages, obs.backlog_messages / obs.ready) if obs.ready else 0.0
        self.metric.offer(obs.t, per_pod)
        self.reporting.offer(obs.t, obs.ready)

    def proposals(self, t: int, current: int) -> list[int]:
        per_pod, reporting = self.metric.read(t), self.reporting.read(t)
        if per_pod is None or reporting is None:
            return []
        count = min(int(reporting), current)
        got = pods_average_value([per_pod] * count, current - count, self.target_per_pod)
        return [] if got is None else [got]


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
    """rowbatch's ``rowbatch_desired_replicas``: :func:`desired_replicas` over a backlog in rows.

    - ``kafka``: lag (records) x mean rows per record, as the Kafka source computes it;
    - ``pubsub``: the age of the oldest row waiting x the arrival rate (Little's law: what
      waits is what arrived during the wait), the subscriber's view of its backlog;
    - ``with_rate``: adds ``target_latency_s x`` the group's written rows/s to the backlog, so
      the figure asks for the replicas that keep up with what arrives plus those that drain the
      backlog within the target (``ceil(backlog / (T x r) + written / r)``), rather than 1
      whenever the backlog is empty; on Kafka it also rounds up to a count that spreads the
      partitions evenly (``ceil(P / floor(P / n))``: 12 partitions drain no faster with 7..11
      members than with 6).

    Capped at ``max_replicas`` (the partitions on Kafka, and the replicas the model server can
    feed: more would only queue at the server)."""

    broker: str
    target_latency_s: float
    rows_per_s_per_replica: float
    max_replicas: int
    with_rate: bool = False
    partitions: int | None = None

    def __call__(self, obs: Observation) -> int:
        if self.broker == "kafka":
            backlog = obs.backlog_messages * obs.rows_per_message
        else:
            backlog = obs.oldest_age_s * obs.arrival_rows_per_s
        if self.with_rate:
            backlog += self.target_latency_s * obs.written_rows_per_s
        n = desired_replicas(
            backlog, self.target_latency_s, self.rows_per_s_per_replica, self.max_replicas
        )
        if self.with_rate and self.partitions:
            n = min(self.max_replicas, balanced(n, self.partitions))
        return n


def balanced(n: int, partitions: int) -> int:
    """The fewest members at least ``n`` that the group drains as fast with as ``n`` would
    if partitions split evenly: ``ceil(P / floor(P / n))`` (``n`` <= ``P``)."""
    n = min(max(1, n), partitions)
    return math.ceil(partitions / (partitions // n))


@dataclass
class DesiredReplicas:
    """``max(rowbatch_desired_replicas)`` over the replicas as an External metric with
    ``AverageValue`` 1 (so the HPA's proposal is the figure itself, within the tolerance)."""

    formula: DesiredFormula
    metric: Delayed

    def observe(self, obs: Observation) -> None:
        self.metric.offer(obs.t, self.formula(obs))

    def proposals(self, t: int, current: int) -> list[int]:
        value = self.metric.read(t)
        return [] if value is None else [external_average_value(value, 1, current)]


@dataclass
class Either:
    """Several metrics in one HPA: it takes the largest proposal."""

    signals: tuple[Signal, ...]

    def observe(self, obs: Observation) -> None:
        for s in self.signals:
            s.observe(obs)

    def proposals(self, t: int, current: int) -> list[int]:
        return [p for s in self.signals for p in s.proposals(t, current)]
