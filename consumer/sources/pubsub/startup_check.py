"""The start-up check both Pub/Sub sources run (``Source.check``): the server answers, the
subscription exists, and poison messages have somewhere to go."""

from __future__ import annotations

import logging
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry, if_exception_type
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from rowbatch.consumer.sources.pubsub.errors import (
    PubSubConfigError,
    PubSubSourceError,
    PubSubUnreachable,
)

_LOG = logging.getLogger(__name__)


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
