"""The error for a message whose columns cannot feed the model (its own module so that the
binding and the tensor builders can both raise it)."""

from __future__ import annotations

from typing import ClassVar


class SchemaMismatch(ValueError):
    """A message's columns cannot feed the model as bound: a poison message (dead-letter it
    with reason class ``schema-mismatch``). Names the column, what was expected and found."""

    reason: ClassVar[str] = "schema_mismatch"

    def __init__(
        self,
        message: str,
        *,
        column: str,
        expected: str,
        found: str,
        row: int | None = None,
        code: str = "column_type_mismatch",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        """The fine reason code (docs/wire-format.md section 6): ``missing_column``,
        ``column_type_mismatch``, ``null_not_allowed`` or ``invalid_value``."""
        self.column = column
        self.expected = expected
        self.found = found
        self.row = row
