"""The Apache Kafka source (aiokafka): consumer-group polling with bounded read-ahead,
per-partition offset tracking, rebalances, dead letters to ``<topic>.dlq`` and lag.

One concern per module: ``source`` (``KafkaSource``, the ``Source`` protocol and its tasks),
``settings`` (``KafkaSettings``, the ``[source]`` section: timings, bounds, SASL/TLS),
``errors``, ``clients`` (starting and stopping the aiokafka consumer and producer),
``readahead`` (buffer, retries, backpressure), ``records`` (a held record, its cost and its
``Delivery``), ``partitions`` (assignments, in-flight records, commits, the rebalance
listener), ``offsets`` (the commit rule), ``dead_letters`` (the ``rowbatch-dlq-*`` records,
headers from ``rowbatch.wire.dead_letter``), ``lag`` (the lag gauges), ``causes`` (why a broker
could not be reached) and ``admin`` (creating and checking the topics). Import a name from the
module that defines it: this package re-exports nothing, so importing the settings costs no
broker client."""
