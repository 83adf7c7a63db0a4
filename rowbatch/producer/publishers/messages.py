"""What publishers send and report: the :class:`Message` protocol (an encoded chunk or a
:class:`RawMessage` built by hand), :class:`PublishedChunk` for an acknowledged one, and what a
message's headers say about it (chunk id, size, row count)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from rowbatch.wire.headers.fields import H_CHUNK_ID, H_ROW_COUNT, attributes_size


class Message(Protocol):
    """What a publisher sends: :class:`~rowbatch.wire.chunks.encode.EncodedChunk`, or a
    :class:`RawMessage` (any payload and attributes, e.g. the load generator's deliberately
    malformed ones)."""

    @property
    def payload(self) -> bytes: ...

    @property
    def attributes(self) -> Mapping[str, str]: ...


@dataclass(frozen=True)
class RawMessage:
    """A message built by hand: no validation at all."""

    payload: bytes
    attributes: Mapping[str, str]


@dataclass(frozen=True)
class PublishedChunk:
    """One acknowledged message."""

    chunk_id: str
    rows: int
    bytes: int
    message_id: str


def chunk_id_of(message: Message) -> str:
    return message.attributes.get(H_CHUNK_ID) or "(no chunk id)"


def message_size(message: Message) -> int:
    return len(message.payload) + attributes_size(message.attributes)


def rows_of(message: Message) -> int:
    """The row count a message claims (0 when its header is missing or not a number)."""
    raw = message.attributes.get(H_ROW_COUNT, "")
    return int(raw) if raw.isdigit() else 0


__all__ = [
    "Message",
    "PublishedChunk",
    "RawMessage",
    "chunk_id_of",
    "message_size",
    "rows_of",
]
