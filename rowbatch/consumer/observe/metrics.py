"""Prometheus metrics, in their own collector registry (one per consumer, so tests and several
consumers in one process do not collide). Names: docs/observability.md."""

from __future__ import annotations

import bisect
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rowbatch.consumer.observe.memory import MemoryCollector
from rowbatch.consumer.observe.scaling import ScalingGauges
from rowbatch.wire.dead_letter import ReasonClass

#: ``rowbatch_messages_dead_lettered_total{reason}``: the dead-letter reason classes.
DEAD_LETTER_REASONS = tuple(reason.value for reason in ReasonClass)
#: ``rowbatch_inference_errors_total{kind}``: the gRPC status of a failed call, lower-case with
#: dashes (``unavailable``, ``not-found``, ...), ``connection`` for a failed connection, or
#: ``other``.
INFERENCE_ERROR_KINDS = (
    "unavailable",
    "resource-exhausted",
    "deadline-exceeded",
    "not-found",
    "invalid-argument",
    "connection",
    "http",
    "other",
)
SINK_ERROR_KINDS = ("unavailable", "rejected", "fatal")
PAUSE_REASONS = ("backoff", "budget")

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_FILL_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1.0)
_AGE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)


def observe_many(histogram: Histogram, values: Sequence[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``, with one update of its sum and of
    each bucket hit (a vector of messages costs a few locked updates, not one per message).
    Relies on the client's bucket layout (``_upper_bounds``, ``_buckets``, ``_sum``, as in
    prometheus_client 0.20 to 0.26); without it, observes one by one."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if len(values) < 2 or bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value)
        return
    histogram._raise_if_not_observable()  # type: ignore[no-untyped-call]
    total.inc(sum(values))
    # observe() counts a value in the first bucket whose bound is >= it (bisect_left), and
    # NaN in none.
    hits = Tally(bisect.bisect_left(bounds, v) for v in values if v == v)  # noqa: PLR0124
    for index, count in hits.items():
        buckets[index].inc(count)


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
        self.rows_dead_lettered = Counter(
            "rowbatch_rows_dead_lettered",
            "Rows that failed on their own, sent to the dead-letter topic as row parts of their "
            "message (the message's other rows written, the message acked)",
            ["reason"],
            registry=r,
        )
        self.rows_errored = Counter(
            "rowbatch_rows_errored",
            "Rows that failed on their own, written as error rows (null outputs, the error "
            'columns; on_row_error = "error-row")',
            ["reason"],
            registry=r,
        )
        self.rows_in = Counter("rowbatch_rows_received", "Rows decoded", registry=r)
        self.rows_written = Counter(
            "rowbatch_rows_written",
            "Result rows stored (rows already in the table are not counted again)",
            registry=r,
        )
        self.rows_duplicate = Counter(
            "rowbatch_rows_duplicate",
            "Result rows a write skipped because their key was in the table already "
            "(a redelivered or re-sent chunk)",
            registry=r,
        )
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
            "rowbatch_inference_errors",
            "Failed inference calls (every attempt, transient ones included), by kind",
            ["kind"],
            registry=r,
        )
        self.sink_errors = Counter(
            "rowbatch_sink_errors",
            "Failed sink writes: unavailable (retried), rejected (bisected), fatal",
            ["kind"],
            registry=r,
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
        self.receive_age_seconds = Histogram(
            "rowbatch_receive_age_seconds",
            "Publish time to taken by the pipeline, per message: how long it waited in the "
            "broker (on Pub/Sub the backlog a subscriber sees)",
            buckets=_AGE_BUCKETS,
            registry=r,
        )
        self.oldest_unwritten_age = Gauge(
            "rowbatch_oldest_unwritten_age_seconds",
            "Age (now - publish time) of the oldest message taken and not yet settled; 0 when "
            "none is",
            registry=r,
        )
        self.scaling = ScalingGauges(r)
        """``rowbatch_desired_replicas``, ``rowbatch_replica_load``,
        ``rowbatch_rows_per_s_per_replica``."""
        self.inflight_bytes = Gauge(
            "rowbatch_inflight_bytes", "Bytes held against the memory budget", registry=r
        )
        self.budget_bytes = Gauge("rowbatch_budget_bytes", "The memory budget", registry=r)
        self.read_ahead_bytes = Gauge(
            "rowbatch_read_ahead_bytes",
            "What the source holds read ahead of the pipeline (fetched or pulled, not yet "
            "taken), held in the memory budget",
            registry=r,
        )
        self.write_bytes = Gauge(
            "rowbatch_write_bytes",
            "Bytes the sink writes in progress hold besides the outputs they write (joined "
            "batches, encode buffers), reserved in the memory budget",
            registry=r,
        )
        r.register(MemoryCollector())
        self.inflight_messages = Gauge(
            "rowbatch_inflight_messages", "Messages taken but not yet settled", registry=r
        )
        self.awaiting_commit = Gauge(
            "rowbatch_messages_awaiting_commit",
            "Messages whose rows are all written to a committing sink (Iceberg), waiting "
            "for the commit that makes them part of the table before they are acked",
            registry=r,
        )
        self.inflight_batches = Gauge(
            "rowbatch_inflight_batches", "Inference requests in flight", registry=r
        )
        self.write_queue_batches = Gauge(
            "rowbatch_write_queue_batches",
            "Batches answered by the model and waiting for (or in) a sink write",
            registry=r,
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
        self.endpoint_requests = Counter(
            "rowbatch_endpoint_requests",
            "Inference requests sent, per model-server endpoint",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_errors = Counter(
            "rowbatch_endpoint_errors",
            "Failed inference requests, per model-server endpoint and kind",
            ["endpoint", "kind"],
            registry=r,
        )
        self.endpoint_inflight = Gauge(
            "rowbatch_endpoint_inflight_batches",
            "Inference requests in flight, per model-server endpoint",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_healthy = Gauge(
            "rowbatch_endpoint_healthy",
            "1 while the model-server endpoint takes requests",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_rows = Counter(
            "rowbatch_endpoint_rows",
            "Rows answered, per model-server endpoint",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_window = Gauge(
            "rowbatch_endpoint_window",
            "Requests allowed in flight now, per endpoint whose window moves (the concurrency "
            "window: shrunk by 429/503/RESOURCE_EXHAUSTED and by the server's queue, grown "
            "while that queue is below its target)",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_server_waiting = Gauge(
            "rowbatch_endpoint_server_waiting",
            "Requests waiting in the server's own queue, as it last said "
            "(vllm:num_requests_waiting; Triton: mean over the last reading of its statistics)",
            ["endpoint"],
            registry=r,
        )
        self.endpoint_server_queue = Gauge(
            "rowbatch_endpoint_server_queue_seconds",
            "Mean time a request waited in the server's queue over the last reading of its "
            "statistics (Triton), per endpoint",
            ["endpoint"],
            registry=r,
        )
        self.server_saturated = Gauge(
            "rowbatch_server_saturated",
            "1 while the server runs full with requests waiting in its queue: the server, not "
            "the consumers, limits the flow (more consumers would only wait there)",
            ["endpoint"],
            registry=r,
        )
        self.tokens = Counter(
            "rowbatch_model_tokens",
            "Tokens the OpenAI-compatible server counted (its usage), prompt or completion",
            ["kind"],
            registry=r,
        )
        # Every labelled series exists from the start (at 0), so alerts and dashboards see 0
        # rather than nothing.
        for reason in DEAD_LETTER_REASONS:
            self.dead_lettered.labels(reason)
            self.rows_dead_lettered.labels(reason)
            self.rows_errored.labels(reason)
        for kind in INFERENCE_ERROR_KINDS:
            self.inference_errors.labels(kind)
        for kind in SINK_ERROR_KINDS:
            self.sink_errors.labels(kind)
        for why in PAUSE_REASONS:
            self.paused.labels(why).set(0)
        for kind in ("prompt", "completion"):
            self.tokens.labels(kind)

    def endpoint(self, address: str) -> EndpointMetrics:
        """The per-endpoint series of ``address`` (created at 0)."""
        return EndpointMetrics(self, address)


class EndpointMetrics:
    """One model-server endpoint's series, looked up once (a request costs a few increments,
    not label lookups)."""

    def __init__(self, metrics: Metrics, address: str) -> None:
        self._metrics = metrics
        self.address = address
        self._requests = metrics.endpoint_requests.labels(address)
        self._errors = {
            k: metrics.endpoint_errors.labels(address, k) for k in INFERENCE_ERROR_KINDS
        }
        self._inflight = metrics.endpoint_inflight.labels(address)
        self._healthy = metrics.endpoint_healthy.labels(address)
        self._rows = metrics.endpoint_rows.labels(address)
        self._inflight.set(0)
        self._healthy.set(0)
        self._window = metrics.endpoint_window.labels(address)
        self._waiting = metrics.endpoint_server_waiting.labels(address)
        self._queue_s = metrics.endpoint_server_queue.labels(address)
        self._saturated = metrics.server_saturated.labels(address)
        self._saturated.set(0)

    def sent(self) -> None:
        self._requests.inc()

    def answered(self, rows: int) -> None:
        self._rows.inc(rows)

    def failed(self, kind: str) -> None:
        self._errors.get(kind, self._errors["other"]).inc()

    def in_flight(self, requests: int) -> None:
        self._inflight.set(requests)

    def healthy(self, up: bool) -> None:
        self._healthy.set(1 if up else 0)

    def window(self, requests: int) -> None:
        self._window.set(requests)

    def server_waiting(self, requests: float) -> None:
        self._waiting.set(requests)

    def server_queue_seconds(self, seconds: float) -> None:
        self._queue_s.set(seconds)

    def saturated(self, full: bool) -> None:
        self._saturated.set(1 if full else 0)

    def forget(self) -> None:
        """Remove every series labelled with this endpoint, from every family (the balancer
        dropped it: gone from DNS, its last request answered). Later calls on this object no
        longer reach the registry; :meth:`Metrics.endpoint` for the same address starts its
        series again at 0."""
        m = self._metrics
        for family in (
            m.endpoint_requests,
            m.endpoint_inflight,
            m.endpoint_healthy,
            m.endpoint_rows,
            m.endpoint_window,
            m.endpoint_server_waiting,
            m.endpoint_server_queue,
            m.server_saturated,
        ):
            family.remove(self.address)
        for kind in INFERENCE_ERROR_KINDS:
            m.endpoint_errors.remove(self.address, kind)
