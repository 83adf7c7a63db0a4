"""Helpers for end-to-end consumer tests on the real emulator, Triton and sinks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pstypes

from harness.pubsub import PubSubEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.wire.chunks.encode import EncodedChunk

WAIT_S = 120.0
QUIET_S = 1.5
"""How long ``Topics.dead_letters`` pulls with nothing new before it says "no more"."""
SENTINEL = "rowbatch-test-sentinel"


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

    def source(self, max_lease_extension_s: int = 10) -> dict[str, Any]:
        """The consumer's ``[source]`` section for this subscription and dead-letter topic."""
        return {
            "kind": "pubsub",
            "subscription": self.subscription,
            "topic": self.topic,
            "dead_letter_topic": self.dlq_topic,
            "dead_letter_subscription": self.dlq_subscription,
            "max_lease_extension_s": max_lease_extension_s,
        }

    @classmethod
    def create(
        cls,
        endpoint: PubSubEndpoint,
        *,
        ack_deadline_s: int = 60,
        policy_max_attempts: int | None = None,
        ordering: bool = False,
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
            name=t.subscription,
            topic=t.topic,
            ack_deadline_seconds=ack_deadline_s,
            enable_message_ordering=ordering,
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
        self, expect: int, timeout_s: float = WAIT_S, quiet_s: float = QUIET_S
    ) -> list[pubsub_v1.types.PubsubMessage]:
        """Every dead letter there is: pull the dead-letter subscription until ``expect``
        messages arrived (or ``timeout_s`` passed), then go on pulling until ``quiet_s`` passed
        with nothing new, so the caller can assert the exact count (``== []``, ``[one] = ...``).
        The quiet time starts once a sentinel, published to the dead-letter topic after the
        wait, has come back: the stream was live and had delivered what was there before it."""
        got: dict[str, pubsub_v1.types.PubsubMessage] = {}
        enough = threading.Event()
        sentinel_back = threading.Event()
        lock = threading.Lock()
        last = [time.monotonic()]
        sentinel = uuid.uuid4().hex

        def on_message(message: Any) -> None:
            message.ack()
            if message.attributes.get(SENTINEL) == sentinel:
                sentinel_back.set()
                return
            with lock:
                got[message.message_id] = message
                last[0] = time.monotonic()
                if len(got) >= expect:
                    enough.set()

        future = self.subscriber.subscribe(self.dlq_subscription, callback=on_message)
        try:
            if expect:
                enough.wait(timeout_s)
            self.publisher.publish(self.dlq_topic, b"", **{SENTINEL: sentinel}).result(timeout=60)
            assert sentinel_back.wait(timeout_s), "the dead-letter subscription delivers nothing"
            quiet_from = time.monotonic()
            while True:
                with lock:
                    quiet_until = max(quiet_from, last[0]) + quiet_s
                if time.monotonic() >= quiet_until:
                    break
                time.sleep(quiet_until - time.monotonic())
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
        """Ask the consumer to stop (as SIGTERM does) and wait for it: raises what it failed
        with, or fails the test if it is still running after ``timeout_s``."""
        self.stop.set()
        done, _ = await asyncio.wait({self.task}, timeout=timeout_s)
        if not done:
            self.task.cancel()
            await asyncio.wait({self.task}, timeout=10)
            raise AssertionError(f"the consumer did not stop within {timeout_s:g} s of the stop")
        self.task.result()


@contextlib.asynccontextmanager
async def consumer_running(config: ConsumerConfig) -> AsyncIterator[InProcess]:
    stop = asyncio.Event()
    handle = InProcess(task=asyncio.get_running_loop().create_task(asyncio.sleep(0)), stop=stop)
    await handle.task
    handle.task = asyncio.create_task(run_consumer(config, stop, on_running=handle.running.append))
    try:
        yield handle
    except BaseException:
        # The test failed already: stop the consumer, but report the test's own error.
        stop.set()
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(handle.task, 60)
        raise
    # The checked path: the consumer stops when asked, without an error, within the time.
    await handle.stop_and_wait()


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
