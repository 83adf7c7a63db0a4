"""What the test models in ``deploy/models/`` compute, in plain numpy, importable by tests.

Each Triton ``model.py`` carries its own copy of the function below (a model file cannot import
this project); keep the copies identical. ``tests/integration/test_triton_smoke.py`` checks
that Triton's answers equal these functions' answers exactly.

- ``embedder`` / ``chaos``: :func:`embed` — hashed character 3-grams of ``"^^" + text + "$$"``
  (each 3-gram UTF-8 encoded, ``zlib.crc32`` modulo 384 picks a bucket, buckets count
  occurrences), then L2-normalised. The padding gives every text, the empty one included,
  at least two 3-grams, so the norm is never zero.
- ``scorer``: :func:`score` — ``SCORE = tanh(mean(FEATURES)) + 0.01 * log1p(max(COUNT, 0))``
  (computed in float64, returned as float32) and ``LABEL = 1 if SCORE > 0 else 0`` (int32).
- ``scorer`` version 2 (``harness/models/scorer_v2.py``, served beside version 1 by
  ``harness.model_repository.scorer_versions_repository``): :func:`score_v2` — :func:`score`
  except on the rows :func:`v2_differs` names (``COUNT % 10 == 7``), where ``SCORE`` is
  ``-|s| - 0.5`` if version 1's ``LABEL`` is 1 and ``|s| + 0.5`` if it is 0 (float32), so
  ``LABEL`` flips on every one of them and on no other row.
- ``fixed_latency``: ``SCORE`` of :func:`score` (no ``LABEL``), each execution lasting
  :func:`fixed_latency_batch_s` of wall time (asleep): a model whose ceiling does not move.
- ``expander``: :func:`expand` — ``Y[i, j] = sin(X[i] + j)`` for ``j < 2048`` (computed in
  float64, returned as float32): 8 bytes in, 8,192 bytes out per row, for memory-budget tests.
- ``expander_wide``: the same for ``j < 4096`` (:data:`EXPAND_WIDE_DIM`): 16,384 bytes out per
  row, outputs 2048x the inputs.
"""

from __future__ import annotations

import zlib

import numpy as np
import numpy.typing as npt

EMBEDDING_DIM = 384
FEATURE_DIM = 16
EXPAND_DIM = 2048
EXPAND_WIDE_DIM = 4096
V2_DIFFERS_MODULUS = 10
V2_DIFFERS = 7
"""``scorer`` version 2 differs from version 1 on the rows whose ``COUNT % V2_DIFFERS_MODULUS ==
V2_DIFFERS`` (numpy's floored modulo: a COUNT of -3 is one of them)."""


def embed(text: str) -> npt.NDArray[np.float32]:
    """The 384-float, L2-normalised embedding of one text."""
    padded = "^^" + text + "$$"
    counts = np.zeros(EMBEDDING_DIM, dtype=np.float64)
    for i in range(len(padded) - 2):
        counts[zlib.crc32(padded[i : i + 3].encode("utf-8")) % EMBEDDING_DIM] += 1.0
    return (counts / np.linalg.norm(counts)).astype(np.float32)


def embed_batch(texts: list[str]) -> npt.NDArray[np.float32]:
    """``embed`` for each text, stacked to shape ``[len(texts), 384]``."""
    return (
        np.stack([embed(t) for t in texts]) if texts else np.zeros((0, EMBEDDING_DIM), np.float32)
    )


def score(
    features: npt.NDArray[np.float32], count: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
    """``SCORE`` ``[n, 1]`` float32 and ``LABEL`` ``[n, 1]`` int32 for ``FEATURES`` ``[n, 16]``
    and ``COUNT`` ``[n, 1]``."""
    mean = features.astype(np.float64).mean(axis=1, keepdims=True)
    counts = np.maximum(count.astype(np.float64), 0.0)
    scores = (np.tanh(mean) + 0.01 * np.log1p(counts)).astype(np.float32)
    labels = (scores > 0).astype(np.int32)
    return scores, labels


def v2_differs(count: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which rows ``scorer`` version 2 answers differently from version 1 (same shape as
    ``count``): those whose ``COUNT % 10 == 7``."""
    return np.asarray(count % V2_DIFFERS_MODULUS == V2_DIFFERS, dtype=np.bool_)


def score_v2(
    features: npt.NDArray[np.float32], count: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.int32]]:
    """``SCORE`` and ``LABEL`` of ``scorer`` version 2, shaped as :func:`score`'s: version 1's
    answer, with ``SCORE`` moved across zero (by at least 0.5) on the rows :func:`v2_differs`
    names."""
    scores, labels = score(features, count)
    magnitude = np.abs(scores)
    flipped = np.where(labels == 1, -magnitude - np.float32(0.5), magnitude + np.float32(0.5))
    differs = v2_differs(count.reshape(scores.shape))
    scores = np.where(differs, flipped, scores).astype(np.float32)
    return scores, (scores > 0).astype(np.int32)


def expand(x: npt.NDArray[np.int64], dim: int = EXPAND_DIM) -> npt.NDArray[np.float32]:
    """``Y`` ``[n, dim]`` float32 for ``X`` ``[n, 1]`` (or ``[n]``) int64 (``expander``: 2048,
    ``expander_wide``: :data:`EXPAND_WIDE_DIM`)."""
    phase = x.astype(np.float64).reshape(-1, 1) + np.arange(dim, dtype=np.float64)
    return np.asarray(np.sin(phase), dtype=np.float32)


def fixed_latency_batch_s(rows: int, base_ms: float, per_row_us: float) -> float:
    """The wall time of one ``fixed_latency`` execution of ``rows`` rows (its config's
    ``execute_base_ms`` and ``execute_per_row_us``)."""
    return base_ms / 1e3 + rows * per_row_us / 1e6


def fixed_latency_ceiling(
    batch: int, base_ms: float, per_row_us: float, instances: int = 1
) -> float:
    """The analytic ceiling of ``fixed_latency`` in rows/s: ``instances`` executions of ``batch``
    rows at a time, back to back."""
    return instances * batch / fixed_latency_batch_s(batch, base_ms, per_row_us)
