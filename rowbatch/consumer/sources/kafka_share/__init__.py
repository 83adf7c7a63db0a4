"""A Kafka share group (KIP-932, "queues for Kafka"; ``kind = "kafka-share"``, experimental
while confluent-kafka's share consumer is Preview): any number of members take records from
the same partitions under a time-limited lock, and each record ends accepted, released or
rejected. docs/kafka-share.md."""
