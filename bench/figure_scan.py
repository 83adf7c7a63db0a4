"""Measured figures outside the cited blocks: each must be cited, or say it is unrecorded.

A measured figure is recognised by its unit and shape: a rate (``rows/s``, ``msg/s``), a
ratio (``1.98x``), a CPU or wall time per message in ``us``; and a time, memory, share or
duration (``ms``, ``MiB``, ``%``, ``s``, minutes) written as a measurement is written, with
decimals, as a range or with ``~`` (``0.12 s``, ``55-66 MiB``, ``~21 MiB``, ``93-97 %``), or
a latency percentile (``p99 45 ms``). A setting, a port or a limit is a whole number
(``15 s``, ``256 MiB``, ``100 %``) and is not taken for one.

A Markdown unit (a paragraph, a list item, a table row, a fence of plain output) holding one
must sit in a cited block (``bench/cite.py``), or carry one of:

- the word **unrecorded** (shown to the reader: "a hand run, unrecorded"); a paragraph that
  introduces a table or a plain fence marks the rows and output under it;
- ``<!-- not measured: WHY -->``, for a figure of that shape that is not a measurement (an
  example's input, a limit written with decimals, a formula's worked numbers).

Code (spans, and fences with a language) is not prose and is not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_NUM = r"\d[\d,]*(?:\.\d+)?"
_FIGURE = re.compile(
    rf"(?<![\w.`/-])(?P<figure>~?{_NUM}(?:\s?[x%]?\s?(?:-|\u2013|to)\s?~?{_NUM})?)\s?"
    r"(?P<unit>rows/s|msg/s|messages/s|rows a second|messages a second|rows per second"
    r"|x\b|us\b|µs|ms\b|MiB\b|GiB\b|%|s\b|minutes?\b|seconds?\b)"
)
_ALWAYS = frozenset(
    {
        "rows/s",
        "msg/s",
        "messages/s",
        "rows a second",
        "messages a second",
        "rows per second",
        "x",
        "us",
        "µs",
    }
)
_PERCENTILE = re.compile(r"\bp(?:50|90|95|99|999)\b[^\d.;:|]{0,16}$")
_MARKED = re.compile(r"unrecorded|<!-- not measured: [^>]*\S[^>]*-->", re.IGNORECASE)
_BLOCK = re.compile(r"<!-- bench:[a-z]+ .*?<!-- /bench -->", re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d+\.)\s")


@dataclass(frozen=True)
class Unmarked:
    """A measured figure that no block cites and no marker explains."""

    doc: str
    line: int
    figure: str
    text: str

    def __str__(self) -> str:
        return (
            f"{self.doc}:{self.line}: {self.figure!r} is a measured figure outside a cited "
            f"block with no 'unrecorded' marker: {self.text.strip()[:100]}"
        )


def _blank(match: re.Match[str]) -> str:
    return "\n" * match[0].count("\n")


@dataclass
class _Unit:
    start: int
    lines: list[str]
    kind: str
    """"para", "item", "row" or "fence"."""


def _units(text: str) -> Iterator[_Unit]:
    """The Markdown units of ``text`` with cited blocks blanked out and tagged fences left
    out."""
    lines = _BLOCK.sub(_blank, text).split("\n")
    unit: _Unit | None = None
    fence: str | None = None
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith("```"):
                fence = None
            elif fence == "" and unit is not None:
                unit.lines.append(line)
            continue
        if stripped.startswith("```"):
            if unit is not None:
                yield unit
            fence = stripped[3:].strip()
            unit = _Unit(number, [], "fence") if fence in ("", "text") else None
            fence = "" if fence in ("", "text") else fence
            continue
        if not stripped:
            if unit is not None:
                yield unit
            unit = None
            continue
        kind = "row" if stripped.startswith("|") else "item" if _ITEM.match(line) else "para"
        if unit is None or kind != "para" or unit.kind in ("row", "fence"):
            if unit is not None:
                yield unit
            unit = _Unit(number, [line], kind)
        else:
            unit.lines.append(line)
    if unit is not None:
        yield unit


def _measured(figure: str, unit: str, before: str) -> bool:
    if unit in _ALWAYS:
        return True
    if re.search(r"[.~\-\u2013]|\bto\b", figure):
        return True
    return unit == "ms" and _PERCENTILE.search(before) is not None


def figures(line: str) -> Iterator[str]:
    """The measured figures of one line of prose."""
    plain = _CODE.sub(" ", _COMMENT.sub(" ", line))
    for m in _FIGURE.finditer(plain):
        if _measured(m["figure"], m["unit"], plain[: m.start()]):
            yield m[0]


def unmarked(text: str, doc: str) -> list[Unmarked]:
    """The measured figures of ``text`` (a Markdown file) that need a block or a marker."""
    found: list[Unmarked] = []
    caption_marked = False
    for unit in _units(text):
        body = "\n".join(unit.lines)
        marked = _MARKED.search(body) is not None
        if unit.kind in ("row", "fence"):
            marked = marked or caption_marked
        else:
            caption_marked = marked
        if marked:
            continue
        for offset, line in enumerate(unit.lines):
            for figure in figures(line):
                start = unit.start + offset + (1 if unit.kind == "fence" else 0)
                found.append(Unmarked(doc, start, figure, line))
    return found
