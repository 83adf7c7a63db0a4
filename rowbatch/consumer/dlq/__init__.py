"""``rowbatch-consumer dlq``: the operator's tools for dead letters. ``stats`` counts them by
reason, table, source and consumer version; ``show`` prints a few with their headers and a
decoded preview of their rows; ``replay`` publishes the chosen ones back to the source topic
(payload and attributes as they were, minus the ``rowbatch-dlq-*`` ones) and only then removes
them from the dead-letter queue. ``letters`` is the value every command works on, ``queue`` the
seam each broker implements (``kafka_queue``, ``pubsub_queue``); docs/dead-letters.md says how
each broker is read without consuming and what a crash in the middle of a replay does. Copies
of one letter (the queue is at-least-once: ``DeadLetter.identity``) are counted, shown and
published once, and every copy is removed once that publish is confirmed."""
