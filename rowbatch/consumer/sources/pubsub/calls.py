"""The seam between both Pub/Sub sources and the service, for what is not pulling: the
subscription and topic lookups of the start-up check and the dead letters' Publish.

Two implementations: ``GrpcCalls`` (``grpc_calls.py``: a plain grpc.aio channel, what the pull
source uses unless given clients) and ``LibraryCalls`` (``library_calls.py``: google-cloud-
pubsub's clients, what the streaming source and callers passing clients use). Each method is
one attempt within ``timeout_s`` and raises ``google.api_core.exceptions``; ``retried`` retries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from rowbatch.timing import Backoff, Clock, Sleep

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class SubscriptionInfo:
    """What the sources read of a subscription."""

    ack_deadline_seconds: int
    enable_message_ordering: bool
    dead_letter_topic: str
    """The dead-letter policy's topic; "" without a policy."""
    max_delivery_attempts: int
    """The dead-letter policy's attempts; 0 without a policy."""


class PubSubCalls(Protocol):
    async def get_subscription(self, subscription: str, timeout_s: float) -> SubscriptionInfo:
        """``NotFound`` when there is no such subscription."""

    async def get_topic(self, topic: str, timeout_s: float) -> None:
        """``NotFound`` when there is no such topic."""

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], timeout_s: float
    ) -> None:
        """One message, confirmed when this returns."""

    async def close(self) -> None:
        """Closes what this object opened (not clients it was given)."""


async def retried(
    call: Callable[[], Awaitable[T]],
    *,
    retry_on: tuple[type[BaseException], ...],
    timeout_s: float,
    max_wait_s: float,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> T:
    """``call()`` again after each ``retry_on`` error, waiting 0.1 s doubling up to
    ``max_wait_s`` (at least 0.1), while the next attempt starts within ``timeout_s``; else its
    last error."""
    backoff = Backoff(0.1, max_wait_s, jitter=0.0)
    give_up_at = clock() + timeout_s
    failures = 0
    while True:
        try:
            return await call()
        except retry_on:
            failures += 1
            wait = backoff.wait(failures)
            if clock() + wait > give_up_at:
                raise
        await sleep(wait)
