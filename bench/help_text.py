"""Plain-text ``--help`` descriptions from the bench modules' docstrings: the first paragraph,
reflowed, with the reST markup a terminal would show literally (double backquotes, roles such
as :func:) taken out."""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")


def description(doc: str | None) -> str:
    """The first paragraph of ``doc`` as plain text on one line (argparse rewraps it)."""
    first = (doc or "").strip().split("\n\n")[0]
    text = " ".join(first.split())
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


__all__ = ["description"]
