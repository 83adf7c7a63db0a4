"""``dlq show``: one dead letter in words: where it is, why it was dead-lettered, its headers,
and a preview of its rows decoded as the consumer decodes them (or the decode error)."""

from __future__ import annotations

from typing import Any

import numpy as np

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.errors import WireError

PREVIEW_CELL_CHARS = 80


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


def describe(letter: DeadLetter, rows: int) -> list[str]:
    """The letter in lines: its place, reason, message, headers and row preview."""
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
    if letter.key is not None:
        out.append(f"  key      {letter.key!r}")
    out.append("  headers")
    out += [f"    {k}: {v}" for k, v in sorted(letter.original_attributes().items())]
    out.append(f"  payload  {len(letter.payload)} bytes")
    out += [f"    {line}" for line in preview(letter, rows)]
    return out


def to_json(letter: DeadLetter, rows: int) -> dict[str, Any]:
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
        "attributes": dict(letter.attributes),
        "payload_bytes": len(letter.payload),
        "preview": preview(letter, rows),
    }


__all__ = ["describe", "preview", "to_json"]
