"""Apache Kafka for tests and the local stack: one real broker, KRaft mode, single node.

The broker is the real ``kafka.Kafka`` from Maven Central, run on the JVM with its jars cached
(``jars``); it is configured for tests (``config``), launched, restarted and crashed as a
process (``broker``: :class:`KafkaService`, returning a :class:`KafkaEndpoint`), and topics are
made with :func:`create_topic` (``admin``), which waits until every partition has a leader.

Share groups (KIP-932) need a newer broker than the default one: ``share`` runs one on
:data:`SHARE_KAFKA_VERSION` and sets and reads share groups' configs and lag (it imports
confluent-kafka, so it is not imported here).
"""

from harness.kafka.admin import admin_client, create_topic
from harness.kafka.broker import KafkaService
from harness.kafka.config import random_cluster_id, server_properties
from harness.kafka.endpoint import KafkaEndpoint
from harness.kafka.jars import KAFKA_VERSION, SHARE_KAFKA_VERSION, kafka_libs

__all__ = [
    "KAFKA_VERSION",
    "SHARE_KAFKA_VERSION",
    "KafkaEndpoint",
    "KafkaService",
    "admin_client",
    "create_topic",
    "kafka_libs",
    "random_cluster_id",
    "server_properties",
]
