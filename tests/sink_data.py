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

from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, TableSpec

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


# --- every wire type: bytes, and text holding U+0000 ------------------------------------------

#: Raw bytes values (``None``: null), NUL and 0xFF bytes included, and an empty value.
RAW_VALUES: tuple[bytes | None, ...] = (
    b"\x00\x01\x02",
    b"",
    None,
    bytes(range(256)),
    "é ✓".encode(),
    b"\\x00 is not a NUL",
)
#: Text values; ``TEXT_WITH_NUL`` holds U+0000, which PostgreSQL cannot store in text.
TEXT_VALUES: tuple[str, ...] = ("plain", "ünï ✓ 🎉", "", "tab\tnewline\n", "x", "y")
TEXT_WITH_NUL = "before\x00after"


def wire_types_spec(name: str) -> TableSpec:
    """A table with a bytes column and a text column (and a number, to see rows line up)."""
    return TableSpec(
        name,
        passthrough=(ColumnSpec("raw", "bytes"), ColumnSpec("label", "object")),
        outputs=(ColumnSpec("score", "float32"),),
    )


def wire_types_rows(chunk: str, *, label_at: Mapping[int, str] | None = None) -> ResultRows:
    """One row per ``RAW_VALUES`` entry in chunk ``chunk``; ``label_at`` overrides labels."""
    n = len(RAW_VALUES)
    labels = list(TEXT_VALUES)
    for i, text in (label_at or {}).items():
        labels[i] = text
    nulls = np.array([v is None for v in RAW_VALUES], dtype=np.bool_)
    return ResultRows(
        chunk_id=np.array([chunk] * n, dtype=object),
        row_index=np.arange(n, dtype=np.int64),
        source_message_id=np.array([f"msg-{chunk}"] * n, dtype=object),
        passthrough={
            # a null's value must not matter: garbage of the wrong type sits under it
            "raw": np.array([b"garbage" if v is None else v for v in RAW_VALUES], dtype=object),
            "label": np.array(labels, dtype=object),
        },
        outputs={"score": np.arange(n, dtype=np.float32) / 4},
        nulls={"raw": nulls},
        model_name="encoder",
        model_version="1",
        processed_at=FIRST_WRITE,
    )
