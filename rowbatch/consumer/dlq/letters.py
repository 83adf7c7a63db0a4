"""One dead letter as the tools see it, whichever broker kept it: the original payload (and
Kafka key), its attributes or headers (the producer's plus the ``rowbatch-dlq-*`` ones the
consumer added, docs/wire-format.md section 6), where it sits in the dead-letter queue, and the
fields the commands filter and count by. ``replay_attributes`` / ``replay_headers`` give what a
replay publishes: the original attributes, the dead-letter ones removed, the replay recorded.
``identity`` / ``copy_key`` say which letters are copies of one dead-lettering (the queue is
at-least-once: a consumer killed after a dead letter was confirmed and before the message was
acked dead-letters it again), so the commands count, show and replay each once."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
    ReasonClass,
)
from rowbatch.wire.errors import InvalidHeader
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_ROW_COUNT, H_TABLE, parse_timestamp

DLQ_PREFIX: Final = "rowbatch-dlq-"
"""The attributes the consumer adds when it dead-letters a message (removed on replay)."""
POLICY_PREFIX: Final = "CloudPubSubDeadLetterSource"
"""The attributes Pub/Sub adds when a subscription's dead-letter policy moves a message (after
its max delivery attempts, without a rowbatch reason); removed on replay too."""
POLICY_DELIVERY_COUNT: Final = "CloudPubSubDeadLetterSourceDeliveryCount"
POLICY_SUBSCRIPTION: Final = "CloudPubSubDeadLetterSourceSubscription"
REPLAYED_FROM: Final = "rowbatch-replayed-from"
"""Set by ``dlq replay``: where in the dead-letter queue the message was replayed from."""
REPLAY_COUNT: Final = "rowbatch-replay-count"
"""Set by ``dlq replay``: how many times this message has been replayed (1 the first time). A
replayed message that fails again comes back to the dead-letter queue with it, so a replay can
hold back what was replayed ``--max-replays`` times already instead of looping."""
POLICY_CODE: Final = "subscription_dead_letter_policy"
"""The code shown for a message Pub/Sub's own dead-letter policy moved (it names no reason)."""
UNKNOWN: Final = "unknown"

