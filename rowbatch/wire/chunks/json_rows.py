"""Some rows of a JSON chunk as a JSON chunk of their own, taken from the document rather than
from its decoded columns: how a chunk whose JSON decode fails in some rows only (a vector row
with the wrong number of elements, a null element in a vector) is parted into the rows that
decode and those that do not (:func:`bad_json_rows`), and how the latter are dead-lettered
with their values as sent (:func:`json_part_payload`).

The failure path only: each call parses the document with the standard library (whose
reading the decoder's strict path matches: big integers stay integers, NaN literals are read)
and writes the rows back with every non-ASCII character escaped, so what a row held is what
its part holds."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Final

from rowbatch.wire.errors import ColumnTypeMismatch, InvalidJson, InvalidValue, WireError
from rowbatch.wire.headers.chunk_headers import ChunkHeaders

#: The JSON decode errors one row's values can cause on their own.
ROW_ERRORS: Final = (ColumnTypeMismatch, InvalidValue)


def json_rows(payload: bytes, rows: Sequence[int]) -> bytes:
    """The JSON chunk ``payload`` holding only ``rows`` (indexes, in the order given); raises
    :class:`InvalidJson` when it is not a document of columns of equal length."""
    try:
        doc = json.loads(payload)
        entries = doc["columns"]
        n = {len(entry["values"]) for entry in entries}
    except (ValueError, TypeError, KeyError) as exc:
        raise InvalidJson(
            f"the rows of this payload cannot be taken apart: {exc}",
            expected='{"columns": [{"values": [...]}, ...]}',
            found=type(exc).__name__,
        ) from exc
    if len(n) != 1 or any(not 0 <= r < next(iter(n)) for r in rows):
        raise InvalidJson(
            "the rows of this payload cannot be taken apart: columns of unequal length",
            expected="columns of equal length",
            found=str(sorted(n)),
        )
    out = [{**entry, "values": [entry["values"][r] for r in rows]} for entry in entries]
    return json.dumps({"columns": out}, separators=(",", ":")).encode("ascii")


def with_rows(attributes: Mapping[str, str], rows: int) -> dict[str, str]:
    """``attributes`` (a chunk's) with its row count ``rows``."""
    headers = replace(ChunkHeaders.from_attributes(attributes), row_count=rows)
    return {**attributes, **headers.to_attributes()}


def json_part_payload(
    payload: bytes, attributes: Mapping[str, str], rows: Sequence[int], chunk_id: str
) -> tuple[bytes, dict[str, str]]:
    """Rows ``rows`` of the JSON chunk (``payload``, ``attributes``) as a chunk ``chunk_id``
    of their own (its standard headers only, as a decoded part's), values as sent."""
    headers = ChunkHeaders.from_attributes(attributes)
    part = replace(headers, row_count=len(rows), chunk_id=chunk_id)
    return json_rows(payload, rows), part.to_attributes()


def bad_json_rows(
    payload: bytes,
    attributes: Mapping[str, str],
    decode: Callable[[bytes, Mapping[str, str]], Any],
) -> list[tuple[int, WireError]] | None:
    """The rows of the JSON chunk (``payload``, ``attributes``; its decode failed with one of
    :data:`ROW_ERRORS`) whose values ``decode`` refuses alone, ascending, each with its error;
    None when a part fails otherwise, the document cannot be taken apart, or every row fails.
    ``k`` bad rows among ``n`` cost at most ``2k ceil(log2 n)`` decodes of halves."""
    try:
        n = ChunkHeaders.from_attributes(attributes).row_count
        json_rows(payload, [])
    except WireError:
        return None
    bad: list[tuple[int, WireError]] = []
    pending = [(n // 2, n), (0, n // 2)]
    while pending:
        lo, hi = pending.pop()
        if lo == hi:
            continue
        try:
            decode(json_rows(payload, range(lo, hi)), with_rows(attributes, hi - lo))
        except ROW_ERRORS as exc:
            if hi - lo == 1:
                bad.append((lo, exc))
            else:
                mid = (lo + hi) // 2
                pending += [(mid, hi), (lo, mid)]
        except WireError:
            return None
    if not bad or len(bad) == n:
        return None
    return bad
