"""The Kafka broker itself crashes and comes back while a consumer group is mid-run: the
members recover by themselves (no restart of theirs), finish, and every row is written once
with the group's offsets committed to the end. Runs on a broker of its own, so the session's
broker stays untouched."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator

import pytest

from harness.chaos import ChaosControl
from harness.kafka import KafkaService
from harness.postgres import PostgresEndpoint
from harness.service import RunDir
from harness.triton import TritonEndpoint
from tests.integration.consumer_helpers import consumer_running, wait_until
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, group_offsets, produce
from tests.integration.test_consumer_kafka import (
    chaos_config,
    count_distinct,
    lag_is_zero,
    started,
)
from tests.integration.test_consumer_pubsub import dead_lettered, text_chunk

ROWS_PER_CHUNK = 50


@pytest.fixture
def own_broker(run_dir: RunDir) -> Iterator[KafkaService]:
    service = KafkaService(run_dir, name=f"kafka-restart-{time.monotonic_ns() % 10**6}")
    with service:
        yield service


@pytest.fixture
def slow_model(triton: TritonEndpoint) -> Iterator[TritonEndpoint]:
    """The chaos model taking 0.25 s per batch, so the run lasts long enough to crash the
    broker in the middle of it."""
    ChaosControl(delay_s=0.25).write(triton.chaos_control)
    yield triton
    ChaosControl().write(triton.chaos_control)


@pytest.mark.timeout(600)
async def test_a_broker_crash_and_restart_mid_run_loses_nothing_and_the_members_recover(
    own_broker: KafkaService, slow_model: TritonEndpoint, postgres: PostgresEndpoint
) -> None:
    endpoint = own_broker.endpoint
    assert endpoint is not None
    t = await KafkaTopics.create(endpoint, partitions=6)
    chunks = [text_chunk(n, ROWS_PER_CHUNK) for n in range(160)]
    total = len(chunks) * ROWS_PER_CHUNK
    before, after = chunks[:100], chunks[100:]
    await produce(endpoint, t.topic, [chunk_record(c) for c in before])
    table = f"kafka_restart_{int(time.time() * 1000) % 10**8}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    config = chaos_config(t, slow_model, sink)

    def distinct() -> int:
        return count_distinct(postgres.dsn, table)[1]

    async with contextlib.AsyncExitStack() as stack:
        members = [await stack.enter_async_context(started(config)) for _ in range(2)]
        await wait_until(lambda: distinct() >= total // 10, 120, "a tenth of the rows written")
        crashed_at = distinct()
        # SIGKILL: no controlled shutdown; the broker recovers its logs on start.
        began = time.monotonic()
        await asyncio.to_thread(own_broker.restart, crash=True)
        down_s = time.monotonic() - began
        assert crashed_at < len(before) * ROWS_PER_CHUNK, "the backlog was gone before the crash"
        # New records after the restart reach the members too.
        await produce(endpoint, t.topic, [chunk_record(c) for c in after])
        for run in members:
            await wait_until(lambda: distinct() >= total, 240, "every row written", run.task)
        for run in members:
            await wait_until(lag_is_zero(run, t.topic), 120, "lag gauge at 0", run.task)
            assert not run.task.done(), "a member stopped after the broker restart"
        registries = [run.running[0].metrics.registry for run in members]
        for run in members:
            await run.stop_and_wait()

    assert count_distinct(postgres.dsn, table) == (total, total)
    committed, end = await group_offsets(endpoint, t.topic, t.group, t.partitions)
    assert committed == end
    assert sum(end.values()) == len(chunks)
    for registry in registries:
        assert dead_lettered(registry) == {}
    print(
        f"\nbroker killed with {crashed_at} of {total} rows written, back after {down_s:.1f} s; "
        "both members finished on their own"
    )


@pytest.mark.timeout(600)
async def test_a_consumer_started_while_the_broker_is_down_waits_for_it(
    own_broker: KafkaService,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker that is down when the consumer starts (one restarting with it in a rollout)
    is waited for with backoff, as the model server and the sink are, not a reason to exit:
    the consumer keeps checking, and once the broker is back it consumes every row."""
    endpoint = own_broker.endpoint
    assert endpoint is not None
    t = await KafkaTopics.create(endpoint, partitions=2)
    chunks = [text_chunk(n, ROWS_PER_CHUNK) for n in range(20)]
    total = len(chunks) * ROWS_PER_CHUNK
    await produce(endpoint, t.topic, [chunk_record(c) for c in chunks])
    await asyncio.to_thread(own_broker.stop)
    table = f"kafka_down_at_start_{int(time.time() * 1000) % 10**8}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    config = chaos_config(t, triton, sink, check_timeout_s=1.0)

    def retries() -> int:
        return sum(
            "source (kafka) unavailable at start-up" in r.getMessage() for r in caplog.records
        )

    caplog.set_level(logging.WARNING)
    async with consumer_running(config) as run:
        await wait_until(lambda: retries() >= 2, 120, "two start-up checks failed", run.task)
        assert not run.running, "consuming without a broker"
        await asyncio.to_thread(own_broker.start)
        await wait_until(
            lambda: bool(run.running), 120, "consuming once the broker is back", run.task
        )
        await wait_until(
            lambda: count_distinct(postgres.dsn, table)[1] >= total, 120, "every row", run.task
        )
    assert count_distinct(postgres.dsn, table) == (total, total)
