"""The start-up check both Pub/Sub sources run (``Source.check``): the server answers, the
subscription exists, and poison messages have somewhere to go."""

from __future__ import annotations

import logging

from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.pubsub.calls import PubSubCalls, SubscriptionInfo, retried
from rowbatch.consumer.sources.pubsub.errors import (
    PubSubConfigError,
    PubSubSourceError,
    PubSubUnreachable,
)

_LOG = logging.getLogger(__name__)

_RETRY_ON = (gexc.ServiceUnavailable, gexc.DeadlineExceeded)


def _lookup_error(exc: Exception, what: str, timeout: float, host: str) -> PubSubSourceError:
    """The start-up check's error for a failed lookup of ``what``."""
    if isinstance(exc, gexc.NotFound):
        return PubSubConfigError(f"{what} does not exist on {host}")
    if isinstance(exc, gexc.ServiceUnavailable | gexc.DeadlineExceeded | TimeoutError):
        return PubSubUnreachable(
            f"Pub/Sub at {host} did not answer within {timeout:g} s (checking {what}): {exc}"
        )
    return PubSubConfigError(f"cannot read {what} on {host}: {exc}")


async def check_subscription(
    calls: PubSubCalls,
    *,
    subscription: str,
    dead_letter_topic: str | None,
    max_delivery_attempts: int | None,
    host: str,
    timeout: float,  # noqa: ASYNC109 (the whole check's limit, retries included)
) -> SubscriptionInfo:
    """Start-up check: the server answers, the subscription exists, the dead-letter topic
    exists (or, without one, the subscription has a dead-letter policy). Raises
    ``PubSubUnreachable`` or ``PubSubConfigError`` naming what is wrong; returns the
    subscription. An unanswered lookup is retried (0.1 s doubling up to 1 s) until
    ``timeout``."""
    per_call = min(timeout, 5.0)
    what = f"Pub/Sub subscription {subscription}"
    try:
        found = await retried(
            lambda: calls.get_subscription(subscription, per_call),
            retry_on=_RETRY_ON,
            timeout_s=timeout,
            max_wait_s=1.0,
        )
    except gexc.GoogleAPICallError as exc:
        raise _lookup_error(exc, what, timeout, host) from exc

    policy_topic = found.dead_letter_topic
    policy_attempts = found.max_delivery_attempts
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
    else:
        topic = dead_letter_topic
        try:
            await retried(
                lambda: calls.get_topic(topic, per_call),
                retry_on=_RETRY_ON,
                timeout_s=timeout,
                max_wait_s=1.0,
            )
        except gexc.GoogleAPICallError as exc:
            raise _lookup_error(exc, f"dead-letter topic {topic}", timeout, host) from exc

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
