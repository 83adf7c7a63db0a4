"""Reading a unit as pieces: at most ``chunk_rows`` rows each, numbered by their row within the
file (across row groups), only the columns asked for, hive partition values as string
columns; CSV and JSON Lines (also compressed) read whole, block by block."""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from rowbatch.consumer.sources.table.plan import TableInputError, TablePlan, plan_table
from rowbatch.consumer.sources.table.reader import Piece, UnitReader
from rowbatch.tables.schema import parse_schema
from tests.unit.consumer.sources.table.data import truncate, write_dataset


def read_all(plan: TablePlan, chunk_rows: int, columns: list[str] | None = None) -> list[Piece]:
    reader = UnitReader(plan.filesystem, chunk_rows, columns)
    try:
        return [piece for unit in plan.units for piece in reader.pieces(unit)]
    finally:
        reader.close()


def test_parquet_row_groups_are_cut_into_pieces_numbered_within_the_file(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 10), ("b.parquet", 4)], 4)
    pieces = read_all(plan_table(str(root)), 3)
    assert [(p.unit.file.relative, p.unit.row_group, p.first_row, p.rows) for p in pieces] == [
        ("a.parquet", 0, 0, 3),
        ("a.parquet", 0, 3, 1),
        ("a.parquet", 1, 4, 3),
        ("a.parquet", 1, 7, 1),
        ("a.parquet", 2, 8, 2),
        ("b.parquet", 0, 0, 3),
        ("b.parquet", 0, 3, 1),
    ]
    for p in pieces:
        offset = 0 if p.unit.file.relative == "a.parquet" else 10
        ids = p.table.column("id").to_pylist()
        assert ids == list(range(offset + p.first_row, offset + p.first_row + p.rows))
    assert [p.chunk_id for p in pieces[:3]] == ["a.parquet@0", "a.parquet@3", "a.parquet@4"]


def test_a_parquet_file_read_whole_is_cut_as_its_row_groups_are(tmp_path: Path) -> None:
    """A file planned whole (its footer unreadable then, mended since) is read row group after
    row group: the same pieces, rows and chunk ids as its row groups' units give."""
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 10), ("b.parquet", 4)], 4)
    plan = plan_table(str(root))
    whole = plan.read_whole({"a.parquet"})
    assert whole.units[0].whole_parquet

    def cut(pieces: list[Piece]) -> list[tuple[str, int, int, list[int]]]:
        return [(p.chunk_id, p.first_row, p.rows, p.table["id"].to_pylist()) for p in pieces]

    assert cut(read_all(whole, 3)) == cut(read_all(plan, 3))


def test_a_parquet_file_that_cannot_be_opened_raises_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 10)], 4)
    truncate(root / "a.parquet")
    plan = plan_table(str(root))
    with pytest.raises(TableInputError, match=r"a\.parquet: cannot read it as Parquet") as caught:
        read_all(plan, 3)
    assert not isinstance(caught.value.__cause__, OSError)  # the content: not retried


def test_only_the_requested_columns_are_read(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 4)], 4)
    [piece] = read_all(plan_table(str(root)), 10, ["name", "id", "absent"])
    assert set(piece.table.column_names) == {"id", "name"}
    [whole] = read_all(plan_table(str(root)), 10)
    assert whole.table.column_names == ["id", "x", "name"]


def test_hive_partition_values_become_string_columns(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("day=2024-01-01/region=eu/a.parquet", 3)], 2)
    pieces = read_all(plan_table(str(root)), 10)
    assert [p.rows for p in pieces] == [2, 1]
    for piece in pieces:
        assert piece.table.schema.field("day").type == pa.string()
        assert piece.table.column("day").to_pylist() == ["2024-01-01"] * piece.rows
        assert piece.table.column("region").to_pylist() == ["eu"] * piece.rows
    [narrow, _] = read_all(plan_table(str(root)), 10, ["id", "region"])
    assert narrow.table.column_names == ["id", "region"]


