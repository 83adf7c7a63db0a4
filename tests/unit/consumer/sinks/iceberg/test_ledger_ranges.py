"""The key ledger's row ranges: ``runs`` of written rows, ``merged``, ``merge_claims``,
``overlap``, ``contains``, and the files' ``_subtract`` (a file's claims less the rows taken)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numpy.typing import NDArray

from rowbatch.consumer.sinks.iceberg.files import _subtract
from rowbatch.consumer.sinks.iceberg.ledger import (
    Ranges,
    contains,
    merge_claims,
    merged,
    overlap,
    runs,
)


def chunks(*ids: str) -> NDArray[np.object_]:
    return np.array(ids, dtype=object)


def rows(*indexes: int) -> NDArray[np.int64]:
    return np.array(indexes, dtype=np.int64)


def expand(ranges: Ranges) -> set[int]:
    return {i for start, end in ranges for i in range(start, end)}


# --- runs ---------------------------------------------------------------------------------------


def test_runs_of_nothing_is_empty() -> None:
    assert runs(chunks(), rows()) == {}


def test_runs_of_one_row() -> None:
    assert runs(chunks("c"), rows(7)) == {"c": [(7, 8)]}


def test_runs_of_consecutive_rows_is_one_range() -> None:
    assert runs(chunks(*["c"] * 5), rows(3, 4, 5, 6, 7)) == {"c": [(3, 8)]}


def test_runs_break_at_a_gap_in_row_index() -> None:
    assert runs(chunks(*["c"] * 5), rows(0, 1, 2, 5, 6)) == {"c": [(0, 3), (5, 7)]}


def test_runs_of_interleaved_chunks_are_joined_per_chunk() -> None:
    got = runs(chunks("a", "a", "b", "b", "a", "a", "b"), rows(0, 1, 0, 1, 2, 3, 5))
    assert got == {"a": [(0, 4)], "b": [(0, 2), (5, 6)]}


def test_runs_break_where_the_chunk_changes_even_if_row_index_goes_on() -> None:
    # b's row 1 follows a's row 0: same row_index sequence, another chunk
    assert runs(chunks("a", "b", "b"), rows(0, 1, 2)) == {"a": [(0, 1)], "b": [(1, 3)]}


def test_runs_of_rows_out_of_order_are_sorted_and_merged() -> None:
    assert runs(chunks(*["c"] * 4), rows(5, 3, 4, 0)) == {"c": [(0, 1), (3, 6)]}
    assert runs(chunks(*["c"] * 3), rows(2, 1, 0)) == {"c": [(0, 3)]}


def test_runs_of_a_repeated_row_hold_it_once() -> None:
    assert runs(chunks("c", "c", "c"), rows(4, 4, 5)) == {"c": [(4, 6)]}


def test_runs_take_other_int_dtypes() -> None:
    got = runs(chunks("c", "c"), np.array([1, 2], dtype=np.int32))
    assert got == {"c": [(1, 3)]}


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 40)), max_size=60))
def test_runs_hold_exactly_the_rows_given(pairs: list[tuple[str, int]]) -> None:
    got = runs(chunks(*(c for c, _ in pairs)), rows(*(r for _, r in pairs)))
    want: dict[str, set[int]] = {}
    for chunk, row in pairs:
        want.setdefault(chunk, set()).add(row)
    assert {chunk: expand(ranges) for chunk, ranges in got.items()} == want
    for ranges in got.values():
        assert ranges == merged(ranges)


# --- merged, merge_claims -----------------------------------------------------------------------


def test_merged_sorts_and_joins_touching_and_overlapping_ranges() -> None:
    assert merged([(10, 12), (0, 2), (2, 4), (3, 6), (8, 9)]) == [(0, 6), (8, 9), (10, 12)]


def test_merged_keeps_a_range_inside_another_once() -> None:
    assert merged([(0, 10), (2, 3), (9, 10)]) == [(0, 10)]


def test_merged_of_nothing() -> None:
    assert merged([]) == []


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 10)), max_size=20))
def test_merged_holds_the_same_rows_in_disjoint_sorted_ranges(spans: list[tuple[int, int]]) -> None:
    ranges = [(start, start + length) for start, length in spans]
    out = merged(ranges)
    assert expand(out) == expand(ranges)
    for (_, end), (start, _) in itertools.pairwise(out):
        assert end < start  # neither overlapping nor touching


def test_merge_claims_joins_the_ranges_of_each_chunk() -> None:
    got = merge_claims([{"a": [(0, 2)], "b": [(5, 6)]}, {"a": [(2, 4), (8, 9)]}, {}])
    assert got == {"a": [(0, 4), (8, 9)], "b": [(5, 6)]}


# --- overlap ------------------------------------------------------------------------------------


def test_overlap_of_disjoint_ranges_is_empty() -> None:
    assert overlap([(0, 5)], [(5, 10)]) == []
    assert overlap([], [(0, 10)]) == []
    assert overlap([(0, 10)], []) == []


def test_overlap_of_partly_overlapping_ranges() -> None:
    assert overlap([(0, 10)], [(5, 15)]) == [(5, 10)]
    assert overlap([(5, 15)], [(0, 10)]) == [(5, 10)]


def test_overlap_of_one_range_with_many() -> None:
    assert overlap([(0, 100)], [(3, 5), (10, 20), (99, 200)]) == [(3, 5), (10, 20), (99, 100)]
    assert overlap([(3, 5), (10, 20), (99, 200)], [(0, 100)]) == [(3, 5), (10, 20), (99, 100)]


def test_overlap_with_ranges_ending_together() -> None:
    assert overlap([(0, 5), (7, 9)], [(2, 5), (6, 9)]) == [(2, 5), (7, 9)]


ranges_strategy = st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), max_size=12).map(
    lambda spans: merged((start, start + length) for start, length in spans)
)


@given(ranges_strategy, ranges_strategy)
def test_overlap_is_the_intersection_of_the_rows(mine: Ranges, theirs: Ranges) -> None:
    got = overlap(mine, theirs)
    assert expand(got) == expand(mine) & expand(theirs)
    assert got == merged(got)  # sorted, disjoint, not touching
    assert all(start < end for start, end in got)
    assert overlap(theirs, mine) == got


# --- contains -----------------------------------------------------------------------------------


def test_contains_marks_values_in_any_range_half_open() -> None:
    got = contains([(2, 4), (10, 11)], rows(0, 1, 2, 3, 4, 9, 10, 11, 3))
    assert got.tolist() == [False, False, True, True, False, False, True, False, True]


def test_contains_with_no_ranges_or_no_values() -> None:
    assert contains([], rows(1, 2)).tolist() == [False, False]
    assert contains([(0, 5)], rows()).tolist() == []


@given(ranges_strategy, st.lists(st.integers(-5, 80), max_size=30))
def test_contains_matches_membership(ranges: Ranges, values: list[int]) -> None:
    held = expand(ranges)
    assert contains(ranges, rows(*values)).tolist() == [v in held for v in values]


# --- _subtract (a file's claims less the rows another commit holds) -----------------------------


def test_subtract_nothing_leaves_the_ranges() -> None:
    assert _subtract([(0, 5), (8, 9)], []) == [(0, 5), (8, 9)]


def test_subtract_a_hole_in_the_middle_splits_the_range() -> None:
    assert _subtract([(0, 10)], [(3, 5)]) == [(0, 3), (5, 10)]


def test_subtract_holes_at_the_edges_and_beyond() -> None:
    assert _subtract([(0, 10)], [(0, 2), (8, 20)]) == [(2, 8)]
    assert _subtract([(5, 10)], [(0, 6)]) == [(6, 10)]


def test_subtract_everything_leaves_nothing() -> None:
    assert _subtract([(0, 3), (5, 9)], [(0, 1 << 62)]) == []
    assert _subtract([(0, 3)], [(0, 3)]) == []


def test_subtract_holes_spanning_several_ranges() -> None:
    assert _subtract([(0, 4), (6, 10), (12, 14)], [(2, 7), (9, 13)]) == [(0, 2), (7, 9), (13, 14)]


@given(ranges_strategy, ranges_strategy)
def test_subtract_is_the_set_difference(ranges: Ranges, holes: Ranges) -> None:
    got = _subtract(ranges, holes)
    assert expand(got) == expand(ranges) - expand(holes)
    assert all(start < end for start, end in got)
    assert got == sorted(got)
