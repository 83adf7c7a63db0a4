"""The ``rowbatch-dlq-*`` attributes of a Pub/Sub dead letter for a message dead-lettered as
too many attempts (the integration tests read back other reason classes; this one moved here
from the pull source's removed dead-letter test, see test_source_contract.py)."""

from __future__ import annotations

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.pubsub.dead_letters import dead_letter_attributes
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_MESSAGE_ID,
    ATTR_REASON,
    ReasonClass,
)


def test_too_many_attempts_carries_its_class_default_code_and_the_counted_attempt() -> None:
    delivery = Delivery(
        message_id="42",
        payload=b"\x00poison",
        attributes={"data": "x"},
        publish_time=0.0,
        delivery_attempt=3,
        source="projects/p/subscriptions/sub",
    )
    reason = DeadLetterReason(ReasonClass.TOO_MANY_ATTEMPTS, "delivered 3 times")
    attrs = dead_letter_attributes(delivery, reason, "test-9.9.9")
    assert attrs["data"] == "x"
    assert attrs[ATTR_REASON] == "too-many-attempts"
    assert attrs[ATTR_CODE] == "too_many_attempts"
    assert attrs[ATTR_MESSAGE_ID] == "42"
    assert attrs[ATTR_DELIVERY_ATTEMPT] == "3"
