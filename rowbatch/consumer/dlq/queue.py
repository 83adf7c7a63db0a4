"""The seam each broker implements for the dead-letter tools: read the dead letters without
consuming them, publish one back, and remove one (only after its publish was confirmed)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from rowbatch.consumer.dlq.letters import DeadLetter


class DeadLetterQueueError(Exception):
    """The broker refused or did not answer (the message names the call and the address)."""


class DeadLetterQueue(Protocol):
    """A dead-letter queue as the tools use it; ``close`` gives back everything read but not
    removed (it stays in the queue, as it was)."""

    @property
    def where(self) -> str:
        """The queue in words, e.g. ``Kafka topic in.dlq at host:9092``."""
        ...

    @property
    def default_target(self) -> str:
        """The topic a replay publishes to when none is given: the consumer's source topic."""
        ...

    def letters(self) -> AsyncIterator[DeadLetter]:
        """Every dead letter in the queue when the call began (not the removed ones), each
        once, oldest first per partition. Reading consumes nothing."""
        ...

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        """Publish ``letter``'s payload (and key) with ``letter.replay_attributes()`` /
        ``replay_headers()`` to ``topic`` and wait for the broker's confirmation; returns
        where it landed. Raises ``DeadLetterQueueError`` when it is not confirmed."""
        ...

    async def remove(self, letter: DeadLetter, replayed_as: str) -> None:
        """Take ``letter`` out of the queue for good (after a confirmed publish). Raises
        ``DeadLetterQueueError`` when the broker does not confirm."""
        ...

    async def close(self) -> None: ...


__all__ = ["DeadLetterQueue", "DeadLetterQueueError"]
