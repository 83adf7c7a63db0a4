"""The result builder's row indexes: one ``arange`` over a write's rows, shifted per segment,
equal to each segment's own ``arange`` joined (also for empty segments and offsets)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rowbatch.consumer.engine.row_keys import _row_indexes

segments = st.lists(st.tuples(st.integers(0, 10**12), st.integers(0, 40)), min_size=1, max_size=60)


@given(segments)
def test_row_indexes_equal_each_segment_s_range_joined(parts: list[tuple[int, int]]) -> None:
    starts = [start for start, _ in parts]
    lengths = [length for _, length in parts]
    want = np.concatenate([np.arange(s, s + n, dtype=np.int64) for s, n in parts])
    got = _row_indexes(starts, lengths)
    assert got.dtype == np.int64
    assert np.array_equal(got, want)
