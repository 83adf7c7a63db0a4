"""The saturation section's view of the server (``bench/saturation.py``): the ``fixed_latency``
model's timing from its config, Triton's own statistics between two instants (executions, rows,
compute time: the server's busy fraction), and the direct-client probe of the measured ceiling."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from bench.ceiling import inputs_for, run_requests
from harness.reference_models import fixed_latency_batch_s, fixed_latency_ceiling

MODEL = "fixed_latency"
"""One instance, no dynamic batching: one request is one execution (deploy/models)."""
BATCHED_MODEL = "fixed_latency_batched"
"""The same model as a team would deploy it: dynamic batching on, two instances."""
PROBE_CONCURRENCY = 4
"""Requests kept outstanding by the ceiling probe: enough to keep one instance's queue full."""
PROBE_WINDOWS = 3


def _int(value: Any) -> int:
    """gRPC JSON renders 64-bit numbers as strings and omits zeros."""
    return int(value or 0)


# --- the model and Triton's statistics --------------------------------------------------------


@dataclass(frozen=True)
class ModelTiming:
    """``fixed_latency``'s config (or a variant's): each execution of n rows lasts base_ms + n x
    per_row_us."""

    model: str
    base_ms: float
    per_row_us: float
    batch: int
    """The largest preferred batch size: what the consumer and the probe send."""
    max_batch: int
    instances: int
    dynamic_batching: bool = False

    @property
    def batch_ms(self) -> float:
        return fixed_latency_batch_s(self.batch, self.base_ms, self.per_row_us) * 1e3

    @property
    def ceiling(self) -> float:
        """The analytic ceiling in rows/s at ``batch``."""
        return fixed_latency_ceiling(self.batch, self.base_ms, self.per_row_us, self.instances)


def model_timing(url: str, model: str = MODEL) -> ModelTiming:
    client = grpcclient.InferenceServerClient(url)
    try:
        config = client.get_model_config(model, as_json=True)["config"]
    finally:
        with contextlib.suppress(Exception):
            client.close()
    params = config["parameters"]
    preferred = [
        _int(x) for x in config.get("dynamic_batching", {}).get("preferred_batch_size", [])
    ]
    max_batch = _int(config.get("max_batch_size"))
    instances = sum(_int(g.get("count", 1)) for g in config.get("instance_group", [])) or 1
    return ModelTiming(
        model,
        float(params["execute_base_ms"]["string_value"]),
        float(params["execute_per_row_us"]["string_value"]),
        max(preferred) if preferred else max_batch,
        max_batch,
        instances,
        "dynamic_batching" in config,
    )


@dataclass(frozen=True)
class Snapshot:
    at: float
    """``time.monotonic()`` when read."""
    executions: int
    rows: int
    infer_ns: int
    """``compute_infer`` summed over executions (``batch_stats``: one entry per execution; the
    per-request ``inference_stats`` would count a merged execution once per request)."""


def snapshot(url: str, model: str = MODEL) -> Snapshot:
    client = grpcclient.InferenceServerClient(url)
    try:
        [stats] = client.get_inference_statistics(model, as_json=True)["model_stats"]
    finally:
        with contextlib.suppress(Exception):
            client.close()
    infer_ns = sum(_int(b.get("compute_infer", {}).get("ns")) for b in stats.get("batch_stats", []))
    return Snapshot(
        time.monotonic(),
        _int(stats.get("execution_count")),
        _int(stats.get("inference_count")),
        infer_ns,
    )


@dataclass(frozen=True)
class ServerWindow:
    """What Triton did between two snapshots."""

    seconds: float
    executions: int
    rows: int
    infer_s: float
    instances: int

    @classmethod
    def between(cls, before: Snapshot, after: Snapshot, instances: int) -> ServerWindow:
        return cls(
            after.at - before.at,
            after.executions - before.executions,
            after.rows - before.rows,
            (after.infer_ns - before.infer_ns) / 1e9,
            instances,
        )

    @property
    def mean_batch(self) -> float:
        return self.rows / self.executions if self.executions else 0.0

    @property
    def busy(self) -> float:
        """compute_infer time / (wall time x instances): 1.0 = never idle."""
        return self.infer_s / (self.seconds * self.instances) if self.seconds > 0 else 0.0

    @property
    def batch_ms(self) -> float:
        """Mean compute_infer time per execution."""
        return self.infer_s / self.executions * 1e3 if self.executions else 0.0


# --- the measured ceiling ---------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A direct ``tritonclient.grpc.aio`` client with pre-built tensors of ``batch`` rows."""

    round_trip_ms: float
    """Median request time at concurrency 1 (the analytic batch time plus the overheads)."""
    rows_per_s: float
    """The measured ceiling: the best window at ``PROBE_CONCURRENCY`` per instance."""
    busy: float
    mean_batch: float


async def _probe(url: str, timing: ModelTiming, step_s: float) -> Probe:
    model = timing.model
    inputs = inputs_for(model, timing.batch)
    client = aioclient.InferenceServerClient(url)
    try:
        await run_requests(client, model, inputs, 2, 0.3)  # warm-up
        times: list[float] = []
        deadline = time.monotonic() + step_s
        while time.monotonic() < deadline or len(times) < 5:
            started = time.perf_counter()
            await client.infer(model, inputs)
            times.append(time.perf_counter() - started)
        await run_requests(client, model, inputs, PROBE_CONCURRENCY * timing.instances, 0.3)
        before = await asyncio.to_thread(snapshot, url, model)
        best = 0.0
        for _ in range(PROBE_WINDOWS):
            started = time.monotonic()
            done = await run_requests(
                client, model, inputs, PROBE_CONCURRENCY * timing.instances, step_s
            )
            best = max(best, done * timing.batch / (time.monotonic() - started))
        after = await asyncio.to_thread(snapshot, url, model)
    finally:
        await client.close()
    server = ServerWindow.between(before, after, timing.instances)
    return Probe(statistics.median(times) * 1e3, best, server.busy, server.mean_batch)


def probe(url: str, timing: ModelTiming, step_s: float) -> Probe:
    return asyncio.run(_probe(url, timing, step_s))
