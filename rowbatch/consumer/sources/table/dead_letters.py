"""A table run's dead letters: one JSON line per row that could not be written, with its key,
where it came from, why, and its values, in ``dead-letters-*.jsonl`` files of the shard's state
folder (``rowbatch-consumer`` never stops a run for a bad row), and one line per part of a file
that could not be read at all (``code`` ``unreadable_input``, ``rows`` how many if known). A
file is plain JSON Lines, every line a record: it is written whole or not at all, so it needs no
completion marker (the files of earlier versions, without the suffix, end with a line ``end``;
they are still read, and ignored when a kill cut them short). A row's record is written before
its row is recorded in the progress as dead-lettered; a kill between the two leaves a record
whose row the progress does not hold, and the next run records those rows as settled at start
(:func:`lettered_rows`) rather than dead-letter them again. Files of earlier versions may hold
a row's record twice (the same key): read them with :func:`read_dead_letters`, which keeps one
per key."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.consumer.sources.table.reader import Piece
from rowbatch.consumer.sources.table.state import StateFolder
from rowbatch.wire.dead_letter import ReasonClass

DEAD_LETTER_PREFIX: Final = "dead-letters"
JSONL_SUFFIX: Final = ".jsonl"
READ_THREADS: Final = 16
"""Dead-letter files read at once by :func:`lettered_rows` (an object store answers each read
in tens of milliseconds)."""


def _plain(value: object) -> Any:
    """A value JSON can hold: bytes as base64 text, NaN and infinities as text, structs and
    maps as objects and lists, anything else JSON has no form for (decimals, durations...)
    as its text."""
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode()}
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    return str(value)


def records(piece: Piece, reason: DeadLetterReason, *, attempt: int) -> Iterator[bytes]:
    """One JSON line per row of ``piece``; for a bad line of a text file (no values), its
    ``line`` number in the file and its ``text``."""
    at = datetime.now(UTC).isoformat(timespec="milliseconds")
    if piece.bad_line is not None:
        bad = piece.bad_line
        yield orjson.dumps(
            {
                "chunk_id": piece.chunk_id,
                "row_index": piece.row_offset,
                "file": piece.unit.file.relative,
                "file_row": piece.first_row,
                "line": bad.line,
                "text": bad.text,
                "reason": reason.reason_class.value,
                "code": reason.code,
                "message": reason.message,
                "attempt": attempt,
                "at": at,
                "row": {},
            }
        )
        return
    rows = piece.table.to_pylist()
    for i, row in enumerate(rows):
        yield orjson.dumps(
            {
                "chunk_id": piece.chunk_id,
                "row_index": piece.row_offset + i,
                "file": piece.unit.file.relative,
                "file_row": piece.first_row + i,
                "reason": reason.reason_class.value,
                "code": reason.code,
                "message": reason.message,
                "attempt": attempt,
                "at": at,
                "row": {k: _plain(v) for k, v in row.items()},
            }
        )


UNREADABLE_CODE: Final = "unreadable_input"


def unreadable_record(file: str, first_row: int, rows: int | None, message: str) -> bytes:
    """One JSON line for a part of a file that could not be read (from ``first_row``;
    ``rows`` None: to the file's end, count unknown): no row values, no chunk."""
    return orjson.dumps(
        {
            "chunk_id": None,
            "row_index": None,
            "file": file,
            "file_row": first_row,
            "rows": rows,
            "reason": ReasonClass.UNDECODABLE.value,
            "code": UNREADABLE_CODE,
            "message": message,
            "attempt": 1,
            "at": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "row": None,
        }
    )


def write_dead_letters(folder: StateFolder, lines: list[bytes]) -> str | None:
    """A new ``dead-letters-<time>-<pid>-<seq>.jsonl`` file of ``lines``, plain JSON Lines
    written whole or not at all (:meth:`StateFolder.write_whole`), so it needs no completion
    marker; its name, or None for no lines (blocking)."""
    if not lines:
        return None
    name = folder.new_name(DEAD_LETTER_PREFIX, JSONL_SUFFIX)
    folder.write_whole(name, b"".join(line + b"\n" for line in lines).decode())
    return name


def _lines(folder: StateFolder, name: str) -> list[str]:
    """The records of one file: a ``.jsonl`` one whole; one of an earlier version (no suffix,
    the last line ``end``) through :meth:`StateFolder.read_segment`, none when a kill cut it."""
    if not name.endswith(JSONL_SUFFIX):
        return folder.read_segment(name) or []
    text = folder.read(name)
    return [] if text is None else [line for line in text.split("\n") if line]


def lettered_rows(folder: StateFolder) -> set[tuple[str, int]]:
    """The ``(file, file_row)`` of every row (or bad line) with a record in the folder's
    dead-letter files; not the parts of a file that could not be read (blocking)."""
    names = folder.names(DEAD_LETTER_PREFIX)
    if not names:
        return set()
    with ThreadPoolExecutor(min(READ_THREADS, len(names))) as pool:
        texts = list(pool.map(lambda name: _lines(folder, name), names))
    found: set[tuple[str, int]] = set()
    for lines in texts:
        for line in lines:
            record = orjson.loads(line)
            if record.get("code") == UNREADABLE_CODE or record.get("chunk_id") is None:
                continue
            found.add((str(record["file"]), int(record["file_row"])))
    return found


def read_dead_letters(folder: StateFolder) -> list[dict[str, Any]]:
    """Every dead letter of the folder, one per ``(file, file_row)``, in key order."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for name in folder.names(DEAD_LETTER_PREFIX):
        for line in _lines(folder, name):
            record = orjson.loads(line)
            found.setdefault((record["file"], record["file_row"]), record)
    return [found[k] for k in sorted(found)]


__all__ = [
    "DEAD_LETTER_PREFIX",
    "JSONL_SUFFIX",
    "UNREADABLE_CODE",
    "lettered_rows",
    "read_dead_letters",
    "records",
    "unreadable_record",
    "write_dead_letters",
]
