"""The Apache Kafka source (aiokafka): consumer-group polling with bounded read-ahead,
per-partition offset tracking, rebalances, dead letters to ``<topic>.dlq`` and lag.

One concern per module: ``source`` (``KafkaSource``, the ``Source`` protocol and its tasks),
``config`` (``KafkaSourceConfig``: timings, bounds, SASL/TLS), ``errors``, ``clients``
(starting and stopping the aiokafka consumer and producer), ``readahead`` (buffer, retries,
backpressure), ``records`` (a held record, its cost and its ``Delivery``), ``partitions``
(assignments, in-flight records, commits, the rebalance listener), ``offsets`` (the commit
rule), ``dead_letters`` (the ``rowbatch-dlq-*`` records), ``lag`` (the lag gauges),
``causes`` (why a broker could not be reached) and ``admin`` (creating and checking the
topics). The ``ATTR_*`` names are the dead-letter headers it writes (from
``rowbatch.wire.dead_letter``)."""

from rowbatch.consumer.sources.kafka.config import (
    KafkaSourceConfig,
    SaslMechanism,
    SecurityProtocol,
)
from rowbatch.consumer.sources.kafka.dead_letters import DLQ_MESSAGE_MAX_BYTES
from rowbatch.consumer.sources.kafka.errors import (
    DeadLetterFailed,
    KafkaConfigError,
    KafkaConsumeError,
    KafkaSourceError,
    KafkaUnreachable,
)
from rowbatch.consumer.sources.kafka.readahead import READ_AHEAD_SHARE
from rowbatch.consumer.sources.kafka.records import HEADER_OVERHEAD_BYTES, RECORD_OVERHEAD_BYTES
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.wire.dead_letter import (
    ATTR_CODE,
    ATTR_CONSUMER_VERSION,
    ATTR_DELIVERY_ATTEMPT,
    ATTR_GROUP,
    ATTR_MESSAGE,
    ATTR_MESSAGE_ID,
    ATTR_OFFSET,
    ATTR_PARTITION,
    ATTR_REASON,
    ATTR_SOURCE,
    ATTR_TIME,
    ATTR_TOPIC,
)

__all__ = [
    "ATTR_CODE",
    "ATTR_CONSUMER_VERSION",
    "ATTR_DELIVERY_ATTEMPT",
    "ATTR_GROUP",
    "ATTR_MESSAGE",
    "ATTR_MESSAGE_ID",
    "ATTR_OFFSET",
    "ATTR_PARTITION",
    "ATTR_REASON",
    "ATTR_SOURCE",
    "ATTR_TIME",
    "ATTR_TOPIC",
    "DLQ_MESSAGE_MAX_BYTES",
    "HEADER_OVERHEAD_BYTES",
    "READ_AHEAD_SHARE",
    "RECORD_OVERHEAD_BYTES",
    "DeadLetterFailed",
    "KafkaConfigError",
    "KafkaConsumeError",
    "KafkaSource",
    "KafkaSourceConfig",
    "KafkaSourceError",
    "KafkaUnreachable",
    "SaslMechanism",
    "SecurityProtocol",
]
