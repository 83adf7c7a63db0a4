"""The ``Source`` seam: a broker adapter yields ``Delivery`` values and settles each one exactly
once, by ``ack``, ``nack`` or ``dead_letter``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import metadata
from typing import Protocol, Self


def package_version() -> str:
    """rowbatch's installed version, written into dead-letter records."""
    try:
        return metadata.version("rowbatch")
    except metadata.PackageNotFoundError:
        return "unknown"


class SourceError(Exception):
    """Base class for errors a source raises."""


class SourceConfigError(SourceError, ValueError):
    """The configuration, or the subscription/topic it names, cannot work."""


class SourceUnreachable(SourceError):
    """The broker did not answer (or refused the connection/authentication)."""


class DeadLetterFailed(SourceError):
    """The dead-letter publish was not confirmed; the delivery is still unsettled and the
    caller should nack it."""


class ReasonClass(StrEnum):
    """Why a message went to the dead-letter topic (the ``rowbatch-dlq-reason`` attribute)."""

    UNDECODABLE = "undecodable"
    """The payload or its attributes break the wire contract (see producer/errors.py)."""
    SCHEMA_MISMATCH = "schema-mismatch"
    """Decodable, but its columns do not fit the model binding (missing column, wrong type)."""
    REJECTED_BY_MODEL = "rejected-by-model"
    """The inference server answered INVALID_ARGUMENT for this message's rows (isolated by
    bisecting the batch)."""
    TOO_MANY_ATTEMPTS = "too-many-attempts"
    """Delivered more times than ``max_delivery_attempts`` without being written."""
    REJECTED_BY_SINK = "rejected-by-sink"
    """The result table refused this message's rows for good (a value the database cannot
    store); isolated by bisecting the write, the database's message attached."""


#: The fine reason code when a ``DeadLetterReason`` is given none (``rowbatch-dlq-code``).
DEFAULT_CODES: dict[ReasonClass, str] = {
    ReasonClass.UNDECODABLE: "wire_error",
    ReasonClass.SCHEMA_MISMATCH: "column_type_mismatch",
    ReasonClass.REJECTED_BY_MODEL: "invalid_argument",
    ReasonClass.TOO_MANY_ATTEMPTS: "too_many_attempts",
    ReasonClass.REJECTED_BY_SINK: "sink_rejected_value",
}


@dataclass(frozen=True)
class DeadLetterReason:
    reason_class: ReasonClass
    message: str
    """A human sentence naming what is wrong (column, header, row, server message)."""
    code: str = ""
    """The fine reason code of docs/wire-format.md section 6 (``missing_header``,
    ``null_not_allowed``, ``sink_rejected_value``, ...), written as ``rowbatch-dlq-code``.
    Empty: the class's default from ``DEFAULT_CODES``."""

    def __post_init__(self) -> None:
        if not self.code:
            object.__setattr__(self, "code", DEFAULT_CODES[self.reason_class])


@dataclass(frozen=True, eq=False)
class Delivery:
    """One message as the consumer sees it, whatever the broker. Compared by identity: the
    same broker message delivered twice is two deliveries."""

    message_id: str
    """The broker's id: the Pub/Sub message id, or ``topic/partition/offset`` on Kafka."""
    payload: bytes
    attributes: Mapping[str, str]
    """Pub/Sub attributes, or Kafka headers decoded as UTF-8."""
    publish_time: float
    """When the broker accepted the message, in Unix seconds."""
    delivery_attempt: int
    """1 for the first delivery; 0 when the broker does not count (no dead-letter policy)."""
    source: str
    """Where it came from, for dead-letter records: a subscription path, or topic/partition."""
    ordering_key: str = ""
    size: int = field(default=0)
    """Bytes the broker counts against flow control (payload plus attributes)."""


class DeliveryIterator:
    """What a source's ``deliveries()`` returns: each ``__anext__`` awaits ``next_delivery``
    (which raises ``StopAsyncIteration`` once the source is closed)."""

    def __init__(self, next_delivery: Callable[[], Awaitable[Delivery]]) -> None:
        self._next = next_delivery

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Delivery:
        return await self._next()


class Source(Protocol):
    """A broker adapter. ``deliveries`` yields messages until ``close``; every delivery must be
    settled by exactly one of ``ack``, ``nack`` or ``dead_letter``."""

    async def check(self) -> None:
        """Start-up check: the broker answers, the subscription/topic and the dead-letter
        topic exist. Raises an error naming what is missing."""

    def deliveries(self) -> AsyncIterator[Delivery]: ...

    async def ack(self, delivery: Delivery) -> None:
        """Done: every row is durably written (or the message was dead-lettered)."""

    async def nack(self, delivery: Delivery) -> None:
        """Give it back for redelivery (shutdown before it finished, or a failed dead-letter)."""

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        """Publish the original payload and attributes plus the reason to the dead-letter
        topic, wait for the broker's confirmation, then ack. Raises if the publish failed
        (the caller then nacks)."""

    def pause(self) -> None:
        """Stop fetching new messages (held ones stay leased)."""

    def resume(self) -> None: ...

    async def close(self) -> None:
        """Stop fetching and release the broker connection; unsettled deliveries are nacked."""
