"""Dead letters of both Pub/Sub sources: the original payload and attributes plus the
``rowbatch-dlq-*`` ones, published to the dead-letter topic and confirmed before the original
is acked (``DeadLetters.forward``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.calls import PubSubCalls, retried
from rowbatch.consumer.sources.pubsub.errors import DeadLetterFailed
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
)

_LOG = logging.getLogger(__name__)

DLQ_MESSAGE_MAX_BYTES = 1024
"""Pub/Sub's limit for one attribute value; the reason message is cut to fit."""


def dead_letter_attributes(
    delivery: Delivery, reason: DeadLetterReason, consumer_version: str
) -> dict[str, str]:
    """The original attributes plus the ``rowbatch-dlq-*`` ones (ours win on a clash)."""
    message = reason.message.encode("utf-8")[:DLQ_MESSAGE_MAX_BYTES]
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {
        **delivery.attributes,
        ATTR_REASON: reason.reason_class.value,
        ATTR_CODE: reason.code,
        ATTR_MESSAGE: message.decode("utf-8", errors="ignore"),
        ATTR_SOURCE: delivery.source,
        ATTR_MESSAGE_ID: delivery.message_id,
        ATTR_DELIVERY_ATTEMPT: str(delivery.delivery_attempt),
        ATTR_CONSUMER_VERSION: consumer_version,
        ATTR_TIME: now,
    }


_RETRY_ON = (
    gexc.Aborted,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.ResourceExhausted,
    gexc.ServiceUnavailable,
)
"""Publish outcomes worth retrying until the dead letter's timeout."""


def warn_no_dead_letter_topic(delivery: Delivery, reason: DeadLetterReason) -> None:
    """Logs that ``delivery`` is nacked instead of dead-lettered (no topic configured)."""
    _LOG.warning(
        "no dead-letter topic configured: nacking message %s from %s (%s: %s); the "
        "subscription's dead-letter policy moves it after its max delivery attempts",
        delivery.message_id,
        delivery.source,
        reason.reason_class.value,
        reason.message,
    )


async def publish_dead_letter(
    calls: PubSubCalls,
    *,
    topic: str,
    delivery: Delivery,
    reason: DeadLetterReason,
    consumer_version: str,
    timeout_s: float,
) -> None:
    """Publish the original payload and attributes plus ``rowbatch-dlq-*`` attributes to
    ``topic`` and wait for the confirmation (transient errors retried, 0.1 s doubling up to
    2 s); raises ``DeadLetterFailed`` when it is not confirmed within ``timeout_s``. One
    Publish call a message: batching buys nothing for rare, individually confirmed ones."""
    attributes = dead_letter_attributes(delivery, reason, consumer_version)
    per_call = min(timeout_s, 10.0)

    def publish() -> Awaitable[None]:
        return calls.publish(topic, delivery.payload, attributes, per_call)

    try:
        await asyncio.wait_for(
            retried(publish, retry_on=_RETRY_ON, timeout_s=timeout_s, max_wait_s=2.0), timeout_s
        )
    except (TimeoutError, gexc.GoogleAPIError) as exc:
        raise DeadLetterFailed(
            f"dead-letter publish of message {delivery.message_id} to {topic} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


class DeadLetters:
    """A source's way to its dead-letter topic: the publish-then-ack sequence of
    ``Source.dead_letter`` on the source's ``PubSubCalls`` (which the source closes)."""

    def __init__(
        self,
        calls: PubSubCalls | None,
        *,
        topic: str | None,
        consumer_version: str,
        timeout_s: float,
    ) -> None:
        self.topic = topic
        self._consumer_version = consumer_version
        self._timeout_s = timeout_s
        self.calls = calls
        """Where Publish goes; None (unit tests with a fake Pull client only): a dead letter
        is nacked instead."""

    @property
    def publishes(self) -> bool:
        """Whether there is a dead-letter topic to publish to (rows included)."""
        return self.topic is not None and self.calls is not None

    async def publish_rows(
        self,
        delivery: Delivery,
        payload: bytes,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
    ) -> None:
        """Publish a row part of ``delivery`` (``payload``, ``attributes``) with ``reason`` as
        its dead letter would be, and wait for the confirmation; the delivery stays unsettled.
        ``DeadLetterFailed`` when it is not confirmed."""
        if self.topic is None or self.calls is None:
            raise DeadLetterFailed(f"no dead-letter topic for the rows of {delivery.message_id}")
        await publish_dead_letter(
            self.calls,
            topic=self.topic,
            delivery=replace(delivery, payload=payload, attributes=dict(attributes)),
            reason=reason,
            consumer_version=self._consumer_version,
            timeout_s=self._timeout_s,
        )

    async def forward(
        self,
        delivery: Delivery,
        reason: DeadLetterReason,
        *,
        nack: Callable[[Delivery], Awaitable[None]],
        ack_if_held: Callable[[Delivery], bool],
    ) -> None:
        """Publish ``delivery`` with ``reason`` and wait for the confirmation, then ack it
        with ``ack_if_held`` (false: settled meanwhile, e.g. nacked by ``close``; it then
        comes back and is dead-lettered again). Raises ``DeadLetterFailed`` (delivery left
        unsettled) when the publish is not confirmed in time. Without a dead-letter topic,
        ``nack`` instead: the subscription's policy moves the message after its max
        delivery attempts, without the reason."""
        topic = self.topic
        if topic is None or self.calls is None:
            warn_no_dead_letter_topic(delivery, reason)
            await nack(delivery)
            return
        await publish_dead_letter(
            self.calls,
            topic=topic,
            delivery=delivery,
            reason=reason,
            consumer_version=self._consumer_version,
            timeout_s=self._timeout_s,
        )
        if not ack_if_held(delivery):
            _LOG.warning(
                "message %s was dead-lettered to %s but settled meanwhile (close?): not acked",
                delivery.message_id,
                topic,
            )
