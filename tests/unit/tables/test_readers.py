"""Reading the input files: formats, streaming in exact chunks, the schema option, and errors
that name the file, the column and the row."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from rowbatch.progress import Progress, Summary, format_bytes, format_duration
from rowbatch.tables.bad_lines import TEXT_MAX, BadLine
from rowbatch.tables.convert import wire_columns
from rowbatch.tables.csv import csv_batches, csv_rows
from rowbatch.tables.errors import InputError
from rowbatch.tables.formats import InputFormat, infer_format
from rowbatch.tables.jsonl import jsonl_rows
from rowbatch.tables.rechunk import rechunk
from rowbatch.tables.schema import parse_schema
from rowbatch.tables.source import open_source
from rowbatch.wire.columns.column_type import FLOAT64, INT64, STRING, ColumnType

Chunk = tuple[dict[str, pa.Array], dict[str, ColumnType]]


def _read_all(
    path: str, schema: str | None = None, rows: int = 4, block_bytes: int = 1 << 20
) -> list[Chunk]:
    parsed = parse_schema(schema) if schema else None
    out = []
    with open_source(path, schema=parsed, block_bytes=block_bytes) as source:
        first = 0
        for table in rechunk(source.batches, rows):
            out.append(wire_columns(table, parsed, source=source.name, first_row=first))
            first += table.num_rows
    return out


def test_infer_format() -> None:
    assert infer_format("a/b.csv") is InputFormat.CSV
    assert infer_format("rows.JSONL") is InputFormat.JSONL
    assert infer_format("rows.ndjson.gz") is InputFormat.JSONL
    assert infer_format("t.parquet") is InputFormat.PARQUET
    with pytest.raises(InputError, match=r"data\.txt: cannot tell the format"):
        infer_format("data.txt")
    with pytest.raises(InputError, match="stdin: give the format"):
        infer_format("-")


def test_parse_schema() -> None:
    schema = parse_schema("id:int64, text : string,emb:vector[float32, 16],x:float64")
    assert schema == {
        "id": INT64,
        "text": STRING,
        "emb": ColumnType.vector(16),
        "x": FLOAT64,
    }
    with pytest.raises(InputError, match=r"column 'ts': unknown column type 'timestamp'"):
        parse_schema("id:int64,ts:timestamp")
    with pytest.raises(InputError, match="given twice"):
        parse_schema("a:int64,a:string")
    with pytest.raises(InputError, match="cannot read"):
        parse_schema("justaname")


def test_rechunk_gives_exact_chunks_across_batches() -> None:
    batches = [pa.record_batch({"x": list(range(a, b))}) for a, b in [(0, 3), (3, 10), (10, 11)]]
    sizes = [t.num_rows for t in rechunk(batches, 4)]
    assert sizes == [4, 4, 3]
    joined = pa.concat_tables(list(rechunk(batches, 4)))
    assert joined.column("x").to_pylist() == list(range(11))
    with pytest.raises(ValueError, match=">= 1"):
        list(rechunk(batches, 0))


def test_csv_types_nulls_and_vectors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        'id,text,score,flag,vec\n1,hello,1.5,true,"[1, 2]"\n2,,NaN,false,[3.5;4]\n'.replace(
            "[3.5;4]", '"[3.5, 4]"'
        )
        + "3,x y,,,\n",
        encoding="utf-8",
    )
    (first,) = _read_all(str(path), "vec:vector[float32,2]")
    columns, types = first
    assert types == {
        "id": INT64,
        "text": STRING,
        "score": FLOAT64,
        "flag": ColumnType.parse("bool"),
        "vec": ColumnType.vector(2),
    }
    assert columns["text"].to_pylist() == ["hello", "", "x y"]  # "" stays a string
    score = columns["score"].to_pylist()
    assert score[0] == 1.5 and np.isnan(score[1]) and score[2] is None
    assert columns["flag"].to_pylist() == [True, False, None]
    assert columns["vec"].to_pylist() == [[1.0, 2.0], [3.5, 4.0], None]


def test_csv_type_change_after_the_first_block_suggests_a_schema(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("id,n\n" + "".join(f"{i},{i}\n" for i in range(50)) + "50,twelve\n")
    with pytest.raises(InputError) as info:
        _read_all(str(path), rows=2, block_bytes=64)
    message = str(info.value)
    assert message.startswith(f"{path}: cannot read it as csv")
    assert "twelve" in message and "--schema NAME:TYPE" in message
    chunks = _read_all(str(path), "n:string", rows=10, block_bytes=64)  # read as text: fine
    assert chunks[-1][0]["n"].to_pylist() == ["twelve"]


def test_declared_type_that_does_not_fit_names_the_row(tmp_path: Path) -> None:
    table = pa.table({"id": [1, 2, 3, 4, 5], "n": ["1", "2", "3", "x4", "5"]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    with pytest.raises(InputError) as info:
        _read_all(str(path), "n:int64", rows=3)
    assert str(info.value).startswith(f"{path}: column 'n', data row 4: cannot convert")
    assert "'x4'" in str(info.value)


def test_unsupported_type_names_the_column_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "ts.csv"
    path.write_text("id,when\n1,2024-05-01\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        _read_all(str(path))
    message = str(info.value)
    assert "column 'when'" in message and "date32" in message
    assert "--schema when:string" in message
    (ok,) = _read_all(str(path), "when:string")
    assert ok[0]["when"].to_pylist() == ["2024-05-01"]


def test_all_empty_column_asks_for_a_type(tmp_path: Path) -> None:
    path = tmp_path / "e.csv"
    path.write_text("id,empty\n1,\n2,\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"column 'empty'.*--schema empty:TYPE"):
        _read_all(str(path))


def test_missing_schema_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text("id\n1\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"names column\(s\) \['nope'\]"):
        _read_all(str(path), "nope:int64")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"nothing\.csv: cannot open it"):
        open_source(str(tmp_path / "nothing.csv"))


def test_jsonl_with_vectors_nulls_and_gzip(tmp_path: Path) -> None:
    rows = [
        {"id": 1, "text": "a", "emb": [0.5, 1.0, 2.0]},
        {"id": 2, "text": None, "emb": None},
        {"id": 3, "text": "c", "emb": [1, 2, 3]},
    ]
    path = tmp_path / "r.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    (chunk,) = _read_all(str(path))
    columns, types = chunk
    assert types["emb"] == ColumnType.vector(3)
    assert columns["emb"].to_pylist() == [[0.5, 1.0, 2.0], None, [1.0, 2.0, 3.0]]
    assert columns["text"].to_pylist() == ["a", None, "c"]


def test_jsonl_vectors_of_different_lengths_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "v.jsonl"
    path.write_text('{"v": [1, 2]}\n{"v": [1, 2, 3]}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"column 'v', data row 2: a vector of 3 numbers"):
        _read_all(str(path))


def test_jsonl_type_change_suggests_a_schema(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text('{"a": 1}\n{"a": "x"}\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"c\.jsonl: cannot read it as jsonl.*--schema"):
        _read_all(str(path))


def test_parquet_knows_its_row_count(tmp_path: Path) -> None:
    table = pa.table({"id": np.arange(10), "x": np.linspace(0, 1, 10)})
    path = tmp_path / "p.parquet"
    pq.write_table(table, path)
    with open_source(str(path)) as source:
        assert source.total_rows == 10
        assert source.estimated_rows() == 10
        assert sum(t.num_rows for t in rechunk(source.batches, 3)) == 10


def test_csv_row_estimate_from_bytes(tmp_path: Path) -> None:
    table = pa.table({"id": np.arange(50_000), "t": ["abc"] * 50_000})
    path = tmp_path / "big.csv"
    pcsv.write_csv(table, path)
    with open_source(str(path)) as source:
        assert source.total_rows is None
        assert source.estimated_rows() is None
        tables = rechunk(source.batches, 1000)
        next(tables)
        estimate = source.estimated_rows()
        assert estimate is not None and 40_000 < estimate < 60_000
        rest = sum(t.num_rows for t in tables)
        assert rest == 49_000
        assert source.estimated_rows() == 50_000


def test_stdin_csv_and_parquet() -> None:
    data = io.BytesIO(b"a,b\n1,x\n2,y\n")
    with open_source("-", InputFormat.CSV, stdin=data) as source:
        assert source.name == "<stdin>"
        (table,) = list(rechunk(source.batches, 10))
    assert table.column("b").to_pylist() == ["x", "y"]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"a": [1, 2, 3]}), buffer)
    with open_source("-", InputFormat.PARQUET, stdin=io.BytesIO(buffer.getvalue())) as source:
        assert source.total_rows == 3


# --- progress ---------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_bar_shows_rows_rate_and_eta() -> None:
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, mode="bar", total_rows=1000, clock=clock)
    clock.now += 2.0
    progress.add(rows=250, nbytes=5000)
    line = out.getvalue()
    assert line.startswith("\r250/1,000 rows  [######")
    assert "25%" in line and "125 rows/s" in line and "ETA 0:06" in line
    clock.now += 0.1  # under the redraw interval: nothing drawn
    progress.add(rows=10)
    assert out.getvalue() == line
    clock.now += 6.0
    progress.add(rows=740)
    progress.finish()
    assert out.getvalue().endswith("\n")
    assert "1,000/1,000 rows" in out.getvalue().splitlines()[-1]


def test_progress_estimated_total_and_log_mode() -> None:
    clock = Clock()
    out = io.StringIO()
    progress = Progress(out, mode="log", estimate_rows=lambda: 4000.0, clock=clock)
    progress.add(rows=1000)
    assert out.getvalue() == ""  # a log line waits for the interval
    clock.now += 10.0
    progress.add(rows=1000)
    assert "2,000/~4,000 rows" in out.getvalue()
    assert "\r" not in out.getvalue()


def test_progress_auto_is_silent_off_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out, mode="auto")
    progress.add(rows=5)
    progress.finish()
    assert progress.mode == "none" and out.getvalue() == ""


def test_summary_line_and_formats() -> None:
    summary = Summary("kafka", "rows", "arrow", 100_000, 100, 7_000_000, 2.0, "f-abc")
    line = summary.line()
    assert "100,000 rows, 100 chunks, 7,000,000 bytes in 2.00 s = 50,000 rows/s" in line
    assert summary.to_json()["rows_per_s"] == 50_000.0
    assert format_duration(3725) == "1:02:05"
    assert format_bytes(1_500_000) == "1.5 MB"


# --- bad lines: each costs that line only ---------------------------------------------------------


def _rows_and_bad(items: Iterable[pa.RecordBatch | BadLine], column: str) -> tuple[list[Any], ...]:
    good: list[Any] = []
    bad: list[BadLine] = []
    for item in items:
        if isinstance(item, BadLine):
            bad.append(item)
        else:
            good.extend(item.column(column).to_pylist())
    return good, bad


@pytest.mark.parametrize("block_bytes", [16, 64, 1 << 20])
def test_csv_rows_hand_out_each_bad_line_in_its_place(block_bytes: int) -> None:
    lines = ["a,b,c"] + [f"{i},{i * 2},x{i}" for i in range(20)]
    lines[1 + 5] = "5,10,x5,extra"
    lines[1 + 11] = "11"
    lines[1 + 14] = '14,"abc\ndef",x14'  # a quoted line break: the record spans two lines
    lines[1 + 16] = "16,zz,x16"
    data = ("\n".join(lines) + "\n").encode()
    items = list(csv_rows(pa.BufferReader(data), parse_schema("a:int64,b:int64"), block_bytes))
    good, bad = _rows_and_bad(items, "a")
    assert good == [i for i in range(20) if i not in (5, 11, 14, 16)]
    assert [(b.row, b.line, b.text) for b in bad] == [
        (5, 7, "5,10,x5,extra"),
        (11, 13, "11"),
        (14, 16, '14,"abc\ndef",x14'),
        (16, 19, "16,zz,x16"),
    ]
    assert [b.message for b in bad] == [
        "line 7: expected 3 fields, found 4",
        "line 13: expected 3 fields, found 1",
        "line 16, column 'b': cannot convert 'abc\\ndef' to int64",
        "line 19, column 'b': cannot convert 'zz' to int64",
    ]
    rows = 0  # each bad line in its place: the good rows before it are its row index
    for item in items:
        if isinstance(item, BadLine):
            assert item.row == rows
            rows += 1
        else:
            rows += item.num_rows


def test_csv_rows_of_a_good_file_are_the_batches_of_csv_batches() -> None:
    data = ("id,v\n" + "".join(f'{i},"[{i}, 1]"\n' for i in range(1000))).encode()
    schema = parse_schema("id:int64")
    rows = pa.Table.from_batches(list(csv_rows(pa.BufferReader(data), schema, 1 << 10)))
    batches = pa.Table.from_batches(list(csv_batches(pa.BufferReader(data), schema, 1 << 10)))
    assert rows.equals(batches)


def test_csv_rows_keep_the_types_of_the_first_block_and_cut_a_long_bad_text() -> None:
    data = ("n\n" + "".join(f"{i}\n" for i in range(50)) + "y" * 5000 + "\n7\n").encode()
    good, bad = _rows_and_bad(csv_rows(pa.BufferReader(data), {}, 64), "n")
    assert good == [*range(50), 7]
    [long] = bad
    assert (long.row, long.line) == (50, 52)
    assert len(long.text) == TEXT_MAX and long.text.endswith("...")
    assert long.message.startswith("line 52, column 'n': cannot convert 'yyy")


@pytest.mark.parametrize("block_bytes", [16, 1 << 20])
def test_jsonl_rows_hand_out_each_bad_line_in_its_place(block_bytes: int) -> None:
    lines = [f'{{"a": {i}, "b": "x{i}"}}' for i in range(12)]
    lines[3] = '{"a": 3,'
    lines[7] = "[1, 2]"
    lines[10] = '{"a": "ten", "b": "x"}'
    data = ("\n".join(lines) + "\n").encode()
    items = jsonl_rows(pa.BufferReader(data), parse_schema("a:int64"), block_bytes)
    good, bad = _rows_and_bad(items, "a")
    assert good == [0, 1, 2, 4, 5, 6, 8, 9, 11]
    assert [(b.row, b.line) for b in bad] == [(3, 4), (7, 8), (10, 11)]
    assert bad[0].message.startswith("line 4: not valid JSON")
    assert bad[1].message == "line 8: not a JSON object (a list)"
    assert bad[2].message == "line 11: Column(/a) changed from number to string"
