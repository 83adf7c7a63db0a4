"""A prompt template over a row's columns: ``"Summarise: {body}"``, braces naming columns,
``{{`` and ``}}`` for literal braces. Plain names only (no attribute, index, conversion or
format spec: a template from configuration must not reach into Python objects). Rendered for a
whole batch at once, column by column."""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray


class TemplateError(ValueError):
    """The template does not parse, or names a field it may not."""


class PromptTemplate:
    """``text`` parsed into literal parts and the column names between them."""

    def __init__(self, text: str) -> None:
        self.text = text
        literals: list[str] = []
        fields: list[str] = []
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as exc:
            raise TemplateError(f"prompt template {text!r} does not parse: {exc}") from None
        pending = ""
        for literal, field, spec, conversion in parsed:
            pending += literal
            if field is None:
                continue
            if not field.isidentifier() or spec or conversion:
                raise TemplateError(
                    f"prompt template field {{{field}{'!' + conversion if conversion else ''}"
                    f"{':' + spec if spec else ''}}} is not a plain column name "
                    "(write {column}; {{ and }} for literal braces)"
                )
            literals.append(pending)
            fields.append(field)
            pending = ""
        literals.append(pending)
        self._literals = tuple(literals)
        self.fields = tuple(fields)
        """The columns named, in order (a column named twice appears twice)."""

    @property
    def columns(self) -> tuple[str, ...]:
        """The distinct columns the template names, in first-use order."""
        return tuple(dict.fromkeys(self.fields))

    def render(
        self,
        columns: Mapping[str, NDArray[Any]],
        nulls: Mapping[str, NDArray[np.bool_]],
        rows: int,
    ) -> tuple[list[str], dict[int, str]]:
        """One text per row, and the rows whose named column is null (row -> column: the
        caller fails them alone; their text is rendered with the value left empty)."""
        null_rows: dict[int, str] = {}
        for name in self.columns:
            mask = nulls.get(name)
            if mask is not None and mask.any():
                for row in np.flatnonzero(mask).tolist():
                    null_rows.setdefault(int(row), name)
        if not self.fields:
            return [self._literals[0]] * rows, null_rows
        texts = {name: _texts(columns[name], nulls.get(name)) for name in self.columns}
        parts: list[list[str]] = []
        for literal, name in zip(self._literals, self.fields, strict=False):
            parts.append([literal] * rows)
            parts.append(texts[name])
        parts.append([self._literals[-1]] * rows)
        return ["".join(row) for row in zip(*parts, strict=True)], null_rows


def _texts(values: NDArray[Any], null: NDArray[np.bool_] | None) -> list[str]:
    """Each value as text: strings as they are, bytes decoded as UTF-8 (replacing what does not
    decode), numbers and booleans as Python writes them, nulls empty."""
    items = values.tolist()
    if null is None and all(type(v) is str for v in items):
        return items  # type: ignore[no-any-return]
    out = []
    for i, v in enumerate(items):
        if null is not None and null[i]:
            out.append("")
        elif isinstance(v, bytes | bytearray):
            out.append(bytes(v).decode("utf-8", "replace"))
        else:
            out.append(str(v))
    return out
