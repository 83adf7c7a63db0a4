"""What the benchmarks read from Triton itself: a model's preferred batch size and its own
statistics (batches executed, time per batch)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc as grpcclient


def _client(url: str) -> Any:
    return grpcclient.InferenceServerClient(url)


def preferred_batch(url: str, model: str) -> int:
    """The largest ``dynamic_batching.preferred_batch_size``, else ``max_batch_size`` (what the
    consumer aims at too)."""
    client = _client(url)
    try:
        config = client.get_model_config(model, as_json=True)["config"]
    finally:
        with contextlib.suppress(Exception):
            client.close()
    preferred = [int(x) for x in config.get("dynamic_batching", {}).get("preferred_batch_size", [])]
    return max(preferred) if preferred else int(config.get("max_batch_size", 1))


@dataclass(frozen=True)
class ServerStats:
    """Cumulative counters of one model, from Triton's statistics extension."""

    executions: int
    """Batches the model executed (after Triton's dynamic batcher merged requests)."""
    inferences: int
    """Rows (inferences) in them."""
    requests: int
    """Requests answered successfully."""
    queue_ns: int
    compute_ns: int
    """compute_input + compute_infer + compute_output."""
    failed: int = 0
    """Requests answered with an error (e.g. INVALID_ARGUMENT for rows the model rejects)."""

    def minus(self, before: ServerStats) -> ServerStats:
        return ServerStats(
            self.executions - before.executions,
            self.inferences - before.inferences,
            self.requests - before.requests,
            self.queue_ns - before.queue_ns,
            self.compute_ns - before.compute_ns,
            self.failed - before.failed,
        )

    @property
    def batch_ms(self) -> float:
        """Mean server compute time per executed batch."""
        return self.compute_ns / self.executions / 1e6 if self.executions else 0.0

    @property
    def rows_per_batch(self) -> float:
        return self.inferences / self.executions if self.executions else 0.0

    @property
    def queue_ms(self) -> float:
        """Mean time a request waited in Triton's queue."""
        return self.queue_ns / self.requests / 1e6 if self.requests else 0.0


def server_stats(url: str, model: str) -> ServerStats:
    client = _client(url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"]
    finally:
        with contextlib.suppress(Exception):
            client.close()
    total = ServerStats(0, 0, 0, 0, 0, 0)
    for entry in stats:
        inf = entry.get("inference_stats", {})

        def ns(key: str, inf: dict[str, Any] = inf) -> int:
            return int(inf.get(key, {}).get("ns", 0))

        total = ServerStats(
            total.executions + int(entry.get("execution_count", 0)),
            total.inferences + int(entry.get("inference_count", 0)),
            total.requests + int(inf.get("success", {}).get("count", 0)),
            total.queue_ns + ns("queue"),
            total.compute_ns + ns("compute_input") + ns("compute_infer") + ns("compute_output"),
            total.failed + int(inf.get("fail", {}).get("count", 0)),
        )
    return total
