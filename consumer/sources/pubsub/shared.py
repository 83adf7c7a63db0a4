"""What both Pub/Sub sources share (streaming pull, ``pubsub.py``; unary pull,
``pubsub_pull.py``): errors, dead-letter attributes and publishing, the start-up check, and
clients built from the environment."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from datetime import UTC, datetime
from typing import Any

import grpc
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pubsub_types
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from consumer.sources.base import (
    DeadLetterFailed as BaseDeadLetterFailed,
)
from consumer.sources.base import (
    DeadLetterReason,
    Delivery,
    SourceConfigError,
    SourceError,
    SourceUnreachable,
)
from wire.dead_letter import (
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

SUBSCRIPTION_RE = re.compile(r"^projects/[^/]+/subscriptions/[^/]{3,}$")
TOPIC_RE = re.compile(r"^projects/[^/]+/topics/[^/]{3,}$")
DLQ_MESSAGE_MAX_BYTES = 1024
"""Pub/Sub's limit for one attribute value; the reason message is cut to fit."""


class PubSubSourceError(SourceError):
    """Base class for errors raised by the Pub/Sub sources."""


class PubSubConfigError(PubSubSourceError, SourceConfigError):
    """The configuration, or the subscription/topic it names, cannot work."""


class PubSubUnreachable(PubSubSourceError, SourceUnreachable):
    """The Pub/Sub service (or emulator) did not answer."""


class DeadLetterFailed(PubSubSourceError, BaseDeadLetterFailed):
    """The dead-letter publish to PubSub was not confirmed (see the base class)."""


# Streaming-pull responses carry up to ~10 MB of messages (more with attributes): gRPC's
# default 4 MiB receive limit would make the stream fail and reopen forever, silently.
UNLIMITED_MESSAGES = (("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1))


def emulator_channel() -> grpc.Channel | None:
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    return grpc.insecure_channel(host, options=UNLIMITED_MESSAGES) if host else None


def default_subscriber() -> pubsub_v1.SubscriberClient:
    """A subscriber from the environment (``PUBSUB_EMULATOR_HOST`` selects an emulator, with
    no message size limit; otherwise Google's defaults, which have none either)."""
    channel = emulator_channel()
    if channel is None:
        return pubsub_v1.SubscriberClient()
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def default_publisher() -> pubsub_v1.PublisherClient:
    channel = emulator_channel()
    if channel is None:
        return pubsub_v1.PublisherClient()
    return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel))


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
    message with an attribute named e.g. "data" or "timeout" could not be forwarded."""
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


def _lookup_error(exc: Exception, what: str, timeout: float, host: str) -> PubSubSourceError:
    """The start-up check's error for a failed lookup of ``what``."""
    if isinstance(exc, gexc.NotFound):
        return PubSubConfigError(f"{what} does not exist on {host}")
    if isinstance(exc, gexc.RetryError | gexc.ServiceUnavailable | gexc.DeadlineExceeded):
        return PubSubUnreachable(
            f"Pub/Sub at {host} did not answer within {timeout:g} s (checking {what}): {exc}"
        )
    return PubSubConfigError(f"cannot read {what} on {host}: {exc}")


def check_subscription(
    subscriber: pubsub_v1.SubscriberClient,
    dlq_api: GapicPublisherClient | None,
    *,
    subscription: str,
    dead_letter_topic: str | None,
    max_delivery_attempts: int | None,
    host: str,
    timeout: float,
) -> Any:
    """Blocking start-up check: the server answers, the subscription exists, the dead-letter
    topic exists (or, without one, the subscription has a dead-letter policy). Raises
    ``PubSubUnreachable`` or ``PubSubConfigError`` naming what is wrong; returns the
    subscription (``google.pubsub_v1.types.Subscription``)."""
    retry = Retry(
        predicate=if_exception_type(gexc.ServiceUnavailable, gexc.DeadlineExceeded),
        initial=0.1,
        maximum=1.0,
        multiplier=2.0,
        timeout=timeout,
    )
    per_call = min(timeout, 5.0)
    try:
        found = subscriber.get_subscription(
            request={"subscription": subscription}, retry=retry, timeout=per_call
        )
    except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
        raise _lookup_error(exc, f"Pub/Sub subscription {subscription}", timeout, host) from exc

    policy = found.dead_letter_policy
    policy_topic = str(policy.dead_letter_topic) if policy else ""
    policy_attempts = int(policy.max_delivery_attempts) if policy_topic else 0
    if dead_letter_topic is None:
        if not policy_topic:
            raise PubSubConfigError(
                f"no dead_letter_topic configured and subscription {subscription} has no "
                f"dead-letter policy: poison messages would be redelivered forever; "
                f"configure dead_letter_topic"
            )
        _LOG.warning(
            "no dead_letter_topic configured: poison messages from %s are nacked and moved "
            "to %s by the subscription's policy after %d attempts, without a reason",
            subscription,
            policy_topic,
            policy_attempts,
        )
    elif dlq_api is not None:
        try:
            dlq_api.get_topic(request={"topic": dead_letter_topic}, retry=retry, timeout=per_call)
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            what = f"dead-letter topic {dead_letter_topic}"
            raise _lookup_error(exc, what, timeout, host) from exc

    if max_delivery_attempts is not None:
        if not policy_topic:
            _LOG.warning(
                "max_delivery_attempts=%d has no effect: subscription %s has no dead-letter "
                "policy, so Pub/Sub does not count delivery attempts",
                max_delivery_attempts,
                subscription,
            )
        elif max_delivery_attempts >= policy_attempts:
            _LOG.warning(
                "max_delivery_attempts=%d is not below the dead-letter policy's %d on %s: "
                "Pub/Sub moves such messages before the consumer can attach a reason",
                max_delivery_attempts,
                policy_attempts,
                subscription,
            )
    return found
