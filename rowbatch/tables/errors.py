"""The error a reader raises when the input cannot be published as it is, and how its messages
name the place (input, column, data row)."""

from __future__ import annotations

from rowbatch.wire.errors import WireError


class InputError(ValueError):
    """The input cannot be published as it is: the message says where and what to do."""


def where(source: str, column: str, first_row: int, row: int | None) -> str:
    """Where an error is: the input and the column, and the data row (1-based) when known."""
    if row is None:
        return f"{source}: column {column!r}"
    return f"{source}: column {column!r}, data row {first_row + row + 1}"


def describe_wire_error(exc: WireError, *, source: str, first_row: int) -> str:
    """A wire error raised for one chunk of the input, with the input's name and row offset."""
    return f"{source} (data rows from {first_row + 1}): {exc}"


__all__ = ["InputError", "describe_wire_error", "where"]
