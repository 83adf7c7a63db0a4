"""The autoscaling signal on the real Pub/Sub emulator, Triton and SQLite: a backlog published
before the consumer starts is received late, and /metrics says so within seconds
(``rowbatch_receive_age_seconds``), asks for more replicas while it drains
(``rowbatch_replica_load``, ``rowbatch_desired_replicas``, with a low
``rows_per_s_per_replica``), and comes back to the minimum once it is drained."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until

CHUNKS = 60
ROWS = 500
WAITED_S = 2.0
"""The backlog waits this long in the subscription before the consumer starts."""


def chunks() -> list[EncodedChunk]:
    rng = np.random.default_rng(14)
    out = []
    for n in range(CHUNKS):
        cols = {
            "id": np.arange(n * ROWS, (n + 1) * ROWS, dtype=np.int64),
            "features": rng.normal(size=(ROWS, 16)).astype(np.float32),
            "count": rng.integers(0, 1000, size=ROWS).astype(np.int64),
        }
        out.append(encode_chunk("events", cols, "arrow", f"signal-{n}"))
    return out


def config(topics: Topics, triton: TritonEndpoint, tmp_path: Path) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "subscription": topics.subscription,
                "dead_letter_topic": topics.dlq_topic,
                "max_lease_extension_s": 10,
                # what one replica "sustains": far below what it does, so the backlog asks
                # for several
                "rows_per_s_per_replica": 200.0,
                "target_latency_s": 2.0,
                "rate_window_s": 3.0,
            },
            # A model that takes a fixed 8 ms + 20 us a row, one 64-row request at a time:
            # ~7,000 rows/s, so the backlog takes seconds to drain.
            "model": {
                "url": triton.grpc_url,
                "name": "fixed_latency",
                "batch_size": 64,
                "max_in_flight": 1,
                "max_wait_ms": 50,
            },
            "binding": {
                "inputs": {"features": "FEATURES", "count": "COUNT"},
                "outputs": {"SCORE": "score"},
                "passthrough": {"id": "int64"},
            },
            "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"},
            "server": {"host": "127.0.0.1", "port": 0},
            "log_format": "text",
        }
    )


def scrape(port: int) -> dict[str, float]:
    """/metrics as ``{sample name: value}`` (unlabelled samples, and histogram sums/counts)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.labels
    }


@pytest.mark.timeout(120)
async def test_a_pubsub_backlog_shows_in_the_age_and_the_desired_replicas(
    topics: Topics, triton: TritonEndpoint, tmp_path: Path
) -> None:
    total = CHUNKS * ROWS
    topics.publish(chunks())
    published_at = time.monotonic()
    await asyncio.sleep(WAITED_S)
    async with consumer_running(config(topics, triton, tmp_path)) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        began = time.monotonic()
        port = run.running[0].health.port
        peak_desired = peak_load = 0.0
        seen: dict[str, float] = {}
        while time.monotonic() - began < 40:
            seen = await asyncio.to_thread(scrape, port)
            peak_desired = max(peak_desired, seen.get("rowbatch_desired_replicas", 0.0))
            peak_load = max(peak_load, seen.get("rowbatch_replica_load", 0.0))
            if seen.get("rowbatch_rows_written_total") == total:
                break
            await asyncio.sleep(0.25)
        drained_s = time.monotonic() - began
        assert seen.get("rowbatch_rows_written_total") == total, "the backlog did not drain"

        # Every message was received at least WAITED_S after it was published, and no
        # later than this test has been running.
        count = seen["rowbatch_receive_age_seconds_count"]
        mean_age = seen["rowbatch_receive_age_seconds_sum"] / count
        assert count == CHUNKS
        assert WAITED_S <= mean_age <= time.monotonic() - published_at
        # Draining ~thousands of rows/s against a configured 200 per replica: several.
        assert peak_desired > 1
        assert peak_load > 1

        # Drained: within the rate window (3 s) plus a few ticks, back to the minimum. What is
        # waited for is everything asserted next: desired replicas is 1 as soon as the load is
        # at most 1, so waiting for it alone and asserting a load of 0 raced the rate window.
        def idle(now: dict[str, float]) -> bool:
            return (
                now["rowbatch_desired_replicas"] == 1
                and now["rowbatch_replica_load"] == 0
                and now["rowbatch_oldest_unwritten_age_seconds"] == 0
            )

        async def settled() -> dict[str, float]:
            deadline = time.monotonic() + 15
            while True:
                now = await asyncio.to_thread(scrape, port)
                if idle(now) or time.monotonic() > deadline:
                    return now
                await asyncio.sleep(0.25)

        after = await settled()
        assert after["rowbatch_desired_replicas"] == 1
        assert after["rowbatch_replica_load"] == 0
        assert after["rowbatch_oldest_unwritten_age_seconds"] == 0
        assert after["rowbatch_rows_per_s_per_replica"] == 200
        await run.stop_and_wait()
    print(
        f"\n{total} rows waited {WAITED_S:g} s, drained in {drained_s:.1f} s: mean receive age "
        f"{mean_age:.1f} s, peak replica load {peak_load:.1f}, peak desired replicas "
        f"{peak_desired:g}, back to 1 after the drain"
    )
