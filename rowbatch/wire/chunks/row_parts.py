"""Some rows of a chunk as a chunk of their own that keeps the rows' keys: what a consumer
dead-letters when only those rows failed (docs/wire-format.md, "Row parts").

A part is a valid chunk in its parent's encoding holding only the chosen rows, with two more
headers: ``rowbatch-parent-chunk-id`` (the parent's chunk id) and ``rowbatch-parent-rows`` (the
rows' indexes in the parent, ascending, written as ``3,17,120-125``). A consumer writes row
``i`` of a part under the key ``(parent chunk id, parent rows[i])``, so a part replayed once
fixed lands where its rows would have. Its own chunk id is derived from the parent's and the
indexes (:func:`part_chunk_id`): the same rows of the same chunk always make the same part, so a
redelivery that fails them again dead-letters the same chunk id (the ``dlq`` tools and any
replay see one part, not two).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import encode_payload, headers_for
from rowbatch.wire.chunks.json_rows import ROW_ERRORS, json_part_payload
from rowbatch.wire.columns.canonical import Column
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import (
    CHUNK_ID_RE,
    H_PARENT_CHUNK_ID,
    H_PARENT_ROWS,
    MAX_CHUNK_ID_LEN,
    Encoding,
    invalid_header,
)

_RUN: Final = re.compile(r"(0|[1-9][0-9]{0,17})(?:-(0|[1-9][0-9]{0,17}))?")


def format_rows(rows: Sequence[int]) -> str:
    """``rows`` (ascending, distinct) as ``3,17,120-125``."""
    out: list[str] = []
    i = 0
    while i < len(rows):
        j = i
        while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
            j += 1
        out.append(str(rows[i]) if j == i else f"{rows[i]}-{rows[j]}")
        i = j + 1
    return ",".join(out)


def parse_rows(text: str, count: int) -> NDArray[np.int64]:
    """The indexes a ``rowbatch-parent-rows`` header names: ``count`` of them, ascending and
    distinct, or :class:`~rowbatch.wire.errors.InvalidHeader`."""
    found: list[int] = []
    for part in text.split(","):
        m = _RUN.fullmatch(part.strip())
        if m is None:
            raise invalid_header(H_PARENT_ROWS, "row indexes like '3,17,120-125'", text[:200])
        low = int(m[1])
        high = low if m[2] is None else int(m[2])
        if high < low or (found and low <= found[-1]) or len(found) + high - low + 1 > count:
            raise invalid_header(
                H_PARENT_ROWS, f"{count} ascending distinct row indexes", text[:200]
            )
        found.extend(range(low, high + 1))
    if len(found) != count:
        raise invalid_header(H_PARENT_ROWS, f"{count} row indexes (the row count)", text[:200])
    return np.asarray(found, dtype=np.int64)


def parent_of(attributes: Mapping[str, str], count: int) -> tuple[str, NDArray[np.int64]] | None:
    """A row part's parent chunk id and its rows' indexes there (``count`` of them), None for
    a whole chunk; :class:`~rowbatch.wire.errors.InvalidHeader` when they are malformed."""
    parent = attributes.get(H_PARENT_CHUNK_ID)
    if parent is None:
        return None
    if not CHUNK_ID_RE.fullmatch(parent):
        raise invalid_header(
            H_PARENT_CHUNK_ID, "a chunk id (printable ASCII without spaces)", parent[:300]
        )
    return parent, parse_rows(attributes.get(H_PARENT_ROWS, ""), count)


def part_chunk_id(parent: str, rows: Sequence[int]) -> str:
    """The part's chunk id: ``<parent>~r<12 hex>`` of a hash of the parent and the rows, or,
    when that would pass the chunk id's length limit, ``r-<40 hex>`` of the same hash."""
    digest = hashlib.sha256(f"{parent}\n{format_rows(rows)}".encode()).hexdigest()
    short = f"{parent}~r{digest[:12]}"
    return short if len(short) <= MAX_CHUNK_ID_LEN else f"r-{digest[:40]}"


def row_part(
    payload: bytes, attributes: Mapping[str, str], rows: Sequence[int]
) -> tuple[bytes, dict[str, str]]:
    """The payload and attributes of the part of chunk (``payload``, ``attributes``) holding
    ``rows`` (indexes in it, ascending). A part of a part names the first parent's rows."""
    try:
        chunk = decode_chunk(payload, attributes)
    except ROW_ERRORS:
        if ChunkHeaders.from_attributes(attributes).content_type is not Encoding.JSON:
            raise
        return _json_part(payload, attributes, rows)  # rows that do not decode: as sent
    index = np.asarray(rows, dtype=np.int64)
    cols = [_take(chunk.column(name), index) for name in chunk.columns]
    found = parent_of(attributes, chunk.row_count)
    if found is None:
        parent, keys = chunk.chunk_id, [int(r) for r in rows]
    else:
        parent, keys = found[0], [int(found[1][r]) for r in rows]
    headers = headers_for(
        chunk.table,
        cols,
        chunk.headers.content_type,
        chunk_id=part_chunk_id(parent, keys),
        produced_at=chunk.headers.produced_at,
        ordering_key=chunk.headers.ordering_key,
    )
    out = headers.to_attributes()
    out[H_PARENT_CHUNK_ID] = parent
    out[H_PARENT_ROWS] = format_rows(keys)
    return encode_payload(cols, chunk.headers.content_type, None), out


def _json_part(
    payload: bytes, attributes: Mapping[str, str], rows: Sequence[int]
) -> tuple[bytes, dict[str, str]]:
    """:func:`row_part` of a JSON chunk some of whose rows do not decode: taken from the
    document (``json_rows``), the rows' values as they were sent."""
    count = ChunkHeaders.from_attributes(attributes).row_count
    found = parent_of(attributes, count)
    if found is None:
        parent, keys = ChunkHeaders.from_attributes(attributes).chunk_id, [int(r) for r in rows]
    else:
        parent, keys = found[0], [int(found[1][r]) for r in rows]
    data, out = json_part_payload(payload, attributes, rows, part_chunk_id(parent, keys))
    out[H_PARENT_CHUNK_ID] = parent
    out[H_PARENT_ROWS] = format_rows(keys)
    return data, out


def _take(column: Column, index: NDArray[np.int64]) -> Column:
    nulls = None if column.nulls is None else column.nulls[index]
    if nulls is not None and not nulls.any():
        nulls = None
    return Column(column.name, column.type, column.values[index], nulls)


__all__ = ["format_rows", "parent_of", "parse_rows", "part_chunk_id", "row_part"]
