"""The errors the Pub/Sub sources raise, each also one of the broker-neutral errors of
``rowbatch.consumer.sources.base``, and the two complaints both sources make about a delivery."""

from __future__ import annotations

import logging

from rowbatch.consumer.sources.base import DeadLetterFailed as BaseDeadLetterFailed
from rowbatch.consumer.sources.base import SourceConfigError, SourceError, SourceUnreachable
from rowbatch.consumer.sources.delivery import Delivery


class PubSubSourceError(SourceError):
    """Base class for errors raised by the Pub/Sub sources."""


class PubSubConfigError(PubSubSourceError, SourceConfigError):
    """The configuration, or the subscription/topic it names, cannot work."""


class PubSubCredentialsError(PubSubConfigError):
    """No Google credentials and no emulator named: the message says what to set."""


class PubSubUnreachable(PubSubSourceError, SourceUnreachable):
    """The Pub/Sub service (or emulator) did not answer."""


class DeadLetterFailed(PubSubSourceError, BaseDeadLetterFailed):
    """The dead-letter publish to PubSub was not confirmed (see the base class)."""


class PubSubStreamError(PubSubSourceError):
    """The streaming pull stopped on an error it does not recover from (e.g. the subscription
    was deleted, or permission was revoked)."""


class PubSubPullError(PubSubSourceError):
    """Pull failed for good (the subscription was deleted, permission was revoked)."""


def not_held(delivery: Delivery) -> ValueError:
    """What ``ack``, ``nack`` and ``dead_letter`` raise for a delivery the source does not hold."""
    return ValueError(
        f"message {delivery.message_id} is not held by this source (already settled, "
        f"nacked by close(), or delivered by another source)"
    )


def warn_lease_lapsed(log: logging.Logger, delivery: Delivery, max_lease_duration_s: float) -> None:
    """Logs that a buffered ``delivery`` outlived ``max_lease_duration_s`` and is nacked instead
    of yielded (its lease is gone and Pub/Sub redelivers it)."""
    log.warning(
        "message %s waited in the buffer past max_lease_duration_s=%g: its lease was "
        "dropped, nacking it for redelivery",
        delivery.message_id,
        max_lease_duration_s,
    )
