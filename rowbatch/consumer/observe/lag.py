"""Kafka consumer-group lag, the backlog-only replica count, and the throughput meter.

Lag of a partition = its log end offset minus the group's committed offset (records published
and not yet done by the group). The Kafka source measures it for *every* partition of its
topic, not only its own, so each replica exports the whole group's view: aggregate across
replicas with ``max by (topic, partition)``, not ``sum``.

The backlog term of the autoscaling rule (DESIGN.md, Scale-out)::

    desired = ceil(backlog_rows / (target_latency_s * rows_per_s_per_replica))

capped (for Kafka by the partition count: a group never has more busy members than
partitions) and at least 1. ``backlog_rows`` is the record lag times the mean rows per record
(from the ``rowbatch-row-count`` header of records seen); ``rows_per_s_per_replica`` is either
configured (what one replica sustains, measured once) or measured by :class:`ThroughputMeter`
while this replica is saturated. ``rowbatch/consumer/observe/scaling.py`` adds the rate term and the
safeguards the exported ``rowbatch_desired_replicas`` has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


def partition_lag(
    end_offsets: Mapping[int, int],
    committed: Mapping[int, int | None],
    start_offsets: Mapping[int, int] | None = None,
) -> dict[int, int]:
    """Records not yet done per partition. A partition without a committed offset counts
    from its log start when ``start_offsets`` is given (``auto_offset_reset=earliest``: the
    group will read it all), else as 0 (``latest``: the group will skip to the end)."""
    out: dict[int, int] = {}
    for partition, end in end_offsets.items():
        done = committed.get(partition)
        if done is None:
            done = end if start_offsets is None else start_offsets.get(partition, end)
        out[partition] = max(0, end - done)
    return out


def desired_replicas(
    backlog_rows: float,
    target_latency_s: float,
    rows_per_s_per_replica: float,
    max_replicas: int,
    min_replicas: int = 1,
) -> int:
    """``ceil(backlog_rows / (target_latency_s * rows_per_s_per_replica))`` within
    ``min_replicas..max_replicas`` (the partition count, for Kafka)."""
    if target_latency_s <= 0 or rows_per_s_per_replica <= 0:
        raise ValueError(
            f"target_latency_s and rows_per_s_per_replica must be > 0, not "
            f"{target_latency_s} and {rows_per_s_per_replica}"
        )
    want = math.ceil(max(0.0, backlog_rows) / (target_latency_s * rows_per_s_per_replica))
    return max(min_replicas, min(max(max_replicas, min_replicas), want))


@dataclass
class ThroughputMeter:
    """Rows/s one replica sustains: an exponentially weighted mean of the rate measured over
    windows in which the replica was *busy* (it had records in hand at every sample of the
    window). Idle windows leave it unchanged. Under light load this measures the arrival
    rate, a lower bound of the capacity; once a backlog builds the replica is saturated and
    the estimate rises to its capacity within a few windows. Configure
    ``rows_per_s_per_replica`` (from a benchmark) to use a fixed figure instead."""

    alpha: float = 0.3
    min_window_s: float = 1.0
    estimate: float | None = None
    _rows: float = field(default=0.0, init=False)
    _since: float | None = field(default=None, init=False)
    _busy_all_window: bool = field(default=True, init=False)

    def done(self, rows: float) -> None:
        """``rows`` more rows were durably written (or dead-lettered)."""
        self._rows += rows

    def sample(self, now: float, busy: bool) -> float | None:
        """Called periodically; ``busy``: work was waiting at this moment. A window counts
        only when every sample in it was busy. Returns the current estimate."""
        if self._since is None:
            self._since, self._rows, self._busy_all_window = now, 0.0, busy
            return self.estimate
        self._busy_all_window &= busy
        elapsed = now - self._since
        if elapsed < self.min_window_s:
            return self.estimate
        if self._busy_all_window and self._rows > 0:
            rate = self._rows / elapsed
            self.estimate = (
                rate
                if self.estimate is None
                else self.alpha * rate + (1 - self.alpha) * self.estimate
            )
        self._since, self._rows, self._busy_all_window = now, 0.0, busy
        return self.estimate


class LagGauges:
    """The lag metrics, registered in the consumer's registry (names in docs/observability.md):

    - ``rowbatch_kafka_lag{topic,partition}``: end offset - committed offset;
    - ``rowbatch_kafka_lag_total{topic}``: their sum;
    - ``rowbatch_kafka_backlog_rows{topic}``: lag x mean rows per record;
    - ``rowbatch_kafka_lag_updated_timestamp_seconds{topic}``: when they were last read (the
      autoscaling signal's freshness: ``time() - ...`` is its age);
    - ``rowbatch_kafka_lag_read_failures_total{topic}``: reads that failed.

    The replica count they call for is ``ScalingGauges``'
    (``rowbatch/consumer/observe/scaling.py``)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Gauge(
            "rowbatch_kafka_lag",
            "Kafka records not yet done by the group: log end offset - committed offset",
            ["topic", "partition"],
            registry=registry,
        )
        self.lag_total = Gauge(
            "rowbatch_kafka_lag_total",
            "Sum of rowbatch_kafka_lag over the topic's partitions",
            ["topic"],
            registry=registry,
        )
        self.backlog_rows = Gauge(
            "rowbatch_kafka_backlog_rows",
            "Kafka lag in rows (records x mean rows per record)",
            ["topic"],
            registry=registry,
        )
        self.updated = Gauge(
            "rowbatch_kafka_lag_updated_timestamp_seconds",
            "Unix time of the last successful read of the topic's lag (time() minus it is the "
            "age of rowbatch_kafka_lag and of the Kafka rowbatch_desired_replicas)",
            ["topic"],
            registry=registry,
        )
        self.read_failures = Counter(
            "rowbatch_kafka_lag_read_failures",
            "Reads of the topic's lag (end and committed offsets) that failed",
            ["topic"],
            registry=registry,
        )

    def update(
        self, topic: str, lags: Mapping[int, int], backlog_rows: float, *, now: float
    ) -> None:
        """A successful read at ``now`` (Unix seconds)."""
        for partition, lag in lags.items():
            self.lag.labels(topic, str(partition)).set(lag)
        self.lag_total.labels(topic).set(sum(lags.values()))
        self.backlog_rows.labels(topic).set(backlog_rows)
        self.updated.labels(topic).set(now)


__all__ = ["LagGauges", "ThroughputMeter", "desired_replicas", "partition_lag"]