def test_a_partition_the_file_holds_itself_is_not_added_again(tmp_path: Path) -> None:
    root = tmp_path / "in"
    path = root / "id=7" / "a.parquet"
    write_dataset(root, [("id=7/a.parquet", 2)], 2)
    assert path.exists()
    [piece] = read_all(plan_table(str(root)), 10)
    assert piece.table.column_names == ["id", "x", "name"]
    assert piece.table.column("id").to_pylist() == [0, 1]


@pytest.mark.parametrize("compress", [False, True])
def test_csv_pieces(tmp_path: Path, compress: bool) -> None:
    root = tmp_path / "in"
    root.mkdir()
    text = "id,name\n" + "".join(f"{i},n{i}\n" for i in range(7))
    if compress:
        (root / "rows.csv.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (root / "rows.csv").write_text(text)
    plan = plan_table(str(root))
    [unit] = plan.units
    assert unit.row_group is None
    pieces = read_all(plan, 3)
    assert [(p.first_row, p.rows) for p in pieces] == [(0, 3), (3, 3), (6, 1)]
    assert [p.table.column("id").to_pylist() for p in pieces] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [p.chunk_id for p in pieces] == [f"{unit.file.key}@{n}" for n in (0, 3, 6)]
    [only_names, *_] = read_all(plan, 3, ["name", "day"])
    assert only_names.table.column_names == ["name"]


@pytest.mark.parametrize("name", ["day=2/rows.jsonl", "day=2/rows.jsonl.gz"])
def test_jsonl_pieces_with_a_partition_and_a_declared_schema(tmp_path: Path, name: str) -> None:
    root = tmp_path / "in"
    (root / "day=2").mkdir(parents=True)
    text = "".join(f'{{"id": {i}, "v": [{i}, 1]}}\n' for i in range(5))
    data = gzip.compress(text.encode()) if name.endswith(".gz") else text.encode()
    (root / name).write_bytes(data)
    plan = plan_table(str(root))
    reader = UnitReader(plan.filesystem, 2, None, parse_schema("id:int64"))
    pieces = list(reader.pieces(plan.units[0]))
    reader.close()
    assert [(p.first_row, p.rows) for p in pieces] == [(0, 2), (2, 2), (4, 1)]
    assert pieces[1].table.column("id").to_pylist() == [2, 3]
    assert pieces[1].table.column("day").to_pylist() == ["2", "2"]
    assert pieces[0].table.schema.field("id").type == pa.int64()


def test_a_text_file_that_does_not_read_raises_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    (root / "bad.jsonl.gz").write_bytes(gzip.compress(b'{"id": 1}\n' * 100)[:-30] + b"junk")
    plan = plan_table(str(root))
    with pytest.raises(TableInputError, match=r"bad\.jsonl\.gz: cannot read it"):
        read_all(plan, 10)


def test_bad_csv_lines_are_pieces_of_their_own_and_the_rows_keep_their_numbers(
    tmp_path: Path,
) -> None:
    root = tmp_path / "in"
    root.mkdir()
    lines = ["id,x,name"] + [f"{i},{i * 2},n{i}" for i in range(12)]
    lines[1 + 5] = "5,10,n5,extra"  # too many fields
    lines[1 + 9] = "9,abc,n9"  # not an int64
    (root / "rows.csv").write_text("\n".join(lines) + "\n")
    plan = plan_table(str(root))
    reader = UnitReader(plan.filesystem, 4, None, parse_schema("id:int64,x:int64"))
    pieces = list(reader.pieces(plan.units[0]))
    reader.close()
    assert [(p.first_row, p.rows, p.chunk_id, p.bad_line is not None) for p in pieces] == [
        (0, 4, "rows.csv@0", False),
        (4, 1, "rows.csv@4", False),
        (5, 1, "rows.csv@4", True),
        (6, 2, "rows.csv@4", False),
        (8, 1, "rows.csv@8", False),
        (9, 1, "rows.csv@8", True),
        (10, 2, "rows.csv@8", False),
    ]
    good = [i for p in pieces if p.bad_line is None for i in p.table.column("id").to_pylist()]
    assert good == [0, 1, 2, 3, 4, 6, 7, 8, 10, 11]
    extra, wrong = (p.bad_line for p in pieces if p.bad_line is not None)
    assert extra is not None and wrong is not None
    assert (extra.row, extra.line, extra.text) == (5, 7, "5,10,n5,extra")
    assert extra.message == "line 7: expected 3 fields, found 4"
    assert (wrong.row, wrong.line) == (9, 11)
    assert wrong.message == "line 11, column 'x': cannot convert 'abc' to int64"
    assert pieces[3].row_offset == 2  # keyed as in the whole chunk


def test_bad_json_lines_cost_that_line_only(tmp_path: Path) -> None:
    root = tmp_path / "in"
    root.mkdir()
    lines = [f'{{"id": {i}, "x": {i}}}' for i in range(8)]
    lines[2] = '{"id": 2, "x": '
    lines[5] = '{"id": 5, "x": "five"}'
    (root / "rows.jsonl").write_text("\n".join(lines) + "\n")
    plan = plan_table(str(root))
    reader = UnitReader(plan.filesystem, 100, None, parse_schema("id:int64,x:int64"))
    pieces = list(reader.pieces(plan.units[0]))
    reader.close()
    good = [i for p in pieces if p.bad_line is None for i in p.table.column("id").to_pylist()]
    assert good == [0, 1, 3, 4, 6, 7]
    bad = [p.bad_line for p in pieces if p.bad_line is not None]
    assert [(b.row, b.line) for b in bad if b is not None] == [(2, 3), (5, 6)]
    assert all(p.chunk_id == "rows.jsonl@0" for p in pieces)


def test_piece_part_keeps_the_file_rows_and_the_chunks_keys(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 10)], 10)
    [piece] = read_all(plan_table(str(root)), 10)
    part = piece.part(4, 3)
    assert part.unit is piece.unit
    assert (part.first_row, part.rows) == (4, 3)
    assert (part.chunk_id, part.row_offset, part.message_id) == ("a.parquet@0", 4, "a.parquet@4")
    assert part.table.column("id").to_pylist() == [4, 5, 6]
    inner = part.part(1, 1)
    assert (inner.chunk_id, inner.row_offset, inner.message_id) == ("a.parquet@0", 5, "a.parquet@5")
    assert inner.table.column("id").to_pylist() == [5]


