"""What both Pub/Sub sources (streaming pull, ``streaming.py``; unary pull, ``pull.py``) answer
the same way from their settings alone: whether a delivery is past ``max_delivery_attempts``,
its dead-letter attributes, and the start-up check of the subscription."""

from __future__ import annotations

from collections.abc import Mapping

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.calls import PubSubCalls, SubscriptionInfo
from rowbatch.consumer.sources.pubsub.dead_letters import DeadLetters, dead_letter_attributes
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.startup_check import check_subscription


class PubSubSourceBase:
    """Base of both Pub/Sub sources; each sets these attributes in its ``__init__``."""

    config: PubSubSettings
    consumer_version: str
    """Written to ``rowbatch-dlq-consumer-version``."""
    host: str
    """Where the service is, for error messages."""
    _calls: PubSubCalls | None
    """The start-up check's lookups and the dead letters' Publish; None (tests with a fake
    Pull client only): nothing is checked."""
    _dead_letters: DeadLetters

    def exceeded_attempts(self, delivery: Delivery) -> bool:
        """True when ``max_delivery_attempts`` is set and this delivery is beyond it."""
        limit = self.config.max_delivery_attempts
        return limit is not None and delivery.delivery_attempt > limit

    def dead_letter_attributes(
        self, delivery: Delivery, reason: DeadLetterReason
    ) -> dict[str, str]:
        """The original attributes plus the ``rowbatch-dlq-*`` ones (ours win on a clash)."""
        return dead_letter_attributes(delivery, reason, self.consumer_version)

    @property
    def dead_letters_rows(self) -> bool:
        """Rows can be dead-lettered on their own (``DeadLettersRows``): there is a topic."""
        return self._dead_letters.publishes

    async def dead_letter_rows(
        self,
        delivery: Delivery,
        payload: bytes,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
    ) -> None:
        """Publish a row part of ``delivery`` to the dead-letter topic, confirmed; the delivery
        stays unsettled (``DeadLettersRows``)."""
        await self._dead_letters.publish_rows(delivery, payload, attributes, reason)

    @property
    def _sub(self) -> str:
        return self.config.subscription

    async def _check_subscription(self) -> SubscriptionInfo | None:
        """Start-up check (``check_subscription``) of the subscription and the dead-letter
        topic; returns the subscription (None without calls)."""
        if self._calls is None:
            return None
        return await check_subscription(
            self._calls,
            subscription=self._sub,
            dead_letter_topic=self.config.dead_letter_topic,
            max_delivery_attempts=self.config.max_delivery_attempts,
            host=self.host,
            timeout=self.config.check_timeout_s,
        )
