"""The values a source hands the pipeline and the pipeline hands back: a :class:`Delivery` (one
broker message, whatever the broker) and a :class:`DeadLetterReason` (why a delivery is
dead-lettered). Used by the sources, the engine, the sinks and the dead-letter tools alike;
the ``Source`` seam itself is :mod:`rowbatch.consumer.sources.base`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rowbatch.wire.dead_letter import DEFAULT_CODES, ReasonClass

__all__ = ["DeadLetterReason", "Delivery"]


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
    row_offset: int = 0
    """The index, in its chunk, of the message's first row: 0 for a broker message (it is a
    whole chunk); a table-mode part of a chunk (the rows a restart had left to do, or a half
    of a dead-lettered chunk) keeps its rows' keys ``(chunk_id, row_offset + i)``."""

    @classmethod
    def of(
        cls,
        *,
        message_id: str,
        payload: bytes,
        attributes: Mapping[str, str],
        publish_time: float,
        delivery_attempt: int,
        source: str,
        ordering_key: str,
        size: int,
    ) -> Delivery:
        """A broker message (a whole chunk: ``row_offset`` 0), without the frozen dataclass's
        per-field ``__init__`` (the sources build one per message)."""
        out = object.__new__(cls)
        # row_offset is left to the class default: one dict entry fewer per message.
        out.__dict__.update(
            message_id=message_id,
            payload=payload,
            attributes=attributes,
            publish_time=publish_time,
            delivery_attempt=delivery_attempt,
            source=source,
            ordering_key=ordering_key,
            size=size,
        )
        return out

    @classmethod
    def of_rows(
        cls,
        *,
        message_id: str,
        payload: bytes,
        attributes: Mapping[str, str],
        publish_time: float,
        delivery_attempt: int,
        source: str,
        size: int,
        row_offset: int,
    ) -> Delivery:
        """Rows read from a table (table mode: no ordering key) whose first is row
        ``row_offset`` of its chunk; one instance, as :meth:`of`."""
        out = cls.of(
            message_id=message_id,
            payload=payload,
            attributes=attributes,
            publish_time=publish_time,
            delivery_attempt=delivery_attempt,
            source=source,
            ordering_key="",
            size=size,
        )
        if row_offset:  # else the class default, as for a broker message
            out.__dict__["row_offset"] = row_offset
        return out
