"""Which rows a rollout's candidate sees: a row's place in ``[0, 1)`` is a hash of its key
(chunk id and row index, with the rollout's salt), the same in every process and after every
redelivery, and the candidate takes the rows below its share, so a larger share keeps every
row of a smaller one."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def chunk_hash(chunk_id: str, salt: str = "") -> int:
    """64 bits of BLAKE2b over the salt and the chunk id (Python's ``hash`` differs between
    processes)."""
    digest = hashlib.blake2b(chunk_id.encode(), digest_size=8, key=salt.encode()[:64])
    return int.from_bytes(digest.digest(), "little")


def key_places(
    chunk_ids: Sequence[str],
    lengths: Sequence[int],
    row_index: NDArray[np.int64],
    salt: str = "",
) -> NDArray[np.float64]:
    """Each row's place in ``[0, 1)``: its chunk's hash (one per segment of ``lengths`` rows)
    mixed with its row index by SplitMix64's finalizer, as 53 bits."""
    chunks = np.array([chunk_hash(c, salt) for c in chunk_ids], dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = np.repeat(chunks, lengths) ^ (row_index.astype(np.uint64) * _GOLDEN)
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        x ^= x >> np.uint64(31)
    places: NDArray[np.float64] = (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return places


def in_share(places: NDArray[np.float64], share: float) -> NDArray[np.bool_]:
    """The rows a share takes: those placed below it (all of them at share 1)."""
    if share >= 1.0:
        return np.ones(places.shape, dtype=np.bool_)
    return places < share
