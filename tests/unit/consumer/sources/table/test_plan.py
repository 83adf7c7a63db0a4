"""The plan of a table run: the input's data files in path order (hive partitions read from the
path, markers and temporary files skipped), its units (Parquet row groups, whole text files)
with their first rows, a shard's share of them, and the files' chunk-id prefixes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.consumer.sources.table.plan import (
    _KEY_MAX,
    DataFile,
    TableInputError,
    TablePlan,
    _row_groups,
    describe_units,
    file_key,
    list_files,
    plan_table,
)
from rowbatch.tables.formats import InputFormat
from rowbatch.wire.headers.fields import check_chunk_id
from tests.unit.consumer.sources.table.data import truncate, write_dataset, write_parquet


def hashed(relative: str) -> str:
    return "h-" + hashlib.sha256(relative.encode()).hexdigest()[:16]


# --- list_files ---------------------------------------------------------------------------------


def test_a_single_file_is_the_only_data_file_named_by_its_own_name(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "day=2024-01-01" / "rows.parquet"
    write_parquet(path, 0, 3, 3)
    _, files = list_files(str(path))
    [file] = files
    assert file.path == str(path)
    assert file.relative == "rows.parquet"
    assert file.key == "rows.parquet"
    assert file.format is InputFormat.PARQUET
    assert file.partitions == ()


def test_a_directory_lists_its_data_files_in_path_order_with_hive_partitions(
    tmp_path: Path,
) -> None:
    root = tmp_path / "events"
    write_dataset(
        root,
        [
            ("day=2024-01-02/part-0.parquet", 2),
            ("day=2024-01-01/region=eu/part-1.parquet", 2),
            ("day=2024-01-01/part-0.parquet", 2),
        ],
        2,
    )
    (root / "plain").mkdir()
    (root / "plain" / "rows.csv").write_text("id\n1\n")
    _, files = list_files(str(root))
    assert [f.relative for f in files] == [
        "day=2024-01-01/part-0.parquet",
        "day=2024-01-01/region=eu/part-1.parquet",
        "day=2024-01-02/part-0.parquet",
        "plain/rows.csv",
    ]
    assert [f.partitions for f in files] == [
        (("day", "2024-01-01"),),
        (("day", "2024-01-01"), ("region", "eu")),
        (("day", "2024-01-02"),),
        (),
    ]
    assert [f.format for f in files] == [InputFormat.PARQUET] * 3 + [InputFormat.CSV]
    assert all(f.path == str(root / f.relative) for f in files)
    assert [f.key for f in files] == [f.relative for f in files]


def test_markers_hidden_and_temporary_files_are_skipped(tmp_path: Path) -> None:
    root = tmp_path / "out"
    write_dataset(root, [("part-0.parquet", 2)], 2)
    (root / "_SUCCESS").write_text("")
    (root / ".part-0.parquet.crc").write_bytes(b"crc")
    write_parquet(root / "_temporary" / "0" / "part-9.parquet", 0, 1, 1)
    write_parquet(root / ".hidden" / "part-8.parquet", 0, 1, 1)
    write_parquet(root / "_metadata.parquet", 0, 1, 1)
    _, files = list_files(str(root))
    assert [f.relative for f in files] == ["part-0.parquet"]


def test_a_file_of_unknown_kind_is_skipped_in_a_directory(tmp_path: Path) -> None:
    root = tmp_path / "out"
    write_dataset(root, [("a.parquet", 1)], 1)
    (root / "README.txt").write_text("not data")
    (root / "notes").write_text("no suffix")
    _, files = list_files(str(root))
    assert [f.relative for f in files] == ["a.parquet"]


def test_a_single_file_of_unknown_kind_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    path.write_text("id\n1\n")
    with pytest.raises(TableInputError, match=r"rows\.txt: cannot tell its format"):
        list_files(str(path))


def test_a_single_file_of_unknown_kind_is_read_as_the_declared_format(tmp_path: Path) -> None:
    path = tmp_path / "rows.txt"
    path.write_text("id\n1\n")
    _, [file] = list_files(str(path), "csv")
    assert file.format is InputFormat.CSV


def test_compressed_text_files_and_every_data_suffix_are_recognised(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    names = ["a.csv.gz", "b.jsonl.zst", "c.ndjson", "d.json", "e.pq", "f.CSV"]
    for name in names:
        (root / name).write_bytes(b"")
    _, files = list_files(str(root))
    assert [(f.relative, f.format) for f in files] == [
        ("a.csv.gz", InputFormat.CSV),
        ("b.jsonl.zst", InputFormat.JSONL),
        ("c.ndjson", InputFormat.JSONL),
        ("d.json", InputFormat.JSONL),
        ("e.pq", InputFormat.PARQUET),
        ("f.CSV", InputFormat.CSV),
    ]


def test_a_declared_format_skips_files_of_another_kind(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 1)], 1)
    (root / "schema.json").write_text("{}")
    (root / "b").write_bytes(b"")
    _, files = list_files(str(root), "parquet")
    assert [f.relative for f in files] == ["a.parquet", "b"]


def test_an_empty_directory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "empty"
    root.mkdir()
    (root / "_SUCCESS").write_text("")
    with pytest.raises(TableInputError, match=r"empty: no data files"):
        list_files(str(root))


def test_a_missing_path_is_refused_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "rows.parquet"
    with pytest.raises(TableInputError) as caught:
        list_files(str(missing))
    assert str(missing) in str(caught.value)
    assert "no such file or directory" in str(caught.value)


# --- plan_table ---------------------------------------------------------------------------------


def test_parquet_units_are_row_groups_in_path_order_and_text_files_are_whole(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("b.parquet", 5), ("a.parquet", 7)], 3)
    (root / "c.csv").write_text("id\n1\n2\n")
    (root / "d.jsonl").write_text('{"id": 1}\n')
    plan = plan_table(str(root))
    assert [(u.index, u.file.relative, u.row_group, u.first_row, u.rows) for u in plan.units] == [
        (0, "a.parquet", 0, 0, 3),
        (1, "a.parquet", 1, 3, 3),
        (2, "a.parquet", 2, 6, 1),
        (3, "b.parquet", 0, 0, 3),
        (4, "b.parquet", 1, 3, 2),
        (5, "c.csv", None, 0, None),
        (6, "d.jsonl", None, 0, None),
    ]
    assert [f.relative for f in plan.files] == ["a.parquet", "b.parquet", "c.csv", "d.jsonl"]
    assert plan.input == str(root)
    assert plan.known_rows is None  # the text files' rows are unknown until read
    assert describe_units(plan.units) == "4 files, 5 row groups"


def test_known_rows_of_a_parquet_only_input(tmp_path: Path) -> None:
    root = tmp_path / "in"
    rows = write_dataset(root, [("a.parquet", 5), ("b.parquet", 4)], 2)
    plan = plan_table(str(root))
    assert plan.known_rows == rows == 9
    assert describe_units(plan.units[:1]) == "1 file, 1 row group"


def test_a_parquet_file_that_cannot_be_opened_is_one_unit_of_its_own(tmp_path: Path) -> None:
    """Its footer unreadable (truncated to 60 %, or not Parquet at all): the file's failure,
    not the input's. It is one unit of the whole file, rows unknown, in its place; the other
    files' row groups are planned as ever."""
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 5), ("b.parquet", 4), ("c.parquet", 3)], 2)
    truncate(root / "b.parquet")
    (root / "d.parquet").write_bytes(b"not parquet at all")
    plan = plan_table(str(root))
    assert [(u.index, u.file.relative, u.row_group, u.first_row, u.rows) for u in plan.units] == [
        (0, "a.parquet", 0, 0, 2),
        (1, "a.parquet", 1, 2, 2),
        (2, "a.parquet", 2, 4, 1),
        (3, "b.parquet", None, 0, None),
        (4, "c.parquet", 0, 0, 2),
        (5, "c.parquet", 1, 2, 1),
        (6, "d.parquet", None, 0, None),
    ]
    assert [u.whole_parquet for u in plan.units] == [False] * 3 + [True] + [False] * 2 + [True]
    assert plan.known_rows is None
    assert describe_units(plan.units) == "4 files, 5 row groups, 2 Parquet files read whole"


