"""Deterministic result rows for the sink tests, and the expected values to compare against.

Row ``g`` (global, 0-based) belongs to chunk ``chunk-{g // CHUNK_ROWS:03d}`` at index
``g % CHUNK_ROWS``; every value is a function of ``g`` so any subset can be re-made for a
redelivery and checked without keeping state."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np
from numpy.typing import NDArray

from consumer.sinks.base import ColumnSpec, ResultRows, TableSpec

DIM = 384
CHUNK_ROWS = 500
FIRST_WRITE = datetime(2024, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)


def spec(name: str = "results", *, dim: int = DIM, score: str = "float32") -> TableSpec:
    return TableSpec(
        name=name,
        passthrough=(ColumnSpec("doc_id", "int64"), ColumnSpec("title", "object")),
        outputs=(ColumnSpec("embedding", "float32", dim), ColumnSpec("score", score)),
    )


def chunk_of(g: int) -> str:
    return f"chunk-{g // CHUNK_ROWS:03d}"


def _doc_id(g: NDArray[np.int64]) -> NDArray[np.int64]:
    return g * 7 - 1000


def _doc_id_null(g: NDArray[np.int64]) -> NDArray[np.bool_]:
    return np.asarray(g % 13 == 5, dtype=np.bool_)


def _title_null(g: NDArray[np.int64]) -> NDArray[np.bool_]:
    return np.asarray(g % 11 == 3, dtype=np.bool_)


def _embedding(g: NDArray[np.int64], dim: int = DIM) -> NDArray[np.float32]:
    j = np.arange(dim, dtype=np.float64)
    return np.sin(g[:, None] * 0.001 + j[None, :] * 0.37).astype(np.float32)


def _score(g: NDArray[np.int64]) -> NDArray[np.float32]:
    return (g / 10.0 - 3.3).astype(np.float32)


def make_rows(
    globals_: Sequence[int] | NDArray[np.int64],
    *,
    processed_at: datetime = FIRST_WRITE,
    model_version: str = "1",
    garbage_under_nulls: bool = False,
) -> ResultRows:
    """Result rows for these global row numbers (in this order)."""
    g = np.asarray(globals_, dtype=np.int64)
    chunks = np.array([chunk_of(int(x)) for x in g], dtype=object)
    title_null = _title_null(g)
    titles = np.array(
        [None if null else f"title {x} ✓ «{x % 5}»" for x, null in zip(g, title_null, strict=True)],
        dtype=object,
    )
    doc_id = _doc_id(g)
    if garbage_under_nulls:  # values under a null mask must not matter
        titles[title_null] = "garbage"
        doc_id = np.where(_doc_id_null(g), 123456789, doc_id)
    return ResultRows(
        chunk_id=chunks,
        row_index=g % CHUNK_ROWS,
        source_message_id=np.array([f"msg-{x // CHUNK_ROWS}" for x in g], dtype=object),
        passthrough={"doc_id": doc_id, "title": titles},
        outputs={"embedding": _embedding(g), "score": _score(g)},
        nulls={"doc_id": _doc_id_null(g), "title": title_null},
        model_name="encoder",
        model_version=model_version,
        processed_at=processed_at,
    )


def batches(start: int, stop: int, size: int) -> list[NDArray[np.int64]]:
    return [np.arange(a, min(a + size, stop), dtype=np.int64) for a in range(start, stop, size)]


#: What a reader hands back: column name -> one value per row (any row order), vectors 2-D.
Snapshot = Mapping[str, Any]


def check_snapshot(
    snap: Snapshot,
    expected: Sequence[int] | NDArray[np.int64],
    *,
    processed_at: datetime = FIRST_WRITE,
    model_version: str = "1",
) -> None:
    """The table holds exactly the rows ``expected`` (global numbers), each once, with the values
    of their first write."""
    keys = list(zip(snap["chunk_id"], snap["row_index"], strict=True))
    assert len(keys) == len(set(keys)), "duplicate (chunk_id, row_index)"
    g = np.array(sorted(int(expected_g) for expected_g in expected), dtype=np.int64)
    order = sorted(range(len(keys)), key=lambda i: (keys[i][0], int(keys[i][1])))
    assert len(keys) == len(g), f"{len(keys)} rows, expected {len(g)}"
    # chunk names sort with the global number since they are zero-padded
    want_keys = [(chunk_of(int(x)), int(x % CHUNK_ROWS)) for x in g]
    got_keys = [(str(keys[i][0]), int(keys[i][1])) for i in order]
    assert got_keys == want_keys

    def col(name: str) -> list[Any]:
        values = snap[name]
        return [values[i] for i in order]

    assert col("source_message_id") == [f"msg-{x // CHUNK_ROWS}" for x in g]
    want_doc = [None if n else int(v) for v, n in zip(_doc_id(g), _doc_id_null(g), strict=True)]
    assert [None if v is None else int(v) for v in col("doc_id")] == want_doc
    want_title = [
        None if n else f"title {x} ✓ «{x % 5}»" for x, n in zip(g, _title_null(g), strict=True)
    ]
    assert col("title") == want_title
    emb = np.asarray(snap["embedding"], dtype=np.float32)[order]
    np.testing.assert_array_equal(emb, _embedding(g))
    np.testing.assert_array_equal(np.asarray(col("score"), dtype=np.float32), _score(g))
    assert set(col("model_name")) <= {"encoder"}
    assert set(col("model_version")) <= {model_version}
    assert {t.astimezone(UTC) for t in col("processed_at")} <= {processed_at}
