"""A Triton server's own view of its queue, from its model statistics (the KServe v2
``ModelStatistics`` RPC, over the channel the consumer already holds): cumulative queue and
compute nanoseconds per model. Between two readings, by Little's law, the time spent queued
divided by the wall time is the mean number of requests that waited, and the compute time the
mean number running: the queue a window follows (:mod:`rowbatch.consumer.model.admission`).

Servers that do not implement the RPC (MLServer, KServe's Python server) answer UNIMPLEMENTED:
their windows stay fixed, moved only by RESOURCE_EXHAUSTED."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(value: Any) -> int:
    """gRPC's JSON renders 64-bit numbers as strings and leaves zeros out."""
    return int(value or 0)


@dataclass(frozen=True)
class QueueTotals:
    """One model's cumulative statistics at one instant (``at``: the reader's monotonic
    clock)."""

    at: float
    requests: int
    """Requests that left the queue (``inference_stats.queue.count``)."""
    queue_ns: int
    """Time those requests spent queued, summed (``inference_stats.queue.ns``)."""
    compute_ns: int
    """Time requests spent in compute (input, infer, output), summed per request."""


def queue_totals(stats: Mapping[str, Any], model: str, at: float) -> QueueTotals | None:
    """The totals of ``model`` (every version it serves, summed) in a ModelStatistics answer
    as JSON (``get_inference_statistics(..., as_json=True)``); None when it holds none."""
    requests = queue_ns = compute_ns = 0
    found = False
    for entry in stats.get("model_stats", []):
        if entry.get("name") != model:
            continue
        found = True
        inference = entry.get("inference_stats", {})
        queue = inference.get("queue", {})
        requests += _int(queue.get("count"))
        queue_ns += _int(queue.get("ns"))
        compute_ns += sum(
            _int(inference.get(part, {}).get("ns"))
            for part in ("compute_input", "compute_infer", "compute_output")
        )
    return QueueTotals(at, requests, queue_ns, compute_ns) if found else None


@dataclass(frozen=True)
class QueueReading:
    """What the server did between two totals."""

    seconds: float
    requests: int
    waiting: float
    """Mean requests queued (queue time / wall time)."""
    running: float
    """Mean requests in compute (compute time / wall time)."""

    @property
    def queue_s(self) -> float:
        """Mean queue time per request (0 when none left the queue)."""
        return self.waiting * self.seconds / self.requests if self.requests else 0.0

    @classmethod
    def between(cls, before: QueueTotals, after: QueueTotals) -> QueueReading | None:
        """None when the totals went back (the server restarted: its counters start over) or
        no time passed."""
        seconds = after.at - before.at
        requests = after.requests - before.requests
        queued = after.queue_ns - before.queue_ns
        computed = after.compute_ns - before.compute_ns
        if seconds <= 0 or min(requests, queued, computed) < 0:
            return None
        return cls(seconds, requests, queued / 1e9 / seconds, computed / 1e9 / seconds)


__all__ = ["QueueReading", "QueueTotals", "queue_totals"]
