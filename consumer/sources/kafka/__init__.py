"""The Apache Kafka source (aiokafka): consumer-group polling with bounded read-ahead,
per-partition offset tracking, rebalances, dead letters to ``<topic>.dlq`` and lag."""
