"""``Layout``: what a sharded run's shards must agree on, and the words for a difference."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowbatch.consumer.sources.table.checkpoint import RunMismatch
from rowbatch.consumer.sources.table.layout import (
    RUN_FOLDER,
    FileLayout,
    Layout,
    check_layout,
    layout_name,
    shared_plan,
)
from rowbatch.consumer.sources.table.plan import TablePlan, plan_table
from tests.unit.consumer.sources.table.data import truncate, write_dataset

A = FileLayout("a.parquet", 3, 9)
B = FileLayout("b.csv", 1, None)


def test_the_layout_of_a_plan_counts_units_and_rows_per_file(tmp_path: Path) -> None:
    write_dataset(tmp_path, [("x/a.parquet", 9), ("x/b.parquet", 5)], 4)
    layout = Layout.of(plan_table(str(tmp_path), "auto").units)
    assert layout.files == (FileLayout("x/a.parquet", 3, 9), FileLayout("x/b.parquet", 2, 5))


def test_json_round_trip_keeps_unknown_rows() -> None:
    layout = Layout((A, B))
    assert Layout.from_json(layout.to_json()) == layout


def test_changes_name_added_removed_and_changed_files() -> None:
    then = Layout((A, B))
    now = Layout((FileLayout("a.parquet", 4, 12), FileLayout("c.parquet", 1, 3)))
    assert now.changes_from(then) == [
        "1 file(s) added: c.parquet",
        "1 file(s) removed: b.csv",
        "1 file(s) changed: a.parquet (3 unit(s), 9 rows then, 4 unit(s), 12 rows now)",
    ]
    assert then.changes_from(then) == []


def test_many_changes_are_counted_past_five() -> None:
    then = Layout((A,))
    now = Layout((A, *(FileLayout(f"n{i}.parquet", 1, 1) for i in range(8))))
    [said] = now.changes_from(then)
    assert said.startswith("8 file(s) added: n0.parquet, n1.parquet")
    assert said.endswith("n4.parquet and 3 more")


def test_the_first_shard_records_and_the_others_compare(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    check_layout(state, Layout((A,)), 4, new_run=False)
    assert (tmp_path / "state" / RUN_FOLDER / layout_name(4)).exists()
    check_layout(state, Layout((A,)), 4, new_run=False)  # the same: fine
    with pytest.raises(RunMismatch, match=r"1 file\(s\) added: b\.csv.*4 shards"):
        check_layout(state, Layout((A, B)), 4, new_run=False)
    check_layout(state, Layout((A, B)), 4, new_run=True)  # starting over records the new one
    check_layout(state, Layout((A, B)), 4, new_run=False)
    check_layout(state, Layout((A,)), 2, new_run=False)  # another shard count: its own record


def test_one_shard_records_nothing(tmp_path: Path) -> None:
    check_layout(str(tmp_path / "state"), Layout((A,)), 1, new_run=False)
    assert not (tmp_path / "state").exists()


def test_a_record_that_is_not_a_layout_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "state" / RUN_FOLDER
    folder.mkdir(parents=True)
    (folder / layout_name(2)).write_text("{}")
    with pytest.raises(RunMismatch, match="is not a layout"):
        check_layout(str(tmp_path / "state"), Layout((A,)), 2, new_run=False)


def places(plan: TablePlan) -> list[tuple[int, str, int | None]]:
    return [(u.index, u.file.relative, u.row_group) for u in plan.units]


def test_a_file_not_opened_when_recorded_stays_whole_once_mended(tmp_path: Path) -> None:
    """A Parquet file that could not be opened when the layout was recorded is one unit; mended,
    it would be three row groups and shift c.parquet's units to other shards. The shards keep
    the recorded layout: it stays one whole unit, nothing moves, nothing is refused; a new run
    records its row groups."""
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 4), ("b.parquet", 6), ("c.parquet", 4)], 2)
    good = truncate(root / "b.parquet")
    state = str(tmp_path / "state")
    first = shared_plan(state, plan_table(str(root)), 2, new_run=False)
    recorded = [(0, "a.parquet", 0), (1, "a.parquet", 1), (2, "b.parquet", None)]
    recorded += [(3, "c.parquet", 0), (4, "c.parquet", 1)]
    assert places(first) == recorded
    (root / "b.parquet").write_bytes(good)
    mended = plan_table(str(root))
    assert len(mended.units) == 7  # what a fresh plan would shard
    assert places(shared_plan(state, mended, 2, new_run=False)) == recorded
    fresh = shared_plan(state, mended, 2, new_run=True)
    assert places(fresh) == places(mended)
    assert places(shared_plan(state, plan_table(str(root)), 2, new_run=False)) == places(mended)


def test_a_file_recorded_with_its_row_groups_that_cannot_be_opened_now_is_a_change(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 4), ("b.parquet", 6)], 2)
    state = str(tmp_path / "state")
    shared_plan(state, plan_table(str(root)), 2, new_run=False)
    truncate(root / "b.parquet")
    with pytest.raises(RunMismatch, match=r"1 file\(s\) changed: b\.parquet \(3 unit\(s\)"):
        shared_plan(state, plan_table(str(root)), 2, new_run=False)


def test_one_shard_plans_a_mended_file_by_its_row_groups(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 4)], 2)
    good = truncate(root / "a.parquet")
    state = str(tmp_path / "state")
    assert places(shared_plan(state, plan_table(str(root)), 1, new_run=False)) == [
        (0, "a.parquet", None)
    ]
    (root / "a.parquet").write_bytes(good)
    assert len(shared_plan(state, plan_table(str(root)), 1, new_run=False).units) == 2
    assert not (tmp_path / "state").exists()
