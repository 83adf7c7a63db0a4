"""One consumer feeding two real tritonservers: throughput near the sum of each alone (through
grpc's ``ipv4:`` list form), a server SIGKILLed mid-run (nothing lost or dead-lettered, no
pause, the survivor takes the work, the killed one rejoins after a restart on the same port),
a slow server receiving fewer batches, and servers with different model configs refused at
start naming both.

Both servers serve ``fixed_latency`` variants from a temporary model repository (executions
sleep a fixed time, like an accelerator): ``fixed_latency`` at 60 ms per batch of up to 128 on
both; ``lagging`` at 40 ms on A and 160 ms on B; ``mismatched`` with ``max_batch_size`` 128 on
A and 64 on B.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.multi_endpoint import (
    Feed,
    backlog,
    compare,
    consumer_config,
    drain,
    measure,
    requests_per_endpoint,
    sample,
    total,
)
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.pubsub import PubSubEndpoint
from harness.service import RunDir
from harness.triton import TritonEndpoint, TritonService
from rowbatch.consumer.model.spec_match import EndpointSpecMismatch
from rowbatch.consumer.service.runner import run_consumer
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until

pytestmark = pytest.mark.timeout(300)

FAST = FixedLatency(base_ms=60.0, max_batch_size=128)
"""2,133 rows/s per server."""


class Pair:
    """Servers A and B, each a restartable tritonserver of its own."""

    def __init__(self, services: tuple[TritonService, TritonService]) -> None:
        self.services = services
        self.endpoints: list[TritonEndpoint] = []

    @property
    def urls(self) -> tuple[str, str]:
        return self.endpoints[0].grpc_url, self.endpoints[1].grpc_url


@pytest.fixture(scope="module")
def pair(run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("models")
    repos = [
        fixed_latency_repository(
            root / name,
            {
                "fixed_latency": FAST,
                "lagging": FixedLatency(base_ms=lag, max_batch_size=128),
                "mismatched": FixedLatency(base_ms=10.0, max_batch_size=batch),
            },
        )
        for name, lag, batch in (("a", 40.0, 128), ("b", 160.0, 64))
    ]
    run = RunDir(run_dir.root / f"multi-{time.monotonic_ns()}")
    services = (
        TritonService(run, repos[0], name="triton-a"),
        TritonService(run, repos[1], name="triton-b"),
    )
    pair = Pair(services)
    try:
        with ThreadPoolExecutor(2) as pool:
            pair.endpoints = list(pool.map(lambda s: s.start(), services))
        yield pair
    finally:
        for service in services:
            service.stop()


async def test_two_servers_give_near_the_sum_of_each_alone(
    pair: Pair, topics: Topics, tmp_path: Path
) -> None:
    """Also: an ``ipv4:a:p,b:p`` target spreads the batches over both."""
    result = await measure(topics.endpoint, pair.urls, tmp_path, rows=6_000, variant=FAST)
    print(result.table().render())
    for run in (*result.alone, result.both):
        assert run.clean, run
        assert run.backoffs == 0
    both = result.both.requests
    assert set(both) == set(pair.urls)
    assert min(both.values()) > 0.35 * sum(both.values()), both
    assert result.ratio > 0.8, f"both / sum of each alone = {result.ratio:.2f}"


async def test_a_slow_server_receives_fewer_batches(
    pair: Pair, topics: Topics, tmp_path: Path
) -> None:
    run = await drain(
        topics.endpoint, list(pair.urls), tmp_path, 8_000, label="lag", model="lagging"
    )
    assert run.clean, run
    fast, slow = (run.requests[url] for url in pair.urls)
    print(f"\nrequests: fast server {fast}, 4x slower server {slow}")
    assert 0 < slow < 0.5 * fast


async def test_servers_with_different_model_configs_are_refused_naming_both(
    pair: Pair, topics: Topics, tmp_path: Path
) -> None:
    config = consumer_config(
        Feed(topics.topic, topics.subscription, topics.dlq_topic),
        list(pair.urls),
        tmp_path / "r.sqlite",
        "mismatched",
    )
    with pytest.raises(EndpointSpecMismatch) as caught:
        await run_consumer(config, asyncio.Event())
    message = str(caught.value)
    a, b = pair.urls
    assert f"between inference endpoints {a} and {b}" in message
    assert "max_batch_size: 128 vs 64" in message


async def test_a_server_killed_mid_run_loses_nothing_and_rejoins(
    pair: Pair, topics: Topics, pubsub: PubSubEndpoint, tmp_path: Path
) -> None:
    rows = 20_000
    chunks, expected = backlog(rows, seed=7)
    # 16,000 rows now, the last 4,000 once the killed server is ready again: it rejoins
    # with work still to do (with all of them at once, the survivor could finish first).
    later = len(chunks) * 4 // 5
    feed = Feed(topics.topic, topics.subscription, topics.dlq_topic)
    await asyncio.to_thread(feed.publish, pubsub, chunks[:later])
    sqlite = tmp_path / "killed.sqlite"
    a_url = pair.urls[0]
    async with consumer_running(consumer_config(feed, list(pair.urls), sqlite)) as run:
        await wait_until(lambda: bool(run.running), alive=run.task)
        running = run.running[0]

        def written() -> float:
            return sample(running, "rowbatch_rows_written_total")

        def a_healthy() -> float:
            return sample(running, "rowbatch_endpoint_healthy", endpoint=a_url)

        await wait_until(lambda: written() >= 3_000, alive=run.task)
        at_kill = written()
        killed_at = time.monotonic()
        await asyncio.to_thread(pair.services[0].kill)
        await wait_until(lambda: written() >= at_kill + 1_000, timeout_s=30, alive=run.task)
        taken_over_s = time.monotonic() - killed_at
        await wait_until(lambda: a_healthy() == 0, timeout_s=10, alive=run.task)
        requests_at_kill = requests_per_endpoint(running)[a_url]
        restarted = await asyncio.to_thread(pair.services[0].start)
        assert restarted.grpc_url == a_url
        ready_at = time.monotonic()
        await asyncio.to_thread(feed.publish, pubsub, chunks[later:])
        await wait_until(
            lambda: a_healthy() == 1 and requests_per_endpoint(running)[a_url] > requests_at_kill,
            timeout_s=30,
            alive=run.task,
        )
        rejoined_s = time.monotonic() - ready_at
        left_when_rejoined = rows - written()
        await wait_until(lambda: written() >= rows, alive=run.task)
        assert total(running, "rowbatch_messages_dead_lettered_total") == 0
        assert sample(running, "rowbatch_messages_nacked_total") == 0
        assert sample(running, "rowbatch_backoff_periods_total") == 0  # never paused
        failed = sample(
            running, "rowbatch_endpoint_errors_total", endpoint=a_url, kind="unavailable"
        )
    print(
        f"\nkill -9 of {a_url} after {at_kill:,.0f} rows: 1,000 more rows written "
        f"{taken_over_s:.2f} s later; back in use {rejoined_s:.2f} s after it was ready again "
        f"({left_when_rejoined:,.0f} rows left then); its failed requests: {failed:.0f}"
    )
    assert taken_over_s < 5.0
    assert rejoined_s < 5.0
    assert compare(sqlite, expected) == (0, 0, 0)
    assert topics.dead_letters(0) == []
