"""Running the load generator: every planned message handed to a submit function (a publish
window's), paced by a :class:`~rowbatch.producer.loadgen.rate.RateLimiter`, into a manifest."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from rowbatch.producer.loadgen.malformed import plan_malformed
from rowbatch.producer.loadgen.manifest import Manifest
from rowbatch.producer.loadgen.plan import plan_chunk
from rowbatch.producer.loadgen.rate import RateLimiter
from rowbatch.producer.loadgen.spec import LoadSpec
from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.messages import Message


async def publish_load(
    publisher: Publisher,
    spec: LoadSpec,
    submit: Callable[[Message, int | None], Awaitable[None]],
    limiter: RateLimiter,
) -> Manifest:
    """Generates the messages (in a worker thread) and hands each to ``submit`` (a
    :class:`~rowbatch.producer.publishers.window.PublishWindow`'s), paced by ``limiter``."""
    manifest = Manifest(spec)
    malformed = plan_malformed(spec)
    for index in range(spec.chunks):
        planned = await asyncio.to_thread(
            plan_chunk,
            spec,
            index,
            malformed.get(index),
            max_chunk_bytes=publisher.max_chunk_bytes,
        )
        for message in planned:
            await limiter.acquire(message.rows)
            await submit(message.message, message.rows)
            manifest.add(message)
    return manifest


__all__ = ["publish_load"]
