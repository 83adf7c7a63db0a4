"""Helpers for end-to-end consumer tests on the real emulator, Triton and sinks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pstypes

from consumer.service.config import ConsumerConfig
from consumer.service.runner import Running, run_consumer
from harness.pubsub import PubSubEndpoint
from wire.chunks import EncodedChunk

WAIT_S = 120.0


@dataclass
class Topics:
    """A topic with its subscription, and a dead-letter topic with a subscription to read it."""

    endpoint: PubSubEndpoint
    topic: str
    subscription: str
    dlq_topic: str
    dlq_subscription: str
    publisher: pubsub_v1.PublisherClient
    subscriber: pubsub_v1.SubscriberClient

    @classmethod
    def create(
        cls,
        endpoint: PubSubEndpoint,
        *,
        ack_deadline_s: int = 60,
        policy_max_attempts: int | None = None,
    ) -> Topics:
        unique = uuid.uuid4().hex[:10]
        project = endpoint.project
        t = cls(
            endpoint=endpoint,
            topic=f"projects/{project}/topics/in-{unique}",
            subscription=f"projects/{project}/subscriptions/in-{unique}",
            dlq_topic=f"projects/{project}/topics/dlq-{unique}",
            dlq_subscription=f"projects/{project}/subscriptions/dlq-{unique}",
            publisher=endpoint.publisher(),
            subscriber=endpoint.subscriber(),
        )
        t.publisher.create_topic(name=t.topic)
        t.publisher.create_topic(name=t.dlq_topic)
        t.subscriber.create_subscription(name=t.dlq_subscription, topic=t.dlq_topic)
        sub = pstypes.Subscription(
            name=t.subscription, topic=t.topic, ack_deadline_seconds=ack_deadline_s
        )
        if policy_max_attempts is not None:
            sub.dead_letter_policy = pstypes.DeadLetterPolicy(
                dead_letter_topic=t.dlq_topic, max_delivery_attempts=policy_max_attempts
            )
        t.subscriber.create_subscription(request=sub)
        return t

    def publish(self, chunks: Sequence[EncodedChunk]) -> list[str]:
        futures = [self.publisher.publish(self.topic, c.payload, **c.attributes) for c in chunks]
        return [f.result(timeout=60) for f in futures]

    def publish_raw(self, payload: bytes, attributes: dict[str, str]) -> str:
        result: str = self.publisher.publish(self.topic, payload, **attributes).result(timeout=60)
        return result

    def dead_letters(
        self, expect: int, timeout_s: float = WAIT_S
    ) -> list[pubsub_v1.types.PubsubMessage]:
        """Pull the dead-letter subscription until ``expect`` messages arrived (then a short
        extra pull proves no more are there)."""
        got: dict[str, pubsub_v1.types.PubsubMessage] = {}
        done = threading.Event()
        lock = threading.Lock()

        def on_message(message: Any) -> None:
            with lock:
                got[message.message_id] = message
                if len(got) >= expect:
                    done.set()
            message.ack()

        future = self.subscriber.subscribe(self.dlq_subscription, callback=on_message)
        try:
            if expect:
                done.wait(timeout_s)
        finally:
            future.cancel()
            future.result(timeout=30)
        return list(got.values())

    def close(self) -> None:
        self.publisher.transport.close()
        self.subscriber.close()


@dataclass
class InProcess:
    """A consumer running in this process's event loop."""

    task: asyncio.Task[None]
    stop: asyncio.Event
    running: list[Running] = field(default_factory=list)

    async def stop_and_wait(self, timeout_s: float = 60) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout_s)


@contextlib.asynccontextmanager
async def consumer_running(config: ConsumerConfig) -> AsyncIterator[InProcess]:
    stop = asyncio.Event()
    handle = InProcess(task=asyncio.get_running_loop().create_task(asyncio.sleep(0)), stop=stop)
    await handle.task
    handle.task = asyncio.create_task(run_consumer(config, stop, on_running=handle.running.append))
    try:
        yield handle
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(handle.task, 60)


async def wait_until(
    predicate: Callable[[], bool],
    timeout_s: float = WAIT_S,
    what: str = "condition",
    alive: asyncio.Task[None] | None = None,
) -> None:
    """Poll a cheap predicate (e.g. a row count) until true; fail after ``timeout_s``, or at
    once if the ``alive`` task (the consumer) ended."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if alive is not None and alive.done():
            alive.result()  # raises what the consumer died of
            raise AssertionError(f"consumer stopped before {what}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        await asyncio.sleep(0.2)
