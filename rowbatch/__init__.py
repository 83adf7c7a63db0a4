"""rowbatch: near-real-time batch inference from Pub/Sub or Kafka to Triton into result tables.

The one installed package. Its parts live in the repository's top-level folders, which this
folder links in (``rowbatch/consumer -> ../consumer`` and so on; docs/architecture.md, "Layout"):

- :mod:`rowbatch.wire`: the row-chunk contract both sides share (docs/wire-format.md);
- :mod:`rowbatch.producer`: the publishing library and the ``rowbatch-producer`` command;
- :mod:`rowbatch.consumer`: the subscriber service, the ``rowbatch-consumer`` command.

The test harness (``harness/``) and the benchmarks (``bench/``) are not part of it: they stay in
the repository for development (scripts/setup.sh puts them on the venv's path).
"""
