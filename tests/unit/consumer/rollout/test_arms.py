"""Rows' arms by key hash: the same in every process (pinned values), a larger share keeps a
smaller one's rows, the share is kept within sampling error, and a salt picks another subset."""

from __future__ import annotations

import numpy as np
import pytest

from rowbatch.consumer.rollout.arms import chunk_hash, in_share, key_places


def places(chunks: int, rows: int, salt: str = "") -> np.ndarray:
    ids = [f"chunk-{i}" for i in range(chunks)]
    return key_places(ids, [rows] * chunks, np.tile(np.arange(rows, dtype=np.int64), chunks), salt)


def test_places_are_pinned_so_every_process_and_release_agrees() -> None:
    # Python's hash() would differ per process; a change of the mix moves rows between arms.
    assert chunk_hash("chunk-0") == 0xD5CBEC1B8B770BB1
    got = key_places(["chunk-0", "chunk-1"], [2, 1], np.array([0, 1, 7], np.int64))
    assert got.tolist() == pytest.approx(
        [0.32549792066374916, 0.5957473679299826, 0.6881490151143896]
    )


def test_the_same_keys_land_in_the_same_places() -> None:
    assert np.array_equal(places(50, 20), places(50, 20))


def test_a_larger_share_keeps_every_row_of_a_smaller_one() -> None:
    p = places(200, 50)
    small, large = in_share(p, 0.1), in_share(p, 0.3)
    assert not (small & ~large).any()
    assert in_share(p, 1.0).all()


@pytest.mark.parametrize("share", [0.01, 0.1, 0.5])
def test_the_share_of_rows_is_kept(share: float) -> None:
    n = 100_000
    taken = in_share(places(1000, 100), share).mean()
    # 5 standard deviations of a binomial share.
    assert abs(taken - share) < 5 * (share * (1 - share) / n) ** 0.5


def test_one_row_messages_spread_too() -> None:
    assert abs(in_share(places(20_000, 1), 0.2).mean() - 0.2) < 0.02


def test_a_salt_picks_another_subset() -> None:
    a, b = in_share(places(100, 100), 0.1), in_share(places(100, 100, "v2"), 0.1)
    assert 0.05 < (a & b).sum() / a.sum() < 0.2  # independent: about a tenth overlap
