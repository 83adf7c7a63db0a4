"""The waits of the sources' retries, all by ``rowbatch.timing.Backoff`` (no jitter): the Pub/Sub
pull loop (after failures, and after empty answers that came back at once), the ack/nack
batcher's calls, the Kafka source's re-deliveries and the Kafka admin's connecting. Virtual
time: nothing really sleeps."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, cast

import pytest
from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.kafka import admin as admin_module
from rowbatch.consumer.sources.kafka.admin import AioKafkaAdmin
from rowbatch.consumer.sources.pubsub.id_batcher import IdBatcher
from rowbatch.consumer.sources.pubsub.pull_flow import PullFlow, pull_loop
from tests.unit.consumer.sources.kafka.test_source import TP0, make_rig, start, take
from tests.virtual_time import VirtualTime

UNAVAILABLE: type[Exception] = gexc.ServiceUnavailable
DOWN = UNAVAILABLE("down")
MESSAGE = object()


class ScriptedPulls:
    """Pull answers in order (an exception is raised); when they run out the flow closes."""

    def __init__(self, flow: OpenFlow, answers: Sequence[Exception | Sequence[Any]]) -> None:
        self._flow = flow
        self._answers = list(answers)

    async def pull(self, max_messages: int) -> Sequence[Any]:
        if not self._answers:
            self._flow.closing = True
            return [MESSAGE]
        answer = self._answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class OpenFlow:
    """Flow control that always has room."""

    def __init__(self) -> None:
        self.closing = False
        self.reserved = 0
        self.room = asyncio.Event()

    def size(self) -> int:
        return 10


async def run_pulls(answers: Sequence[Exception | Sequence[Any]]) -> list[float]:
    ticks = VirtualTime()
    flow = OpenFlow()
    await pull_loop(
        cast(Any, ScriptedPulls(flow, answers)),
        cast(PullFlow, flow),
        lambda messages, sent_at: None,
        subscription="projects/p/subscriptions/s",
        host="pubsub",
        clock=ticks.clock,
        sleep=ticks.sleep,
    )
    return ticks.slept


async def test_pull_failures_wait_doubling_to_10_s_and_an_answer_starts_over() -> None:
    slept = await run_pulls([DOWN] * 8 + [[MESSAGE], DOWN, [], DOWN])
    assert slept == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 0.1, 0.01, 0.1])


async def test_fast_empty_pulls_wait_doubling_to_250_ms_and_messages_start_over() -> None:
    slept = await run_pulls([[]] * 7 + [[MESSAGE], []])
    assert slept == pytest.approx([0.01, 0.02, 0.04, 0.08, 0.16, 0.25, 0.25, 0.01])


async def test_ack_calls_wait_doubling_to_2_s_until_the_retry_window_ends() -> None:
    ticks = VirtualTime(now=0.0)
    calls: list[float] = []

    async def send(ids: list[str]) -> None:
        calls.append(ticks.now)
        raise DOWN

    batcher = IdBatcher(
        "ack", send, max_ids=10, max_delay_s=0, retry_s=10.0, clock=ticks.clock, sleep=ticks.sleep
    )
    batcher.extend(["x"])
    await batcher.flush()
    # the ninth call is at 9.1 s: another 2 s would pass the 10 s, so it gives up
    assert ticks.slept == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0])
    assert len(calls) == 9 and batcher.given_up == 1


class Stop(Exception):
    pass


class UnreachableAdminClient:
    def __init__(self, **options: Any) -> None:
        pass

    async def start(self) -> None:
        raise OSError("connection refused")

    async def close(self) -> None:
        pass


async def test_the_kafka_admin_waits_doubling_to_2_s_between_connection_tries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(admin_module, "AIOKafkaAdminClient", UnreachableAdminClient)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 6:
            raise Stop

    with pytest.raises(Stop):
        async with AioKafkaAdmin({"bootstrap_servers": "b:9092"}, timeout_s=3600, sleep=sleep):
            pass
    assert slept == pytest.approx([0.2, 0.4, 0.8, 1.6, 2.0, 2.0])


async def test_kafka_redeliveries_wait_doubling_up_to_the_cap() -> None:
    rig = make_rig(redelivery_backoff_s=1.0, redelivery_backoff_max_s=3.0)
    await start(rig, {TP0})
    rig.consumer.feed(TP0, range(1))
    delays: list[float] = []
    retry = rig.source._ahead.retry

    def due_now(held: Any, due: float) -> None:
        delays.append(due - time.monotonic())
        retry(held, 0.0)  # re-delivered at once: nothing waits

    rig.source._ahead.retry = due_now  # type: ignore[method-assign]
    for attempt in range(1, 5):
        [delivery] = await take(rig.source, 1)
        assert delivery.delivery_attempt == attempt
        await rig.source.nack(delivery)
    assert delays == pytest.approx([1.0, 2.0, 3.0, 3.0], abs=0.05)
    await rig.source.close()