Identity = tuple[str, str, str, str, int, str, str]
"""``(table, chunk id or source message, reason, code, replays, key, payload digest)``: see
``DeadLetter.identity``."""


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter read from a dead-letter queue (nothing about it is trusted: every field
    is read leniently, a missing or malformed one shows as ``unknown`` / None)."""

    ref: str
    """Where it sits in the queue: ``topic/partition/offset`` (Kafka) or
    ``subscription/message-id`` (Pub/Sub). Recorded as ``rowbatch-replayed-from``."""
    payload: bytes
    attributes: Mapping[str, str]
    """Pub/Sub attributes, or Kafka headers as text (bytes that are not UTF-8 replaced)."""
    headers: tuple[tuple[str, bytes], ...] = ()
    """Kafka only: the headers as they were (replayed byte for byte)."""
    key: bytes | None = None
    """Kafka only: the record key."""
    queued_at: datetime | None = None
    """When the dead-letter queue got it (the broker's time)."""
    partition: int | None = field(default=None, compare=False)
    """Kafka only: the dead-letter topic's partition."""
    values: Mapping[str, Any] | None = field(default=None, compare=False)
    """Table runs only: the row's values as the dead-letter record keeps them (a letter is
    one row, not a chunk)."""

    @property
    def moved_by_policy(self) -> bool:
        """Moved by a Pub/Sub subscription's dead-letter policy, not by the consumer."""
        return ATTR_REASON not in self.attributes and POLICY_SUBSCRIPTION in self.attributes

    @property
    def reason(self) -> str:
        if self.moved_by_policy:
            return ReasonClass.TOO_MANY_ATTEMPTS.value
        return self.attributes.get(ATTR_REASON) or UNKNOWN

    @property
    def code(self) -> str:
        if self.moved_by_policy:
            return POLICY_CODE
        return self.attributes.get(ATTR_CODE) or UNKNOWN

    @property
    def message(self) -> str:
        return self.attributes.get(ATTR_MESSAGE, "")

    @property
    def source(self) -> str:
        """The topic/partition or subscription the consumer read it from."""
        return (
            self.attributes.get(ATTR_SOURCE) or self.attributes.get(POLICY_SUBSCRIPTION) or UNKNOWN
        )

    @property
    def message_id(self) -> str:
        return self.attributes.get(ATTR_MESSAGE_ID) or UNKNOWN

    @property
    def delivery_attempt(self) -> int | None:
        raw = self.attributes.get(ATTR_DELIVERY_ATTEMPT) or self.attributes.get(
            POLICY_DELIVERY_COUNT
        )
        return _int(raw)

    @property
    def consumer_version(self) -> str:
        return self.attributes.get(ATTR_CONSUMER_VERSION) or UNKNOWN

    @property
    def time(self) -> datetime | None:
        """When it was dead-lettered: the consumer's ``rowbatch-dlq-time``, else the queue's."""
        raw = self.attributes.get(ATTR_TIME)
        if raw:
            try:
                return parse_timestamp(raw, ATTR_TIME)
            except InvalidHeader:
                pass
        return self.queued_at

    @property
    def table(self) -> str:
        return _header(self.attributes, H_TABLE) or UNKNOWN

    @property
    def chunk_id(self) -> str:
        return _header(self.attributes, H_CHUNK_ID) or UNKNOWN

    @property
    def row_count(self) -> int | None:
        return _int(_header(self.attributes, H_ROW_COUNT))

    @property
    def replays(self) -> int:
        """How many times it was replayed before (``rowbatch-replay-count``, 0 when never)."""
        return _int(_header(self.attributes, REPLAY_COUNT)) or 0

    @property
    def identity(self) -> Identity | None:
        """What two copies of one dead letter share: the table, the chunk id, the reason and
        code, the replay count, the Kafka key and the payload (its SHA-256). Not the time, the
        delivery attempt, the message, the consumer version or the place in the queue: those
        differ when a redelivered message is dead-lettered again (the same chunk id, a row
        part's too, since its id is derived from its parent's and its rows). A letter of the
        same chunk dead-lettered again after a replay carries a higher replay count: a later
        letter, not a copy. A letter without a chunk id (a message missing its headers) is
        named by where the consumer read it instead (``rowbatch-dlq-source`` and
        ``rowbatch-dlq-message-id``, the same on a redelivery); None (never a copy) when it has
        neither, and for a table run's letters (one per row, kept once per row key already)."""
        if self.values is not None:
            return None
        name = _header(self.attributes, H_CHUNK_ID)
        if not name:
            if UNKNOWN in (self.source, self.message_id):
                return None
            name = f"message {self.message_id} of {self.source}"  # a chunk id has no spaces
        return (
            self.table,
            name,
            self.reason,
            self.code,
            self.replays,
            "" if self.key is None else "k:" + self.key.hex(),
            hashlib.sha256(self.payload).hexdigest(),
        )

    @property
    def copy_key(self) -> bytes | None:
        """``identity`` in 16 bytes (what the commands keep per letter read), None when the
        letter has none."""
        identity = self.identity
        if identity is None:
            return None
        return hashlib.blake2b(repr(identity).encode(), digest_size=16).digest()

    def original_attributes(self) -> dict[str, str]:
        """The attributes without the dead-letter ones: what the producer sent (plus any
        earlier replay's)."""
        return {k: v for k, v in self.attributes.items() if not _added(k)}

    def replay_attributes(self) -> dict[str, str]:
        """What a replay publishes with the payload (Pub/Sub attributes)."""
        return {
            **{k: v for k, v in self.original_attributes().items() if not _replay(k)},
            REPLAYED_FROM: self.ref,
            REPLAY_COUNT: str(self.replays + 1),
        }

    def replay_headers(self) -> list[tuple[str, bytes]]:
        """What a replay publishes with the key and value (Kafka headers, the original ones
        byte for byte)."""
        kept = [(k, v) for k, v in self.headers if not _added(k) and not _replay(k)]
        return [
            *kept,
            (REPLAYED_FROM, self.ref.encode()),
            (REPLAY_COUNT, str(self.replays + 1).encode()),
        ]


def _added(name: str) -> bool:
    return name.lower().startswith(DLQ_PREFIX) or name.startswith(POLICY_PREFIX)


def _replay(name: str) -> bool:
    return name.lower() in (REPLAYED_FROM, REPLAY_COUNT)


def _header(attributes: Mapping[str, str], name: str) -> str | None:
    """A chunk header (names match case-insensitively, as the consumer reads them)."""
    found = attributes.get(name)
    if found is not None:
        return found
    return next((v for k, v in attributes.items() if k.lower() == name), None)


def _int(raw: str | None) -> int | None:
    if raw is None or not raw.isascii() or not raw.isdigit():
        return None
    return int(raw)


def text_of(headers: tuple[tuple[str, bytes], ...]) -> dict[str, str]:
    """Kafka headers as text for display and filtering (not UTF-8: replaced characters)."""
    return {k: (v or b"").decode("utf-8", errors="replace") for k, v in headers}


__all__ = [
    "DLQ_PREFIX",
    "POLICY_CODE",
    "REPLAYED_FROM",
    "REPLAY_COUNT",
    "UNKNOWN",
    "DeadLetter",
    "Identity",
    "text_of",
]
