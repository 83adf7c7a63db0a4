"""The errors publishers raise: each names the topic (and the chunk, the broker address) so it can
be shown to a person as is; the one-line descriptions of client exceptions they quote; and the
two failures every adapter words alike (a chunk refused, a chunk unanswered through all retries)."""

from __future__ import annotations

from rowbatch.producer.publishers.retry import PublishRetry


class PublishError(Exception):
    """Base class of publishing errors; the message names the topic (and the chunk, the broker
    address) so it can be shown to a person as is."""

    def __init__(self, message: str, *, topic: str | None = None, address: str | None = None):
        super().__init__(message)
        self.message = message
        self.topic = topic
        self.address = address


class PublisherConfigError(PublishError):
    """The publisher cannot work as set up: no Google credentials and no Pub/Sub emulator
    named, say. The message says what to set (the command line exits 2)."""


class TopicNotFound(PublishError):
    """The topic does not exist (create it first; rowbatch never creates topics)."""


class BrokerUnavailable(PublishError):
    """The broker did not answer within the connect timeout, or stayed unreachable through all
    retries."""


class PublishFailed(PublishError):
    """The broker refused a chunk for a reason retrying cannot fix (or retries ran out)."""

    def __init__(
        self,
        message: str,
        *,
        topic: str | None = None,
        address: str | None = None,
        chunk_id: str | None = None,
    ):
        super().__init__(message, topic=topic, address=address)
        self.chunk_id = chunk_id


class MessageTooLarge(PublishFailed):
    """A message over the publisher's size limit (split it with :func:`publish_rows`)."""


def short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(exc: BaseException) -> str:
    """``Type: message`` without repeating the type when the message starts with it."""
    name = type(exc).__name__
    text = short(exc)
    return text if text.startswith(name) else f"{name}: {text}"


def unanswered(
    where: str,
    chunk_id: str,
    exc: BaseException,
    *,
    verb: str,
    retry: PublishRetry,
    topic: str,
    address: str,
) -> BrokerUnavailable:
    """The broker at ``where`` did not ``verb`` (acknowledge, accept) the chunk through all of
    ``retry``'s attempts; ``exc`` is the last attempt's error."""
    return BrokerUnavailable(
        f"{where} did not {verb} chunk {chunk_id!r} after {retry.attempts} attempt(s) "
        f"(at most {retry.max_seconds:g} s): {describe(exc)}",
        topic=topic,
        address=address,
    )


def refused(
    where: str, chunk_id: str, exc: BaseException, *, topic: str, address: str
) -> PublishFailed:
    """The broker at ``where`` refused the chunk for a reason retrying cannot fix."""
    return PublishFailed(
        f"{where} refused chunk {chunk_id!r}: {describe(exc)}",
        topic=topic,
        address=address,
        chunk_id=chunk_id,
    )


__all__ = [
    "BrokerUnavailable",
    "MessageTooLarge",
    "PublishError",
    "PublishFailed",
    "TopicNotFound",
    "describe",
    "refused",
    "short",
    "unanswered",
]