def test_a_parquet_file_the_store_does_not_find_refuses_the_plan(tmp_path: Path) -> None:
    """Gone between the listing and its footer (or the store down): the input, not its data."""
    gone = tmp_path / "gone.parquet"
    file = DataFile(str(gone), "gone.parquet", InputFormat.PARQUET, "gone.parquet")
    with pytest.raises(TableInputError, match=r"gone\.parquet: cannot read it as Parquet"):
        _row_groups(pafs.LocalFileSystem(), file)


def test_files_read_whole_join_their_row_groups_and_the_units_are_numbered_again(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 5), ("b.parquet", 4), ("c.parquet", 3)], 2)
    (root / "d.csv").write_text("id\n1\n")
    plan = plan_table(str(root)).read_whole({"b.parquet", "d.csv", "gone.parquet"})
    assert [(u.index, u.file.relative, u.row_group, u.first_row, u.rows) for u in plan.units] == [
        (0, "a.parquet", 0, 0, 2),
        (1, "a.parquet", 1, 2, 2),
        (2, "a.parquet", 2, 4, 1),
        (3, "b.parquet", None, 0, None),
        (4, "c.parquet", 0, 0, 2),
        (5, "c.parquet", 1, 2, 1),
        (6, "d.csv", None, 0, None),
    ]


