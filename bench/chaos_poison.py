"""What the chaos campaign publishes: messages with the outcome the promise expects for each
(written, or dead-lettered with a reason and a fine ``rowbatch-dlq-code``). Good numeric rows
for the ``scorer`` lanes, and poison of nine kinds mixed into good text rows for the ``chaos``
model lanes (see docs/chaos.md for the table)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rowbatch.producer.loadgen.plan import plan_chunk
from rowbatch.producer.loadgen.spec import DEFAULT_REJECT_MARKER, LoadSpec
from rowbatch.producer.publishers.messages import Message, RawMessage
from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.columns.column_type import BYTES, INT64, STRING
from rowbatch.wire.headers.fields import H_CONTENT_TYPE, H_ROW_COUNT

GOOD = "good"
TEXT_TABLE = "chaos_rows"
REJECT_MARKER = DEFAULT_REJECT_MARKER

SCORER_BINDING: dict[str, Any] = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}
POISON_BINDING: dict[str, Any] = {
    "inputs": {"text": "TEXT"},
    "outputs": {"EMBEDDING": "embedding"},
    "passthrough": {"id": "int64", "note": "string"},
}
BYTES_BINDING: dict[str, Any] = {
    "inputs": {"text": "TEXT"},
    "outputs": {"EMBEDDING": "embedding"},
    "passthrough": {"id": "int64", "blob": "bytes"},
}

#: kind -> (rowbatch-dlq-reason, rowbatch-dlq-code) the promise and docs/wire-format.md
#: section 6 give it.
POISON_KINDS: dict[str, tuple[str, str]] = {
    "bad-encoding": ("undecodable", "invalid_json"),
    "missing-header": ("undecodable", "missing_header"),
    "wrong-type": ("schema-mismatch", "column_type_mismatch"),
    "row-count": ("undecodable", "row_count_mismatch"),
    "unsupported-content-type": ("undecodable", "unsupported_content_type"),
    "null-input": ("schema-mismatch", "null_not_allowed"),
    "reject-marker": ("rejected-by-model", "invalid_argument"),
    "nul-in-text": ("rejected-by-sink", "text_contains_nul"),
}


ROW_KINDS = frozenset({"reject-marker", "nul-in-text", "null-input"})
"""Poison in one row (the first) that the model, the sink or the input checks reject on its
own: that row is dead-lettered as a row part of its message and the others written (a one-row
message goes whole)."""


@dataclass(frozen=True)
class Planned:
    """One message and what must become of it."""

    message: Message
    chunk_id: str
    rows: int
    kind: str = GOOD
    """``good`` (every row written once) or a key of ``POISON_KINDS``."""

    @property
    def bad_rows(self) -> int:
        """Rows that must end in the dead-letter topic: every row of a poison message, or the
        one bad row of a row-level kind (``ROW_KINDS``) among several."""
        if self.kind == GOOD:
            return 0
        return 1 if self.kind in ROW_KINDS and self.rows > 1 else self.rows

    @property
    def reason(self) -> str | None:
        return POISON_KINDS[self.kind][0] if self.kind != GOOD else None

    @property
    def code(self) -> str | None:
        return POISON_KINDS[self.kind][1] if self.kind != GOOD else None


def numeric_stream(prefix: str, chunk_rows: int) -> Iterator[Planned]:
    """Endless good ``scorer`` chunks (ids 0, 1, ... in order), made as they are needed."""
    spec = LoadSpec(rows=1 << 40, chunk_rows=chunk_rows, kind="numeric", id_prefix=prefix)
    index = 0
    while True:
        for part in plan_chunk(spec, index, None, max_chunk_bytes=900_000):
            yield Planned(part.message, part.chunk_id, part.rows)
        index += 1


def _text_columns(first: int, rows: int, rng: random.Random) -> dict[str, list[Any]]:
    letters = "abcdefghijklmnopqrstuvwxyz "
    return {
        "id": list(range(first, first + rows)),
        "text": ["".join(rng.choice(letters) for _ in range(48)) for _ in range(rows)],
        "note": [f"note {first + i}" for i in range(rows)],
    }


_SCHEMA = {"id": INT64, "text": STRING, "note": STRING}


def _poison(kind: str, chunk_id: str, first: int, rows: int, rng: random.Random) -> Message:
    cols = _text_columns(first, rows, rng)
    good_json = encode_chunk(TEXT_TABLE, cols, "json", chunk_id, schema=_SCHEMA)
    good = encode_chunk(TEXT_TABLE, cols, "arrow", chunk_id, schema=_SCHEMA)
    attrs = dict(good.attributes)
    makers: dict[str, Callable[[], Message]] = {
        "bad-encoding": lambda: RawMessage(b'{"columns": [not json', good_json.attributes),
        "missing-header": lambda: RawMessage(
            good.payload, {k: v for k, v in attrs.items() if k != H_ROW_COUNT}
        ),
        "wrong-type": lambda: encode_chunk(
            TEXT_TABLE, {**cols, "text": list(range(rows))}, "arrow", chunk_id
        ),
        "row-count": lambda: RawMessage(good.payload, {**attrs, H_ROW_COUNT: str(rows + 1)}),
        "unsupported-content-type": lambda: RawMessage(
            b"id,text,note\n1,a,b\n", {**attrs, H_CONTENT_TYPE: "text/csv"}
        ),
        "null-input": lambda: encode_chunk(
            TEXT_TABLE,
            {**cols, "text": [None, *cols["text"][1:]]},
            "arrow",
            chunk_id,
            schema=_SCHEMA,
        ),
        "reject-marker": lambda: encode_chunk(
            TEXT_TABLE,
            {**cols, "text": [REJECT_MARKER + cols["text"][0], *cols["text"][1:]]},
            "arrow",
            chunk_id,
            schema=_SCHEMA,
        ),
        "nul-in-text": lambda: encode_chunk(
            TEXT_TABLE,
            {**cols, "note": ["before\x00after", *cols["note"][1:]]},
            "arrow",
            chunk_id,
            schema=_SCHEMA,
        ),
    }
    return makers[kind]()


def poison_plan(prefix: str, good: int, each: int, rows: int, seed: int) -> list[Planned]:
    """``good`` valid text chunks of ``rows`` rows with ``each`` message of every poison kind
    mixed in at seeded places."""
    rng = random.Random(f"{seed}-poison")  # noqa: S311 - a reproducible plan, not crypto
    kinds = [GOOD] * good + [k for k in POISON_KINDS for _ in range(each)]
    rng.shuffle(kinds)
    out = []
    for i, kind in enumerate(kinds):
        chunk_id = f"{prefix}:{i}"
        first = i * rows
        if kind == GOOD:
            cols = _text_columns(first, rows, rng)
            message: Message = encode_chunk(TEXT_TABLE, cols, "arrow", chunk_id, schema=_SCHEMA)
        else:
            message = _poison(kind, chunk_id, first, rows, rng)
        out.append(Planned(message, chunk_id, rows, kind))
    return out


def bytes_plan(prefix: str, count: int, rows: int, seed: int) -> list[Planned]:
    """Valid text chunks with a ``bytes`` passthrough column (arbitrary bytes, NULs included,
    and a null): every row must be written, the bytes stored as they were sent."""
    rng = random.Random(f"{seed}-bytes")  # noqa: S311 - a reproducible plan, not crypto
    schema = {"id": INT64, "text": STRING, "blob": BYTES}
    out = []
    for i in range(count):
        first = i * rows
        cols = _text_columns(first, rows, rng)
        blobs: list[bytes | None] = [
            bytes(rng.randrange(256) for _ in range(16)) + b"\x00" for _ in range(rows)
        ]
        blobs[0] = None
        data = {"id": cols["id"], "text": cols["text"], "blob": blobs}
        chunk_id = f"{prefix}:{i}"
        out.append(Planned(encode_chunk(TEXT_TABLE, data, "arrow", chunk_id, schema=schema),
                           chunk_id, rows))  # fmt: skip
    return out
