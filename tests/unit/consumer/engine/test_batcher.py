from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batcher


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cols(message: int, rows: int) -> dict[str, NDArray[Any]]:
    return {
        "id": np.arange(rows, dtype=np.int64) + message * 1000,
        "text": np.array([f"m{message}r{i}" for i in range(rows)], dtype=object),
    }


def test_flushes_full_batches_across_messages() -> None:
    clock = FakeClock()
    b = Batcher(target=4, max_wait_s=0.1, clock=clock)
    b.add(1, cols(1, 3))
    assert b.ready() is None
    b.add(2, cols(2, 3))
    batch = b.ready()
    assert batch is not None
    assert len(batch) == 4
    assert [(s.message, s.start, s.stop) for s in batch.segments] == [(1, 0, 3), (2, 0, 1)]
    assert list(batch.columns["id"]) == [1000, 1001, 1002, 2000]
    assert b.pending_rows == 2
    assert b.ready() is None


def test_partial_batch_after_max_wait_of_oldest_row() -> None:
    clock = FakeClock()
    b = Batcher(target=100, max_wait_s=0.1, clock=clock)
    b.add(1, cols(1, 5))
    clock.now += 0.05
    b.add(2, cols(2, 5))
    assert b.next_deadline() == pytest.approx(1000.1)
    clock.now += 0.049
    assert b.ready() is None
    clock.now += 0.002
    batch = b.ready()
    assert batch is not None
    assert len(batch) == 10
    assert batch.oldest_at == 1000.0
    assert b.next_deadline() is None


def test_empty_message_adds_nothing_and_mismatched_lengths_fail() -> None:
    b = Batcher(target=2, max_wait_s=0, clock=FakeClock())
    b.add(1, cols(1, 0))
    assert b.pending_rows == 0
    with pytest.raises(ValueError, match="different lengths"):
        b.add(2, {"a": np.zeros(2), "b": np.zeros(3)})


def test_nulls_follow_their_rows() -> None:
    b = Batcher(target=4, max_wait_s=1, clock=FakeClock())
    b.add(1, cols(1, 2))
    b.add(2, cols(2, 2), {"text": np.array([False, True])})
    batch = b.ready()
    assert batch is not None
    assert list(batch.nulls["text"]) == [False, False, False, True]
    first_half = batch.select(batch.segments[:1])
    assert first_half.nulls == {}
    second = batch.select(batch.segments[1:])
    assert list(second.columns["id"]) == [2000, 2001]
    assert list(second.nulls["text"]) == [False, True]


def test_discard_drops_pending_rows_of_one_message() -> None:
    b = Batcher(target=10, max_wait_s=1, clock=FakeClock())
    b.add(1, cols(1, 3))
    b.add(2, cols(2, 3))
    assert b.discard(1) == 3
    assert b.pending_rows == 3
    (batch,) = b.drain()
    assert {s.message for s in batch.segments} == {2}


def test_invalid_settings() -> None:
    with pytest.raises(ValueError, match="target size"):
        Batcher(target=0, max_wait_s=1)
    with pytest.raises(ValueError, match="max_wait"):
        Batcher(target=1, max_wait_s=-1)


@given(
    sizes=st.lists(st.integers(min_value=0, max_value=50), max_size=30),
    target=st.integers(min_value=1, max_value=64),
)
def test_every_row_comes_out_once_in_order(sizes: list[int], target: int) -> None:
    b = Batcher(target=target, max_wait_s=10, clock=FakeClock())
    batches = []
    for message, n in enumerate(sizes):
        b.add(message, cols(message, n))
        while (batch := b.ready()) is not None:
            assert len(batch) == target
            batches.append(batch)
    tail = b.drain()
    assert all(0 < len(x) <= target for x in tail)
    batches += tail
    got = [int(x) for batch in batches for x in batch.columns["id"]]
    want = [m * 1000 + i for m, n in enumerate(sizes) for i in range(n)]
    assert got == want
    for batch in batches:
        ids = batch.columns["id"]
        for seg, off in zip(batch.segments, batch.offsets(), strict=True):
            assert list(ids[off : off + len(seg)]) == [
                seg.message * 1000 + i for i in range(seg.start, seg.stop)
            ]


def test_withdraw_drops_messages_not_yet_batched_and_keeps_partly_batched_ones() -> None:
    shrunk: list[int] = []
    b = Batcher(target=4, max_wait_s=0.1, clock=FakeClock())
    b.on_shrink = lambda: shrunk.append(b.pending_rows)
    b.add(1, cols(1, 3))
    b.add(2, cols(2, 3))
    b.add(3, cols(3, 2))
    batch = b.ready()  # message 1 whole, the first row of message 2
    assert batch is not None
    assert shrunk == [4]
    assert b.withdraw([2, 3, 9]) == [3]  # 2 is partly in a batch: its other rows follow
    assert shrunk == [4, 2]
    assert b.pending_rows == 2
    assert b.withdraw([3]) == []
    assert shrunk == [4, 2]  # nothing left the queue
    rest = b.drain()
    assert [(s.message, s.start, s.stop) for r in rest for s in r.segments] == [(2, 1, 3)]
