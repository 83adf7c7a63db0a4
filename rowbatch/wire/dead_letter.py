"""The dead-letter side of the contract: why a message was dead-lettered (the reason classes
and their default fine codes) and the ``rowbatch-dlq-*`` attributes (Pub/Sub) or headers
(Kafka) written next to the original payload, so whoever reads the dead-letter topic can tell
what was wrong. docs/wire-format.md section 6 describes them."""

from __future__ import annotations

from enum import StrEnum


class ReasonClass(StrEnum):
    """Why a message went to the dead-letter topic (the ``rowbatch-dlq-reason`` attribute)."""

    UNDECODABLE = "undecodable"
    """The payload or its attributes break the wire contract (see rowbatch/wire/errors.py)."""
    SCHEMA_MISMATCH = "schema-mismatch"
    """Decodable, but its columns do not fit the model binding (missing column, wrong type)."""
    REJECTED_BY_MODEL = "rejected-by-model"
    """The inference server answered INVALID_ARGUMENT for this message's rows (isolated by
    bisecting the batch)."""
    TOO_MANY_ATTEMPTS = "too-many-attempts"
    """Delivered more times than ``max_delivery_attempts`` without being written."""
    REJECTED_BY_SINK = "rejected-by-sink"
    """The result table refused this message's rows for good (a value the database cannot
    store); isolated by bisecting the write, the database's message attached."""


#: The fine reason code when a dead-letter reason is given none (``rowbatch-dlq-code``).
DEFAULT_CODES: dict[ReasonClass, str] = {
    ReasonClass.UNDECODABLE: "wire_error",
    ReasonClass.SCHEMA_MISMATCH: "column_type_mismatch",
    ReasonClass.REJECTED_BY_MODEL: "invalid_argument",
    ReasonClass.TOO_MANY_ATTEMPTS: "too_many_attempts",
    ReasonClass.REJECTED_BY_SINK: "sink_rejected_value",
}

ATTR_REASON = "rowbatch-dlq-reason"
"""The reason class (:class:`ReasonClass` value)."""
ATTR_CODE = "rowbatch-dlq-code"
"""The fine reason code (docs/wire-format.md section 6), next to the coarse reason class."""
ATTR_MESSAGE = "rowbatch-dlq-message"
ATTR_SOURCE = "rowbatch-dlq-source"
ATTR_MESSAGE_ID = "rowbatch-dlq-message-id"
ATTR_DELIVERY_ATTEMPT = "rowbatch-dlq-delivery-attempt"
ATTR_CONSUMER_VERSION = "rowbatch-dlq-consumer-version"
ATTR_TIME = "rowbatch-dlq-time"
# Kafka only: where the record was, field by field.
ATTR_TOPIC = "rowbatch-dlq-topic"
ATTR_PARTITION = "rowbatch-dlq-partition"
ATTR_OFFSET = "rowbatch-dlq-offset"
ATTR_GROUP = "rowbatch-dlq-group"
