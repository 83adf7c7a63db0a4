"""A table run's dead letters: one JSON line per row with its key, where it came from, why and
its values (bytes as base64, NaN and infinities as text), read back one per ``(file, row)``."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.consumer.sources.table.dead_letters import (
    DEAD_LETTER_PREFIX,
    JSONL_SUFFIX,
    read_dead_letters,
    records,
    write_dead_letters,
)
from rowbatch.consumer.sources.table.plan import DataFile, Unit
from rowbatch.consumer.sources.table.reader import Piece
from rowbatch.consumer.sources.table.state import END, StateFolder
from rowbatch.tables.formats import InputFormat
from rowbatch.wire.dead_letter import ReasonClass

REASON = DeadLetterReason(ReasonClass.SCHEMA_MISMATCH, "column 'v': a null", "null_not_allowed")


def piece_of(relative: str, first_row: int, table: pa.Table) -> Piece:
    file = DataFile(f"/in/{relative}", relative, InputFormat.PARQUET, relative, (("day", "1"),))
    return Piece(Unit(0, file, 0, 0, 100), first_row, table)


def odd_values() -> pa.Table:
    return pa.table(
        {
            "id": pa.array([7, 8], pa.int64()),
            "blob": pa.array([b"\x00\xffraw", None], pa.binary()),
            "x": pa.array([float("nan"), float("inf")], pa.float64()),
            "v": pa.array([[1.0, float("-inf")], None], pa.list_(pa.float32())),
            "name": pa.array(["é", None], pa.string()),
        }
    )


def test_each_row_is_one_line_with_its_key_origin_reason_and_values() -> None:
    piece = piece_of("day=1/a.parquet", 40, odd_values())
    lines = list(records(piece, REASON, attempt=3))
    assert len(lines) == 2
    first, second = (orjson.loads(line) for line in lines)
    for i, record in enumerate((first, second)):
        assert record["chunk_id"] == "day=1/a.parquet@40"
        assert record["row_index"] == i
        assert record["file"] == "day=1/a.parquet"
        assert record["file_row"] == 40 + i
        assert record["reason"] == "schema-mismatch"
        assert record["code"] == "null_not_allowed"
        assert record["message"] == "column 'v': a null"
        assert record["attempt"] == 3
        assert record["at"].endswith("+00:00")
    assert first["row"] == {
        "id": 7,
        "blob": {"base64": base64.b64encode(b"\x00\xffraw").decode()},
        "x": "nan",
        "v": [1.0, "-inf"],
        "name": "é",
    }
    assert second["row"] == {"id": 8, "blob": None, "x": "inf", "v": None, "name": None}


def test_a_part_of_a_piece_keys_its_rows_as_the_whole_chunk_does() -> None:
    piece = piece_of("a.parquet", 0, pa.table({"id": list(range(6))})).part(4, 2)
    lines = [orjson.loads(line) for line in records(piece, REASON, attempt=1)]
    assert [(r["chunk_id"], r["row_index"], r["file_row"]) for r in lines] == [
        ("a.parquet@0", 4, 4),
        ("a.parquet@0", 5, 5),
    ]


def test_read_back_keeps_one_record_per_row_in_key_order(tmp_path: Path) -> None:
    folder = StateFolder(str(tmp_path / "state"), "shard-0-of-1")
    b = piece_of("b.parquet", 10, pa.table({"id": [1, 2]}))
    a = piece_of("a.parquet", 5, pa.table({"id": [3]}))
    write_dead_letters(folder, list(records(b, REASON, attempt=1)))
    write_dead_letters(folder, [])  # nothing: no segment
    assert len(folder.names(DEAD_LETTER_PREFIX)) == 1
    again = DeadLetterReason(ReasonClass.UNDECODABLE, "again", "invalid_value")
    write_dead_letters(folder, [*records(b, again, attempt=2), *records(a, again, attempt=1)])
    folder.write(
        f"{DEAD_LETTER_PREFIX}-zz-cut", orjson.dumps({"file": "c", "file_row": 0}).decode()
    )
    found = read_dead_letters(folder)
    assert [(r["file"], r["file_row"]) for r in found] == [
        ("a.parquet", 5),
        ("b.parquet", 10),
        ("b.parquet", 11),
    ]
    assert [r["attempt"] for r in found] == [1, 1, 1]  # the first record of a row is kept
    assert [r["row"]["id"] for r in found] == [3, 1, 2]


def test_a_dead_letter_file_is_plain_json_lines(tmp_path: Path) -> None:
    """Every line of the file (the last included) is a JSON object: no completion marker."""
    folder = StateFolder(str(tmp_path / "state"), "shard-0-of-1")
    piece = piece_of("day=1/a.parquet", 40, odd_values())
    name = write_dead_letters(folder, list(records(piece, REASON, attempt=1)))
    assert name is not None
    assert folder.names(DEAD_LETTER_PREFIX) == [name]
    assert name.endswith(JSONL_SUFFIX)
    text = (tmp_path / "state" / "shard-0-of-1" / name).read_text()
    assert text.endswith("\n")
    lines = text.splitlines()
    assert len(lines) == 2
    parsed = [json.loads(line) for line in lines]
    assert all(isinstance(record, dict) for record in parsed)
    assert [r["file_row"] for r in parsed] == [40, 41]
    assert folder.names("") == [name]  # no temporary file or marker left beside it


def test_the_files_of_earlier_versions_are_still_read(tmp_path: Path) -> None:
    """A file without the suffix ends with ``end`` (read); one a kill cut short has none (not
    read: the rerun writes its rows' records again)."""
    folder = StateFolder(str(tmp_path / "state"), "shard-0-of-1")
    old = [orjson.dumps({"file": "a", "file_row": r, "attempt": 1}).decode() for r in (0, 1)]
    folder.write(f"{DEAD_LETTER_PREFIX}-1-1-00000001", "".join(f"{line}\n" for line in old))
    folder.write(f"{DEAD_LETTER_PREFIX}-1-1-00000002", f"{old[0]}\n{old[1]}\n{END}\n")
    folder.write(f"{DEAD_LETTER_PREFIX}-1-1-00000003", f'{old[0]}\n{{"file": "b", "fi')
    assert [(r["file"], r["file_row"]) for r in read_dead_letters(folder)] == [("a", 0), ("a", 1)]


def test_a_write_cut_short_leaves_no_dead_letter_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a local disk the file is written under a hidden name and renamed once synced: a
    write stopped before the rename (a kill) leaves only the hidden file, which no reader
    lists, and a rerun writes its rows' records again."""
    folder = StateFolder(str(tmp_path / "state"), "shard-0-of-1")

    def killed(self: Path, target: object) -> Path:
        raise SystemExit("killed before the rename")

    monkeypatch.setattr(Path, "replace", killed)
    piece = piece_of("a.parquet", 0, pa.table({"id": [1, 2]}))
    with pytest.raises(SystemExit):
        write_dead_letters(folder, list(records(piece, REASON, attempt=1)))
    assert folder.names(DEAD_LETTER_PREFIX) == []
    [hidden] = folder.names("")
    assert hidden.startswith(f".{DEAD_LETTER_PREFIX}")
    assert read_dead_letters(folder) == []


def test_no_dead_letters_reads_as_none(tmp_path: Path) -> None:
    assert read_dead_letters(StateFolder(str(tmp_path), "shard-0-of-1")) == []


@pytest.mark.parametrize(
    "column",
    [
        pa.array([decimal.Decimal("1.50")], pa.decimal128(5, 2)),
        pa.array([datetime.timedelta(seconds=3)], pa.duration("s")),
        pa.array([{"b": b"\x00"}], pa.struct([("b", pa.binary())])),
        pa.array([[("k", b"v")]], pa.map_(pa.string(), pa.binary())),
    ],
    ids=["decimal", "duration", "struct-of-bytes", "map-of-bytes"],
)
def test_every_value_becomes_json(column: pa.Array) -> None:
    piece = piece_of("a.parquet", 0, pa.table({"c": column}))
    [line] = records(piece, REASON, attempt=1)
    assert orjson.loads(line)["row"]["c"] is not None