def test_the_reader_reopens_when_the_file_changes(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("a.parquet", 2), ("b.parquet", 2)], 1)
    plan = plan_table(str(root))
    reader = UnitReader(plan.filesystem, 10)
    order = [plan.units[2], plan.units[0], plan.units[3], plan.units[1]]
    ids = [p.table.column("id").to_pylist() for u in order for p in reader.pieces(u)]
    reader.close()
    reader.close()  # twice is harmless
    assert ids == [[2], [0], [3], [1]]


def test_hive_partition_values_are_uri_decoded(tmp_path: Path) -> None:
    root = tmp_path / "in"
    relative = "hour=2024-01-01 10%3A00%3A00/city=S%C3%A3o Paulo/p.parquet"
    write_dataset(root, [(relative, 1)], 1)
    expected = ds.dataset(root, partitioning="hive").to_table().to_pylist()
    assert expected == [
        {"id": 0, "x": 0.0, "name": "row 0", "hour": "2024-01-01 10:00:00", "city": "São Paulo"}
    ]
    [piece] = read_all(plan_table(str(root)), 10)
    assert piece.table.to_pylist() == expected


def test_the_hive_default_partition_is_null(tmp_path: Path) -> None:
    root = tmp_path / "in"
    write_dataset(root, [("day=__HIVE_DEFAULT_PARTITION__/p.parquet", 1)], 1)
    hive = ds.partitioning(pa.schema([("day", pa.string())]), flavor="hive")
    expected = ds.dataset(root, partitioning=hive).to_table().column("day").to_pylist()
    assert expected == [None]
    [piece] = read_all(plan_table(str(root)), 10)
    assert piece.table.column("day").to_pylist() == expected
