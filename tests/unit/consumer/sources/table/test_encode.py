"""A piece as the chunk a producer would publish: one chunk with the piece's id when every row
converts; otherwise the piece is bisected until every failing row stands alone (dead letter,
class undecodable), the rest in chunks keyed ``<file>@<first row>``, every row exactly once."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.consumer.sources.table.encode import Encoded, encode_piece
from rowbatch.consumer.sources.table.plan import plan_table
from rowbatch.consumer.sources.table.reader import Piece, UnitReader
from rowbatch.tables.schema import parse_schema
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.dead_letter import ReasonClass
from tests.unit.consumer.sources.table.data import write_dataset

DIM = 4
SCHEMA = parse_schema(f"v:vector[float32,{DIM}]")


def vector_piece(root: Path, rows: int, bad: set[int]) -> Piece:
    """A piece of ``rows`` rows (ids 0..) with a list<float32> column ``v`` of ``DIM`` values,
    except ``bad`` rows, which have ``DIM - 1``."""
    vectors = [[float(i)] * (DIM - 1 if i in bad else DIM) for i in range(rows)]
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "v": pa.array(vectors, pa.list_(pa.float32())),
        }
    )
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / "vec.parquet")
    return only_piece(str(root), rows)


def only_piece(location: str, chunk_rows: int) -> Piece:
    """The one piece of a one-unit input."""
    plan = plan_table(location)
    reader = UnitReader(plan.filesystem, chunk_rows)
    try:
        [piece] = reader.pieces(plan.units[0])
    finally:
        reader.close()
    return piece


def covered(encoded: Encoded) -> list[int]:
    """The file rows of every chunk and bad row, in order."""
    parts = [p for p, _ in encoded.chunks] + [p for p, _ in encoded.bad]
    return sorted(p.first_row + i for p in parts for i in range(p.rows))


def test_a_good_piece_is_one_chunk_with_the_piece_id(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", [("a.parquet", 6)], 6)
    part = only_piece(str(tmp_path / "in"), 6).part(2, 4)
    encoded = encode_piece(part, "events", {})
    assert encoded.bad == []
    [(same, chunk)] = encoded.chunks
    assert same is part
    assert chunk.headers.chunk_id == "a.parquet@0"  # the chunk's keys: part.row_offset 2
    assert part.row_offset == 2
    assert chunk.headers.table == "events"
    decoded = decode_chunk(chunk.payload, chunk.attributes)
    assert decoded.row_count == 4
    assert list(decoded.columns["id"]) == [2, 3, 4, 5]
    assert list(decoded.columns["name"]) == [f"row {i}" for i in range(2, 6)]


def test_one_row_with_a_vector_of_the_wrong_length_is_the_only_bad_row(tmp_path: Path) -> None:
    piece = vector_piece(tmp_path / "in", 10, {6})
    encoded = encode_piece(piece, "t", SCHEMA)
    [(bad, reason)] = encoded.bad
    assert (bad.first_row, bad.rows, bad.chunk_id, bad.row_offset) == (6, 1, "vec.parquet@0", 6)
    assert reason.reason_class is ReasonClass.UNDECODABLE
    assert reason.code == "invalid_value"
    assert "'v'" in reason.message
    assert "data row 7" in reason.message  # 1-based, as the producer says it
    assert covered(encoded) == list(range(10))
    for part, chunk in encoded.chunks:
        assert chunk.headers.chunk_id == "vec.parquet@0"
        assert part.row_offset == part.first_row
        decoded = decode_chunk(chunk.payload, chunk.attributes)
        ids = [int(v) for v in decoded.columns["id"]]
        assert ids == list(range(part.first_row, part.first_row + part.rows))
        assert decoded.columns["v"].shape == (part.rows, DIM)


def test_two_bad_rows_come_out_alone_and_the_rest_exactly_once(tmp_path: Path) -> None:
    piece = vector_piece(tmp_path / "in", 9, {0, 5})
    encoded = encode_piece(piece, "t", SCHEMA)
    assert [(p.first_row, p.rows) for p, _ in encoded.bad] == [(0, 1), (5, 1)]
    assert all(r.reason_class is ReasonClass.UNDECODABLE for _, r in encoded.bad)
    good_rows = [p.first_row + i for p, _ in encoded.chunks for i in range(p.rows)]
    assert good_rows == [1, 2, 3, 4, 6, 7, 8]  # in row order, none twice
    assert covered(encoded) == list(range(9))
    ids = [p.message_id for p, _ in encoded.chunks]
    assert len(set(ids)) == len(ids)
    assert {c.headers.chunk_id for _, c in encoded.chunks} == {"vec.parquet@0"}


def test_a_piece_whose_rows_all_fail_is_all_bad_rows(tmp_path: Path) -> None:
    piece = vector_piece(tmp_path / "in", 3, {0, 1, 2})
    encoded = encode_piece(piece, "t", SCHEMA)
    assert encoded.chunks == []
    assert [p.first_row for p, _ in encoded.bad] == [0, 1, 2]


def test_without_a_declared_type_a_lone_odd_vector_is_a_chunk_of_its_own(tmp_path: Path) -> None:
    """Undeclared, a vector column's length is taken from its first row, so the odd row is
    cut out but encodes alone (with its own length); the binding check dead-letters it."""
    piece = vector_piece(tmp_path / "in", 6, {3})
    encoded = encode_piece(piece, "t", {})
    assert encoded.bad == []
    assert covered(encoded) == list(range(6))
    [odd] = [c for p, c in encoded.chunks if p.first_row == 3 and p.rows == 1]
    assert decode_chunk(odd.payload, odd.attributes).columns["v"].shape == (1, DIM - 1)


@pytest.fixture(scope="module")
def piece_of_16(tmp_path_factory: pytest.TempPathFactory) -> Piece:
    return vector_piece(tmp_path_factory.mktemp("enc") / "in", 16, set())


@settings(max_examples=40, deadline=None)
@given(bad=st.sets(st.integers(0, 15), max_size=6))
def test_bisection_isolates_exactly_the_bad_rows(piece_of_16: Piece, bad: set[int]) -> None:
    rows = piece_of_16.table.to_pylist()
    for i in bad:
        rows[i]["v"] = [0.0] * (DIM + 1)
    piece = Piece(piece_of_16.unit, 0, pa.Table.from_pylist(rows, schema=piece_of_16.table.schema))
    encoded = encode_piece(piece, "t", SCHEMA)
    assert sorted(p.first_row for p, _ in encoded.bad) == sorted(bad)
    assert all(p.rows == 1 for p, _ in encoded.bad)
    assert covered(encoded) == list(range(16))
    good = [p.first_row + i for p, _ in encoded.chunks for i in range(p.rows)]
    assert good == sorted(set(range(16)) - bad)
