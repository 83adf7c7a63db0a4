"""Publishing chunks: a :class:`Publisher` protocol, one module per broker (``pubsub``,
``kafka``), and the helpers the CLI builds on (:func:`publish_rows`, :class:`PublishWindow`).

Both publishers

- check at :meth:`~Publisher.start` that the broker answers (within ``connect_timeout_s``, else
  :class:`BrokerUnavailable` naming the address) and that the topic exists (else
  :class:`TopicNotFound` naming the topic);
- retry transient errors with tenacity (bounded by :class:`PublishRetry`: attempts and seconds)
  and raise permanent ones as :class:`PublishFailed` naming the topic and the chunk id;
- re-send a chunk with the same payload and chunk id on retry, so the consumer, which keys its
  results by chunk id, writes each row once even when a retry duplicates a message;
- report :attr:`~Publisher.max_chunk_bytes`, the largest :attr:`EncodedChunk.size` that fits one
  message, which :func:`publish_rows` hands to :func:`~rowbatch.wire.chunks.split.split_rows`.

Usage::

    async with KafkaPublisher("localhost:9092", "rows") as pub:
        await publish_rows(pub, "orders", {"id": ids, "text": texts}, "arrow", "orders-db:1")

Import a name from the module that defines it: this package re-exports nothing.
"""
