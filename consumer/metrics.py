"""Prometheus metrics, in their own collector registry (one per consumer, so tests and several
consumers in one process do not collide). Names are documented in the README."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)


def _size_buckets() -> tuple[float, ...]:
    return tuple(float(2**i) for i in range(0, 13))


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.messages_in = Counter(
            "rowbatch_messages_received", "Messages taken from the source", registry=r
        )
        self.messages_acked = Counter(
            "rowbatch_messages_acked", "Messages acked after all rows were written", registry=r
        )
        self.messages_nacked = Counter(
            "rowbatch_messages_nacked", "Messages given back for redelivery", registry=r
        )
        self.dead_lettered = Counter(
            "rowbatch_messages_dead_lettered",
            "Messages sent to the dead-letter topic",
            ["reason"],
            registry=r,
        )
        self.rows_in = Counter("rowbatch_rows_received", "Rows decoded", registry=r)
        self.rows_written = Counter("rowbatch_rows_written", "Result rows written", registry=r)
        self.batch_size = Histogram(
            "rowbatch_batch_rows", "Rows per inference batch", buckets=_size_buckets(), registry=r
        )
        self.batch_fill = Histogram(
            "rowbatch_batch_fill_ratio",
            "Rows per batch / target batch size",
            buckets=_FILL_BUCKETS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "rowbatch_inference_seconds",
            "Inference call latency (successful calls)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_errors = Counter(
            "rowbatch_inference_errors", "Failed inference calls", ["kind"], registry=r
        )
        self.sink_seconds = Histogram(
            "rowbatch_sink_write_seconds",
            "Sink write latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end_seconds = Histogram(
            "rowbatch_end_to_end_seconds",
            "Publish time to result written, per message",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inflight_bytes = Gauge(
            "rowbatch_inflight_bytes", "Bytes held against the memory budget", registry=r
        )
        self.budget_bytes = Gauge("rowbatch_budget_bytes", "The memory budget", registry=r)
        self.inflight_messages = Gauge(
            "rowbatch_inflight_messages", "Messages taken but not yet settled", registry=r
        )
        self.inflight_batches = Gauge(
            "rowbatch_inflight_batches", "Batches sent and not yet written", registry=r
        )
        self.paused = Gauge(
            "rowbatch_paused",
            "1 while consumption is paused (backing off, or the budget is full)",
            ["why"],
            registry=r,
        )
        self.backoffs = Counter(
            "rowbatch_backoff_periods", "Times the server asked us to back off", registry=r
        )
        self.target_batch_size = Gauge(
            "rowbatch_target_batch_size", "Batch size aimed at", registry=r
        )
