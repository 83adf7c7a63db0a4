"""rowbatch producer: the publishing side. ``publishers`` (Pub/Sub, Kafka, and what they share),
``readers`` (CSV, JSON Lines, Parquet input), ``loadgen`` (generated tables), ``cli`` (the
``rowbatch-producer`` command); the wire contract it encodes is :mod:`rowbatch.wire`."""
