"""The errors the Kafka source raises; each also refines the generic source error of
``rowbatch.consumer.sources.base`` that callers catch for any broker."""

from __future__ import annotations

from rowbatch.consumer.sources.base import DeadLetterFailed as BaseDeadLetterFailed
from rowbatch.consumer.sources.base import SourceConfigError, SourceError, SourceUnreachable


class KafkaSourceError(SourceError):
    """Base class for errors raised by ``KafkaSource``."""


class KafkaConfigError(KafkaSourceError, SourceConfigError):
    """The configuration, or the topics it names, cannot work."""


class KafkaUnreachable(KafkaSourceError, SourceUnreachable):
    """The brokers did not answer (or refused the connection/authentication)."""


class KafkaConsumeError(KafkaSourceError):
    """Consuming stopped on an error aiokafka does not recover from (authorization, a record
    larger than the fetch limit, no offset reset policy...)."""


class DeadLetterFailed(KafkaSourceError, BaseDeadLetterFailed):
    """The dead-letter publish to Kafka was not confirmed (see the base class)."""


__all__ = [
    "DeadLetterFailed",
    "KafkaConfigError",
    "KafkaConsumeError",
    "KafkaSourceError",
    "KafkaUnreachable",
]
