"""A table run's dead letters: one JSON line per row that could not be written, with its key,
where it came from, why, and its values, in ``dead-letters-*`` segments of the shard's state
folder (``rowbatch-consumer`` never stops a run for a bad row). A rerun after a kill may write a
row's record again (the same key): read them with :func:`read_dead_letters`, which keeps one per
key."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from rowbatch.consumer.sources.base import DeadLetterReason
from rowbatch.consumer.sources.table.reader import Piece
from rowbatch.consumer.sources.table.state import StateFolder

DEAD_LETTER_PREFIX: Final = "dead-letters"


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
    """One JSON line per row of ``piece``."""
    at = datetime.now(UTC).isoformat(timespec="milliseconds")
    rows = piece.table.to_pylist()
    for i, row in enumerate(rows):
        yield orjson.dumps(
            {
                "chunk_id": piece.chunk_id,
                "row_index": i,
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


def write_dead_letters(folder: StateFolder, lines: list[bytes]) -> None:
    """One segment of ``lines`` (blocking)."""
    if lines:
        folder.write_segment(DEAD_LETTER_PREFIX, (line.decode() for line in lines))


def read_dead_letters(folder: StateFolder) -> list[dict[str, Any]]:
    """Every dead letter of the folder, one per ``(file, file_row)``, in key order."""
    found: dict[tuple[str, int], dict[str, Any]] = {}
    for name in folder.names(DEAD_LETTER_PREFIX):
        for line in folder.read_segment(name) or ():
            record = orjson.loads(line)
            found.setdefault((record["file"], record["file_row"]), record)
    return [found[k] for k in sorted(found)]


__all__ = ["DEAD_LETTER_PREFIX", "read_dead_letters", "records", "write_dead_letters"]
