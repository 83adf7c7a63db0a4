"""``PubSubCalls`` on google-cloud-pubsub's blocking clients, in worker threads: for the
streaming source (which pulls through that library anyway) and for callers that pass their
own clients. The pull source, given none, uses ``GrpcCalls`` instead."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rowbatch.consumer.sources.pubsub.calls import SubscriptionInfo

if TYPE_CHECKING:
    from google.cloud import pubsub_v1


class LibraryCalls:
    """The subscription lookup on ``subscriber``; the topic lookup and Publish on the plain
    GAPIC client over ``publisher``'s channel (none without a publisher: those calls then
    fail). ``owns_publisher``: ``close`` closes the publisher's channel."""

    def __init__(
        self,
        subscriber: pubsub_v1.SubscriberClient,
        publisher: pubsub_v1.PublisherClient | None,
        *,
        owns_publisher: bool = False,
    ) -> None:
        from google.pubsub_v1.services.publisher import PublisherClient  # noqa: PLC0415

        self._subscriber = subscriber
        self._publisher = publisher
        self._owns_publisher = owns_publisher
        self._api: Any = (
            PublisherClient(transport=publisher.transport) if publisher is not None else None
        )
        """The plain GAPIC client: the high-level ``publish(topic, data, **attrs)`` takes
        attributes as keyword arguments, so a message with an attribute named e.g. "data"
        could not be forwarded."""

    async def get_subscription(self, subscription: str, timeout_s: float) -> SubscriptionInfo:
        found = await asyncio.to_thread(
            self._subscriber.get_subscription,
            request={"subscription": subscription},
            retry=None,
            timeout=timeout_s,
        )
        policy = found.dead_letter_policy
        topic = str(policy.dead_letter_topic) if policy else ""
        return SubscriptionInfo(
            ack_deadline_seconds=int(found.ack_deadline_seconds or 0),
            enable_message_ordering=bool(found.enable_message_ordering),
            dead_letter_topic=topic,
            max_delivery_attempts=int(policy.max_delivery_attempts) if topic else 0,
        )

    async def get_topic(self, topic: str, timeout_s: float) -> None:
        await asyncio.to_thread(
            self._api.get_topic, request={"topic": topic}, retry=None, timeout=timeout_s
        )

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], timeout_s: float
    ) -> None:
        request = {"topic": topic, "messages": [{"data": data, "attributes": dict(attributes)}]}
        await asyncio.to_thread(self._api.publish, request=request, retry=None, timeout=timeout_s)

    async def close(self) -> None:
        if self._owns_publisher and self._publisher is not None:
            self._publisher.transport.close()
