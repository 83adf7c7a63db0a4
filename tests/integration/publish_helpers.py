"""Shared by the publishing integration tests: a 100,000-row table written as CSV or Parquet, the
CLI run in-process, and an exact comparison of decoded messages with the table."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from rowbatch.producer.cli.main import main
from rowbatch.wire.chunks.decode import decode_chunk

ROWS = 100_000
DIM = 4
SCHEMA = f"id:int64,text:string,score:float64,flag:bool,emb:vector[float32,{DIM}]"
REQUIRED_HEADERS = {
    "rowbatch-format-version",
    "content-type",
    "rowbatch-chunk-id",
    "rowbatch-table",
    "rowbatch-row-count",
    "rowbatch-produced-at",
}


def make_table(n: int = ROWS, *, text_nulls: bool = False) -> pa.Table:
    """``id`` 0..n-1, Unicode text (quotes, commas, newlines, empty strings), float64 with nulls,
    bool, and a float32 vector column; deterministic."""
    rng = np.random.default_rng(2024)
    ids = np.arange(n, dtype=np.int64)
    words = np.array(["tea", "coffee", "ünïcødé ✓", 'say "hi"', "a,b", "two\nlines", "日本"])
    picks = rng.integers(0, len(words), size=(n, 3))
    text: list[str | None] = [
        "" if i % 97 == 0 else f"{i}: " + " ".join(words[p]) for i, p in enumerate(picks)
    ]
    if text_nulls:
        text = [None if i % 13 == 0 else t for i, t in enumerate(text)]
    score = rng.standard_normal(n) * 1e3
    emb = rng.standard_normal((n, DIM)).astype(np.float32)
    return pa.table(
        {
            "id": ids,
            "text": pa.array(text, type=pa.string()),
            "score": pa.array(score, mask=ids % 17 == 5),
            "flag": ids % 3 == 0,
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), DIM),
        }
    )


def write_file(table: pa.Table, path: Path) -> Path:
    """CSV (vectors as JSON arrays in text cells) or Parquet, by the suffix."""
    if path.suffix == ".parquet":
        pq.write_table(table, path)
        return path
    emb = table.column("emb").combine_chunks()
    flat = emb.flatten().to_numpy().reshape(-1, DIM)
    cells = [json.dumps([float(v) for v in row]) for row in flat]
    csv_table = table.set_column(table.schema.get_field_index("emb"), "emb", pa.array(cells))
    pcsv.write_csv(csv_table, path)
    return path


@dataclass
class CliRun:
    code: int
    out: str
    err: str

    @property
    def rows_per_s(self) -> float:
        match = re.search(r"= ([\d,]+) rows/s", self.out)
        return float(match[1].replace(",", "")) if match else 0.0

    @property
    def id_prefix(self) -> str:
        match = re.search(r"chunk ids (\S+):N\)", self.out)
        assert match, self.out
        return match[1]


def run_cli(argv: Sequence[str]) -> CliRun:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), stdout=out, stderr=err)
    return CliRun(code, out.getvalue(), err.getvalue())


def decoded_rows(
    messages: Iterable[tuple[bytes, Mapping[str, str]]],
) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, np.ndarray[Any, Any]], list[str]]:
    """Decodes every message; returns columns and null masks in ``id`` order, and chunk ids."""
    values: dict[str, list[np.ndarray[Any, Any]]] = {}
    nulls: dict[str, list[np.ndarray[Any, Any]]] = {}
    chunk_ids = []
    for payload, attributes in messages:
        assert set(attributes) >= REQUIRED_HEADERS, sorted(attributes)
        chunk = decode_chunk(payload, attributes)
        chunk_ids.append(chunk.chunk_id)
        for name, column in chunk.columns.items():
            values.setdefault(name, []).append(np.asarray(column))
            mask = chunk.null_masks.get(name)
            nulls.setdefault(name, []).append(
                np.zeros(chunk.row_count, np.bool_) if mask is None else np.asarray(mask)
            )
    order = np.argsort(np.concatenate(values["id"]), kind="stable")
    return (
        {name: np.concatenate(parts)[order] for name, parts in values.items()},
        {name: np.concatenate(parts)[order] for name, parts in nulls.items()},
        chunk_ids,
    )


def assert_rows_equal(
    table: pa.Table, columns: Mapping[str, np.ndarray[Any, Any]], nulls: Mapping[str, Any]
) -> None:
    """Every row and column exactly as in ``table``: same ids (no loss, no duplicates), the
    same bits for floats, the same nulls."""
    assert list(columns) == table.column_names
    assert columns["id"].tolist() == table.column("id").to_pylist()
    for name in table.column_names:
        expected = table.column(name).combine_chunks()
        mask = np.asarray(expected.is_null().to_numpy(zero_copy_only=False), dtype=np.bool_)
        assert np.array_equal(nulls[name], mask), name
        got = columns[name]
        if pa.types.is_fixed_size_list(expected.type):
            want = expected.flatten().to_numpy().reshape(len(expected), -1)
            assert got.dtype == np.float32
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), name
        elif pa.types.is_floating(expected.type):
            want = expected.fill_null(0.0).to_numpy()
            assert got.dtype == want.dtype
            assert np.array_equal(got.view(np.uint64), want.view(np.uint64)), name
        else:
            want_list = expected.to_pylist()
            got_list = [None if m else v for v, m in zip(got.tolist(), mask, strict=True)]
            assert got_list == want_list, name
