"""Batches of many small messages: whole messages go into a batch without slicing, and the
batch counts its rows once; rows, nulls and segments are what slicing everything gives."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch, Batcher, Segment


def message(key: int, rows: int, nulls: bool) -> tuple[dict[str, NDArray[Any]], dict[str, Any]]:
    ids = np.arange(rows, dtype=np.int64) + 1000 * key
    columns: dict[str, NDArray[Any]] = {
        "id": ids,
        "v": np.repeat(ids[:, None], 3, axis=1).astype(np.float32),
    }
    masks = {"id": (ids % 3 == 0)} if nulls else {}
    return columns, masks


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 20), max_size=40),
    nulls=st.lists(st.booleans(), min_size=40, max_size=40),
    target=st.integers(1, 50),
)
def test_batches_hold_every_row_once_in_order(
    sizes: list[int], nulls: list[bool], target: int
) -> None:
    batcher = Batcher(target, 60.0, clock=lambda: 0.0)
    expected_ids: list[int] = []
    expected_null: list[bool] = []
    expected_rows: list[tuple[int, int]] = []
    for key, rows in enumerate(sizes):
        columns, masks = message(key, rows, nulls[key])
        batcher.add(key, columns, masks)
        expected_ids.extend(columns["id"].tolist())
        expected_null.extend((masks["id"] if masks else np.zeros(rows, np.bool_)).tolist())
        expected_rows.extend((key, i) for i in range(rows))
    batches: list[Batch] = []
    while (batch := batcher.ready()) is not None:
        batches.append(batch)
    batches.extend(batcher.drain())
    ids: list[int] = []
    null: list[bool] = []
    rows_seen: list[tuple[int, int]] = []
    for batch in batches:
        assert len(batch) <= target
        assert len(batch) == sum(len(s) for s in batch.segments) == len(batch.columns["id"])
        np.testing.assert_array_equal(batch.columns["v"][:, 0], batch.columns["id"])
        ids.extend(batch.columns["id"].tolist())
        mask = batch.nulls.get("id")
        null.extend((mask if mask is not None else np.zeros(len(batch), np.bool_)).tolist())
        for seg in batch.segments:
            rows_seen.extend((seg.message, i) for i in range(seg.start, seg.stop))
    assert ids == expected_ids
    assert null == expected_null
    assert rows_seen == expected_rows
    assert batcher.pending_rows == 0


def test_a_selected_batch_counts_its_own_rows() -> None:
    batcher = Batcher(10, 60.0, clock=lambda: 0.0)
    for key in range(5):
        batcher.add(key, message(key, 2, False)[0])
    batch = batcher.ready()
    assert batch is not None
    assert len(batch) == 10
    part = batch.select([Segment(1, 0, 2), Segment(3, 0, 2)])
    assert len(part) == 4
    assert part.columns["id"].tolist() == [1000, 1001, 3000, 3001]