@pytest.fixture(scope="module")
def shard_plan(tmp_path_factory: pytest.TempPathFactory) -> TablePlan:
    root = tmp_path_factory.mktemp("shards") / "in"
    write_dataset(root, [("a.parquet", 7), ("b.parquet", 3), ("c.parquet", 11)], 2)
    return plan_table(str(root))


@settings(max_examples=30, deadline=None)
@given(count=st.integers(1, 8))
def test_the_shards_partition_the_units(shard_plan: TablePlan, count: int) -> None:
    shards = [shard_plan.shard(k, count) for k in range(count)]
    seen = [u.index for s in shards for u in s]
    assert sorted(seen) == [u.index for u in shard_plan.units]
    assert len(seen) == len(set(seen))
    for k, shard in enumerate(shards):
        assert all(u.index % count == k for u in shard)
        assert [u.index for u in shard] == sorted(u.index for u in shard)


def test_one_shard_is_every_unit(shard_plan: TablePlan) -> None:
    assert shard_plan.shard(0, 1) == shard_plan.units
    assert len(shard_plan.units) == 4 + 2 + 6


# --- file_key -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "relative",
    ["rows.parquet", "day=2024-01-01/part-0.parquet", "a/b/c.csv.gz", "x" * _KEY_MAX],
)
def test_a_short_safe_name_is_its_own_key(relative: str) -> None:
    assert file_key(relative) == relative


@pytest.mark.parametrize(
    "relative",
    [
        "my rows.parquet",
        "user@host.parquet",
        "x" * (_KEY_MAX + 1),
        "café.parquet",
        "tab\there.csv",
    ],
)
def test_an_unsafe_or_long_name_is_hashed(relative: str) -> None:
    key = file_key(relative)
    assert key == hashed(relative)
    assert len(key) == 18
    assert check_chunk_id(f"{key}@123") == f"{key}@123"


def test_hashed_keys_differ_by_name() -> None:
    assert file_key("a b.parquet") != file_key("a  b.parquet")


@given(st.text(min_size=1, max_size=300))
def test_every_key_makes_a_valid_chunk_id(relative: str) -> None:
    key = file_key(relative)
    assert "@" not in key
    check_chunk_id(f"{key}@{2**63 - 1}")
    assert file_key(relative) == key  # stable
