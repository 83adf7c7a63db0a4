"""Typed errors of the row-chunk wire contract.

Every error a chunk can cause, on encode or on decode, is a :class:`WireError`. Each class has a
stable ``reason`` string (snake_case) that the consumer writes into the dead-letter record, and
each message names the header or column and what was expected versus what was found.

A :class:`WireError` raised by :func:`~rowbatch.wire.chunks.decode.decode_chunk` means the
message itself is bad (poison): retrying it cannot help. Nothing in the wire module raises a bare
``Exception``, ``KeyError`` or pyarrow error for a bad message.
"""

from __future__ import annotations

from typing import ClassVar


class WireError(ValueError):
    """Base class: a chunk that does not follow the wire contract (or cannot be encoded)."""

    reason: ClassVar[str] = "wire_error"

    def __init__(
        self,
        message: str,
        *,
        header: str | None = None,
        column: str | None = None,
        expected: str | None = None,
        found: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.header = header
        self.column = column
        self.expected = expected
        self.found = found


# --- headers / attributes -------------------------------------------------------------------


class HeaderError(WireError):
    """A Pub/Sub attribute or Kafka header is missing or has a value the contract forbids."""

    reason = "bad_header"


class MissingHeader(HeaderError):
    reason = "missing_header"


class InvalidHeader(HeaderError):
    reason = "invalid_header"


class UnsupportedFormatVersion(HeaderError):
    reason = "unsupported_format_version"


class UnsupportedContentType(HeaderError):
    reason = "unsupported_content_type"


# --- payload ------------------------------------------------------------------------------


class PayloadError(WireError):
    """The payload bytes do not hold a valid chunk."""

    reason = "bad_payload"


class InvalidJson(PayloadError):
    """Not JSON, not UTF-8, or JSON whose shape is not the documented chunk shape."""

    reason = "invalid_json"


class CorruptArrow(PayloadError):
    """Not an Arrow IPC stream, a truncated one, or one whose buffers fail validation."""

    reason = "corrupt_arrow"


class RowCountMismatch(PayloadError):
    """The ``rowbatch-row-count`` header disagrees with the rows in the payload."""

    reason = "row_count_mismatch"


class ColumnLengthMismatch(PayloadError):
    """Columns of one chunk have different lengths."""

    reason = "column_length_mismatch"


class DuplicateColumn(PayloadError):
    reason = "duplicate_column"


class InvalidColumnName(PayloadError):
    reason = "invalid_column_name"


class NoColumns(PayloadError):
    """A chunk must have at least one column (the row count would be unknowable otherwise)."""

    reason = "no_columns"


class ColumnTypeMismatch(PayloadError):
    """A column's type, or a value in it, is not what its declared type or the schema says."""

    reason = "column_type_mismatch"


class UnsupportedColumnType(PayloadError):
    """A column type the contract does not define (on encode: data we cannot map to one)."""

    reason = "unsupported_column_type"


class InvalidValue(PayloadError):
    """A value of the right JSON/Arrow type that the column type cannot hold (range, base64,
    unencodable text, a null element inside a vector)."""

    reason = "invalid_value"


class MissingColumn(PayloadError):
    """The expected schema names a column that the chunk lacks."""

    reason = "missing_column"


class NullNotAllowed(PayloadError):
    """A null in a column that the expected schema declares non-nullable."""

    reason = "null_not_allowed"


# --- producing --------------------------------------------------------------------------------


class RowTooLarge(WireError):
    """:func:`rowbatch.wire.chunks.split.split_rows`: one row alone encodes over the byte limit."""

    reason = "row_too_large"

    def __init__(self, message: str, *, row_index: int | None, size: int, max_bytes: int) -> None:
        super().__init__(message, expected=f"<= {max_bytes} bytes", found=f"{size} bytes")
        self.row_index = row_index
        self.size = size
        self.max_bytes = max_bytes


__all__ = [
    "ColumnLengthMismatch",
    "ColumnTypeMismatch",
    "CorruptArrow",
    "DuplicateColumn",
    "HeaderError",
    "InvalidColumnName",
    "InvalidHeader",
    "InvalidJson",
    "InvalidValue",
    "MissingColumn",
    "MissingHeader",
    "NoColumns",
    "NullNotAllowed",
    "PayloadError",
    "RowCountMismatch",
    "RowTooLarge",
    "UnsupportedColumnType",
    "UnsupportedContentType",
    "UnsupportedFormatVersion",
    "WireError",
]
