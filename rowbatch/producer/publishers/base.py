"""The :class:`Publisher` protocol every broker adapter meets, and :class:`StartClose`, the
``async with`` lifecycle they share."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self

from rowbatch.producer.publishers.messages import Message


class Publisher(Protocol):
    """Publishes messages to one topic. ``publish`` returns once the broker has acknowledged
    the message, with its id (Pub/Sub message id, Kafka ``topic/partition/offset``); call it
    from several tasks at once to keep many messages in flight (see :class:`PublishWindow`)."""

    @property
    def broker(self) -> str:
        """``"pubsub"`` or ``"kafka"`` (for messages)."""
        ...

    @property
    def topic(self) -> str: ...

    @property
    def address(self) -> str:
        """Where the broker is, for messages (``127.0.0.1:9092``, ``pubsub.googleapis.com``)."""
        ...

    @property
    def max_chunk_bytes(self) -> int:
        """The largest :attr:`EncodedChunk.size` (payload + attribute keys and values) that
        fits one message."""
        ...

    async def start(self) -> None:
        """Connects and checks the topic exists: :class:`BrokerUnavailable`,
        :class:`TopicNotFound`."""
        ...

    async def publish(self, message: Message, *, key: str | None = None) -> str:
        """Publishes one message; ``key`` is the ordering key (Pub/Sub) / record key (Kafka),
        by default the message's ``rowbatch-ordering-key`` header."""
        ...

    async def flush(self) -> None:
        """Waits until everything handed to :meth:`publish` so far is acknowledged or failed."""
        ...

    async def close(self) -> None:
        """Flushes and releases the client (idempotent)."""
        ...


class StartClose:
    """``async with publisher:`` calls ``start`` (closing again if it fails) and ``close``."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


__all__ = ["Publisher", "StartClose"]
