"""``dlq show``: one dead letter in words: where it is, why it was dead-lettered, its headers,
and a preview of its rows decoded as the consumer decodes them (or the decode error). Copies of
one letter (the same ``DeadLetter.identity``) are shown once, as the first read, "seen N
times" with where the others sit (``collect``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.dlq.selection import Selection
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.errors import WireError

PREVIEW_CELL_CHARS = 80
COPIES_NAMED = 5
"""Copies named by place in ``describe`` (the rest counted)."""


@dataclass
class Shown:
    """A letter to show and the copies of it read (their refs, in the order read)."""

    letter: DeadLetter
    copies: list[str] = field(default_factory=list)

    @property
    def seen(self) -> int:
        return 1 + len(self.copies)


async def collect(
    letters: AsyncIterator[DeadLetter], selection: Selection, limit: int
) -> list[Shown]:
    """The first ``limit`` distinct letters ``selection`` matches, each with its copies. Once
    ``limit`` are found the rest of the queue is still read for copies of them (so "seen N
    times" is the whole queue's count), unless none of them can have a copy (no identity)."""
    shown: list[Shown] = []
    by_key: dict[bytes, Shown] = {}
    if limit <= 0:
        return shown
    async for letter in letters:
        full = len(shown) >= limit
        if full and not by_key:
            break
        if not selection.matches(letter):
            continue
        copy_key = letter.copy_key
        first = None if copy_key is None else by_key.get(copy_key)
        if first is not None:
            if letter.ref != first.letter.ref and letter.ref not in first.copies:
                first.copies.append(letter.ref)
            continue
        if full:
            continue
        entry = Shown(letter)
        shown.append(entry)
        if copy_key is not None:
            by_key[copy_key] = entry
    return shown


def preview(letter: DeadLetter, rows: int) -> list[str]:
    """The first ``rows`` rows of the payload, one line each, or why it does not decode."""
    if letter.values is not None:  # a table run's row, or a part of its input it could not read
        if not letter.values:
            return ["no values: a part of the input that could not be read"]
        return ["1 row", "  " + ", ".join(f"{k}={_cell(v)}" for k, v in letter.values.items())]
    try:
        chunk = decode_chunk(letter.payload, letter.original_attributes())
    except WireError as exc:
        return [f"does not decode: {exc.reason}: {exc}"]
    except Exception as exc:  # noqa: BLE001 (a payload no check foresaw must not stop a listing)
        return [f"does not decode: {type(exc).__name__}: {exc}"]
    names = list(chunk.columns)
    out = [f"{chunk.row_count} rows; columns: {', '.join(names)}"]
    for i in range(min(rows, chunk.row_count)):
        cells = {name: _cell(chunk.columns[name][i]) for name in names}
        out.append("  " + ", ".join(f"{k}={v}" for k, v in cells.items()))
    if chunk.row_count > rows:
        out.append(f"  ... {chunk.row_count - rows} more")
    return out


def _cell(value: Any) -> str:
    if isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=8, edgeitems=3, separator=",")
    elif isinstance(value, bytes):
        text = repr(value)
    else:
        text = str(value)
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CELL_CHARS else text[: PREVIEW_CELL_CHARS - 3] + "..."


def describe(letter: DeadLetter, rows: int, *, copies: Sequence[str] = ()) -> list[str]:
    """The letter in lines: its place, reason, message, headers and row preview; with
    ``copies`` (where its copies sit), how many times it was seen."""
    when = letter.time.isoformat(timespec="milliseconds") if letter.time else "unknown time"
    out = [
        f"{letter.ref}  {when}",
        f"  reason   {letter.reason} ({letter.code})",
        f"  message  {letter.message or '-'}",
        f"  from     {letter.source} message {letter.message_id}, delivery attempt "
        f"{letter.delivery_attempt if letter.delivery_attempt is not None else '?'}, consumer "
        f"{letter.consumer_version}",
        f"  chunk    {letter.chunk_id} of table {letter.table}"
        + (f", replayed {letter.replays} times before" if letter.replays else ""),
    ]
    if copies:
        named = ", ".join(copies[:COPIES_NAMED])
        more = f" and {len(copies) - COPIES_NAMED} more" if len(copies) > COPIES_NAMED else ""
        out.append(f"  seen     {1 + len(copies)} times: also at {named}{more}")
    if letter.key is not None:
        out.append(f"  key      {letter.key!r}")
    out.append("  headers")
    out += [f"    {k}: {v}" for k, v in sorted(letter.original_attributes().items())]
    out.append(f"  payload  {len(letter.payload)} bytes")
    out += [f"    {line}" for line in preview(letter, rows)]
    return out


def to_json(letter: DeadLetter, rows: int, *, copies: Sequence[str] = ()) -> dict[str, Any]:
    """The letter as JSON; ``seen`` counts it and its ``copies`` (their refs)."""
    return {
        "ref": letter.ref,
        "time": letter.time.isoformat() if letter.time else None,
        "reason": letter.reason,
        "code": letter.code,
        "message": letter.message,
        "source": letter.source,
        "message_id": letter.message_id,
        "delivery_attempt": letter.delivery_attempt,
        "consumer_version": letter.consumer_version,
        "table": letter.table,
        "chunk_id": letter.chunk_id,
        "replays": letter.replays,
        "seen": 1 + len(copies),
        "copies": list(copies),
        "attributes": dict(letter.attributes),
        "payload_bytes": len(letter.payload),
        "preview": preview(letter, rows),
    }


__all__ = ["Shown", "collect", "describe", "preview", "to_json"]
