"""Dead letters of both Pub/Sub sources: the original payload and attributes plus the
``rowbatch-dlq-*`` ones, published to the dead-letter topic and confirmed before the original
is acked (``DeadLetters.forward``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pubsub_types
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from rowbatch.consumer.sources.base import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.clients import default_publisher
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
from rowbatch.wire.pubsub_env import project_of

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


def _publish(
    dlq_api: GapicPublisherClient, request: pubsub_types.PublishRequest, timeout: float
) -> None:
    """Blocking; runs in a worker thread. Retries transient errors until the timeout."""
    retry = Retry(
        predicate=if_exception_type(
            gexc.Aborted,
            gexc.DeadlineExceeded,
            gexc.InternalServerError,
            gexc.ResourceExhausted,
            gexc.ServiceUnavailable,
        ),
        initial=0.1,
        maximum=2.0,
        multiplier=2.0,
        timeout=timeout,
    )
    dlq_api.publish(request=request, retry=retry, timeout=min(timeout, 10.0))


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
    dlq_api: GapicPublisherClient,
    *,
    topic: str,
    delivery: Delivery,
    reason: DeadLetterReason,
    consumer_version: str,
    timeout_s: float,
) -> None:
    """Publish the original payload and attributes plus ``rowbatch-dlq-*`` attributes to
    ``topic`` and wait for the confirmation; raises ``DeadLetterFailed`` when it is not
    confirmed within ``timeout_s``. Through the plain GAPIC Publish RPC: the high-level
    ``publish(topic, data, **attrs)`` takes attributes as keyword arguments, so a poison
    message with an attribute named e.g. "data" or "timeout" could not be forwarded; and
    batching buys nothing for rare, individually confirmed messages."""
    attributes = dead_letter_attributes(delivery, reason, consumer_version)
    request = pubsub_types.PublishRequest(
        topic=topic,
        messages=[pubsub_types.PubsubMessage(data=delivery.payload, attributes=attributes)],
    )
    try:
        await asyncio.wait_for(asyncio.to_thread(_publish, dlq_api, request, timeout_s), timeout_s)
    except (TimeoutError, gexc.GoogleAPIError) as exc:
        raise DeadLetterFailed(
            f"dead-letter publish of message {delivery.message_id} to {topic} failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


class DeadLetters:
    """A source's way to its dead-letter topic: the publisher (built from the environment when
    none is given and a topic is configured; only that one is closed by ``close``) and the
    publish-then-ack sequence of ``Source.dead_letter``."""

    def __init__(
        self,
        publisher: pubsub_v1.PublisherClient | None,
        *,
        topic: str | None,
        consumer_version: str,
        timeout_s: float,
    ) -> None:
        self.topic = topic
        self._consumer_version = consumer_version
        self._timeout_s = timeout_s
        self._owned = publisher is None and topic is not None
        if self._owned:
            publisher = default_publisher(project_of(topic))
        self._publisher = publisher
        self.api: GapicPublisherClient | None = (
            GapicPublisherClient(transport=publisher.transport) if publisher is not None else None
        )
        """The plain GAPIC client on the publisher's channel (also used by the start-up
        check to look the topic up)."""

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
        if topic is None or self.api is None:
            warn_no_dead_letter_topic(delivery, reason)
            await nack(delivery)
            return
        await publish_dead_letter(
            self.api,
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

    def close(self) -> None:
        """Close the publisher's channel if this object built the publisher."""
        if self._owned and self._publisher is not None:
            self._publisher.transport.close()
