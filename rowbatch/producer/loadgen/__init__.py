"""A load generator for tests and benchmarks: a deterministic (seeded) table published in chunks at
a given rate or as fast as possible, with a chosen fraction of deliberately malformed messages
for dead-letter tests.

Tables (``kind``):

- ``text``: ``id`` int64, ``text`` string of ``width`` characters (64 by default): for the
  ``embedder`` and ``chaos`` models (input ``TEXT``);
- ``numeric``: ``id`` int64, ``features`` vector[float32, ``width``] (16 by default),
  ``count`` int64: for the ``scorer`` model (inputs ``FEATURES``, ``COUNT``).

``id`` is the row's position in the generated table (0, 1, ...), so every row is identifiable;
chunk ``i`` holds ids ``i * chunk_rows ...`` and has chunk id ``<id_prefix>:<i>``. The same seed
gives the same rows and the same choice of malformed chunks.

The malformed kinds and the dead-letter reason each gets are listed in
:mod:`rowbatch.producer.loadgen.malformed`.

Import a name from the module that defines it: this package re-exports nothing.
"""
