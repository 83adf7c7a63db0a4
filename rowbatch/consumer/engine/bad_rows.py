"""The rows of a message that fail the binding's value checks on their own (a null where the
model takes none, a value out of the input's range, text that is not UTF-8): found by bisecting
the message with the same check, so every reason is the check's own words.

A failure that is not a row's (a missing column, a column of the wrong type) fails every part
of the message alike: then the message, not its rows, is the poison (:func:`find_bad_rows`
answers None)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.wire.chunks.decode import DecodedChunk

#: The codes of :class:`SchemaMismatch` that one row's values can cause on their own.
ROW_CODES: Final = frozenset({"null_not_allowed", "invalid_value"})

_ROW_ZERO: Final = re.compile(r"\brow 0\b")


def rows_of(chunk: DecodedChunk, index: NDArray[np.int64] | slice) -> DecodedChunk:
    """The chunk's rows ``index`` (a slice: views; an index array: copies) as a chunk of their
    own, with the same headers and types (not shared with a layout's chunks: its sizes are not
    theirs)."""
    columns = {name: values[index] for name, values in chunk.columns.items()}
    masks = {}
    for name, mask in chunk.null_masks.items():
        taken = mask[index]
        if taken.any():  # a mask only for a column with a null, as the decoder makes them
            masks[name] = taken
    return DecodedChunk._of(
        headers=chunk.headers,
        columns=columns,
        types=chunk.types,
        null_masks=masks,
        row_count=(
            len(range(*index.indices(chunk.row_count))) if isinstance(index, slice) else len(index)
        ),
    )


def find_bad_rows(
    check: Callable[[DecodedChunk], None],
    chunk: DecodedChunk,
    positions: Sequence[int] | NDArray[np.int64] | None = None,
) -> list[tuple[int, SchemaMismatch]] | None:
    """The rows of ``chunk`` (which failed ``check`` with a code in :data:`ROW_CODES`) that fail
    it alone, ascending, each with its error (its words naming the row's index in ``chunk``, or
    ``positions[row]``: its index in its message when ``chunk`` holds some of its rows);
    None when a part fails for a reason that is not a row's, or every row fails (the message
    is the poison then).

    Nulls first: a ``null_not_allowed`` names its column, and every null of that column fails
    alike, so they are set apart at once (one check a column, however many nulls). The rest is
    bisected: ``k`` other bad rows among ``n`` cost at most ``2k ceil(log2 n)`` checks of
    halves, each no larger than the last."""
    n = chunk.row_count

    def name(row: int) -> int:
        return row if positions is None else int(positions[row])

    bad: list[tuple[int, SchemaMismatch]] = []
    rest = np.arange(n, dtype=np.int64)
    for _ in range(len(chunk.null_masks)):
        try:
            check(rows_of(chunk, rest))
        except SchemaMismatch as exc:
            mask = chunk.null_masks.get(exc.column)
            if exc.code != "null_not_allowed" or mask is None or not mask[rest].any():
                break
            nulls = rest[mask[rest]]
            bad += [(int(row), _null_row(exc, name(int(row)))) for row in nulls]
            rest = rest[~mask[rest]]
            continue
        except (ValueError, TypeError, KeyError):
            return None
        return _found(bad, n)
    pending = [(len(rest) // 2, len(rest)), (0, len(rest) // 2)]
    while pending:
        lo, hi = pending.pop()
        if lo == hi:
            continue
        try:
            check(rows_of(chunk, rest[lo:hi]))
        except SchemaMismatch as exc:
            if exc.code not in ROW_CODES:
                return None
            if hi - lo == 1:
                row = int(rest[lo])
                bad.append((row, at_row(exc, name(row))))
            else:
                mid = (lo + hi) // 2
                pending += [(mid, hi), (lo, mid)]
        except (ValueError, TypeError, KeyError):
            return None
    return _found(bad, n)


def _found(
    bad: list[tuple[int, SchemaMismatch]], n: int
) -> list[tuple[int, SchemaMismatch]] | None:
    """``bad`` ascending; None when no row or every row failed alone."""
    if not bad or len(bad) == n:
        return None
    return sorted(bad, key=lambda found: found[0])


def _null_row(error: SchemaMismatch, row: int) -> SchemaMismatch:
    """The ``null_not_allowed`` of row ``row`` of ``error``'s column."""
    return SchemaMismatch(
        f"column {error.column!r} feeds a model input but row {row} is null; model inputs take "
        "no nulls",
        column=error.column,
        expected=error.expected,
        found=f"null at row {row}",
        row=row,
        code=error.code,
    )


def named_row(text: str, row: int) -> str:
    """``text`` (an error's words for a one-row chunk) naming ``row`` where it names row 0."""
    return _ROW_ZERO.sub(f"row {row}", text)


def at_row(error: SchemaMismatch, row: int) -> SchemaMismatch:
    """``error``, raised for a one-row chunk, with its words naming ``row`` (the row's index in
    its message) where they name row 0."""
    return SchemaMismatch(
        named_row(error.message, row),
        column=error.column,
        expected=error.expected,
        found=named_row(error.found, row),
        row=row,
        code=error.code,
    )
