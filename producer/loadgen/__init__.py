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
"""

from __future__ import annotations

from rowbatch.producer.loadgen.generate import generate_columns
from rowbatch.producer.loadgen.malformed import expected_reason, plan_malformed
from rowbatch.producer.loadgen.manifest import Manifest
from rowbatch.producer.loadgen.plan import PlannedMessage, plan_chunk, plan_messages
from rowbatch.producer.loadgen.rate import RateLimiter
from rowbatch.producer.loadgen.run import publish_load
from rowbatch.producer.loadgen.spec import (
    DECODE_KINDS,
    DEFAULT_REJECT_MARKER,
    LoadKind,
    LoadSpec,
    MalformedKind,
)

__all__ = [
    "DECODE_KINDS",
    "DEFAULT_REJECT_MARKER",
    "LoadKind",
    "LoadSpec",
    "MalformedKind",
    "Manifest",
    "PlannedMessage",
    "RateLimiter",
    "expected_reason",
    "generate_columns",
    "plan_chunk",
    "plan_malformed",
    "plan_messages",
    "publish_load",
]
