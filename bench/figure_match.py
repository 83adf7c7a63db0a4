"""Does a cited prose block say what its recorded run says, figure by figure?

A number in a ``bench:from`` block is matched by its *shape*, not just found somewhere in the
file:

- a range (``176-194``, ``0.42-0.54x``, ``15.1-16.3 ms``) must be one of the run's ranges, both
  ends together (a ``low-high`` the run printed, or a spread's least and greatest in its JSON);
  ``176-180`` where the run says ``176-194`` fails;
- a single number must be one of the run's single figures (a table cell, a median, one run's
  value): not the end of a range, so a median edited to the range's least value fails;
- either may be rounded to the digits the prose shows (``19,565`` as ``19.6k`` is not matched:
  write the digits).

A range may also be a table column's least and greatest value: over all the table's rows, or
over the rows that hold a text the block names. A block narrows its place in a printed run
(``.txt``) after the file name: ``#10`` for section "10. Result-table sinks side by side", and
``rows: 64 MiB | 128 MiB`` for the ranges of the rows holding "64 MiB" and of those holding
"128 MiB" (``176-194`` is then the 64 MiB rows' peaks, and ``176-180`` fails). In a JSON run a
list of records is a table (each key's least and greatest value is a range). Dates, times, file
names, words with digits (``p99``) and compound words (``500-row``) are not figures.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_NUM = r"\d[\d,]*(?:\.\d+)?"
_UNIT = r"(?:x|%|\s?%|\s?(?:ms|us|s|MiB))?"
_TOKEN = re.compile(
    rf"(?<![\w.])(?P<low>{_NUM}){_UNIT}(?:\s?-\s?|\s?\u2013\s?)(?P<high>{_NUM})(?![\w.]*\d)(?!-\w)"
    rf"|(?<![\w.])(?P<one>{_NUM})(?!-[A-Za-z])"
)
_PERCENT = re.compile(r"\s?%")
_NOT_FIGURES = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?)?(?:\s?[+-]\d{4})?"
    r"|\d{1,2}:\d{2}(?::\d{2})?|\d+\.\d+\.\d+[\w.]*"
    r"|bench/results/\S+|[A-Za-z_][\w.-]*/[\w./-]+"
    r"|[A-Za-z_]+\d[\w.]*"
    r"|\d+-(?:row|rows|core|cores|partition|byte|dimension|dim|instance|replica|minute|second)\b"
)
"""Dates (with their times and zones), times, versions (``0.14.0``), paths, words with digits
(``p99``) and compound words (``500-row``): not figures."""


@dataclass(frozen=True)
class Figures:
    """The figures of a recorded run, by shape."""

    singles: frozenset[str]
    ranges: frozenset[tuple[str, str]]


def parse_where(where: str) -> tuple[str | None, tuple[str, ...]]:
    """``#SECTION rows: A | B`` into the section and the row texts."""
    section: str | None = None
    head, _, rows = where.partition("rows:")
    head = head.strip()
    if head.startswith("#"):
        section = head[1:].strip()
    elif head:
        raise ValueError(f"expected '#SECTION' and/or 'rows: A | B' after the file, got {where!r}")
    filters = tuple(f.strip() for f in rows.split("|") if f.strip())
    return section, filters


def _plain(number: str) -> str:
    return number.replace(",", "")


@dataclass(frozen=True)
class Token:
    """A figure as written: one number, or a range's two; ``percent`` when a ``%`` follows."""

    numbers: tuple[str, ...]
    percent: bool = False

    def __str__(self) -> str:
        return "-".join(self.numbers) + ("%" if self.percent else "")


def tokens(text: str) -> Iterator[Token]:
    """The figures of ``text``."""
    plain = _NOT_FIGURES.sub(" ", text)
    for m in _TOKEN.finditer(plain):
        percent = _PERCENT.match(plain, m.end()) is not None
        if m["one"] is not None:
            yield Token((_plain(m["one"]),), percent)
        else:
            yield Token((_plain(m["low"]), _plain(m["high"])), percent)


def _section(text: str, section: str) -> str:
    """The lines of a printed run from the heading ``SECTION.`` to the next numbered heading."""
    heading = re.compile(r"^\s*(\d+)\.\s", re.MULTILINE)
    starts = [(m.start(), m[1]) for m in heading.finditer(text)]
    for i, (at, number) in enumerate(starts):
        if number == section:
            end = starts[i + 1][0] if i + 1 < len(starts) else len(text)
            return text[at:end]
    raise KeyError(f"no section {section!r} in the printed run")


def _walk(value: Any) -> Iterator[Any]:
    if isinstance(value, Mapping):
        for inner in value.values():
            yield from _walk(inner)
    elif isinstance(value, list):
        yield from _columns(value)
        for inner in value:
            yield from _walk(inner)
    else:
        yield value


def _columns(items: list[Any]) -> Iterator[Any]:
    """A list of records is a table: each key's least and greatest value, as a range."""
    if not items or not all(isinstance(i, Mapping) for i in items):
        return
    for key in items[0]:
        values = [
            i.get(key)
            for i in items
            if isinstance(i.get(key), int | float) and not isinstance(i.get(key), bool)
        ]
        if len(values) > 1:
            yield (min(values), max(values))


def _number_text(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def of_json(recorded: Mapping[str, Any]) -> Figures:
    """A JSON run's figures: every number it holds is a single (a figure's median and each
    run's value among them); a spread's least and greatest, and a list of records' least and
    greatest value of each key, are ranges; the printed tables it keeps are read as text."""
    singles: set[str] = set()
    ranges: set[tuple[str, str]] = set()
    for s in (recorded.get("spread") or {}).values():
        ranges.add((_number_text(s["low"]), _number_text(s["high"])))
    ranges |= _target_ranges(recorded.get("targets_by_run") or [])
    for value in _walk(recorded):
        if isinstance(value, tuple):
            ranges.add((_number_text(value[0]), _number_text(value[1])))
        elif isinstance(value, int | float) and not isinstance(value, bool):
            singles.add(_number_text(value))
        elif isinstance(value, str):
            _add_text(value, singles, ranges)
    return Figures(frozenset(singles), frozenset(ranges))


def _target_ranges(by_run: list[list[Mapping[str, Any]]]) -> set[tuple[str, str]]:
    """Each target's least and greatest result over the runs (the first number of what each
    run got)."""
    got: dict[str, dict[float, str]] = {}
    for run in by_run:
        for target in run:
            first = _first_number(str(target.get("got", "")))
            if first is not None:
                got.setdefault(str(target.get("name")), {})[float(first)] = first
    return {(v[min(v)], v[max(v)]) for v in got.values() if len(v) > 1}


def _add_text(text: str, singles: set[str], ranges: set[tuple[str, str]]) -> None:
    for token in tokens(text):
        if len(token.numbers) == 1:
            singles.add(token.numbers[0])
        else:
            ranges.add((token.numbers[0], token.numbers[1]))


_RULE = re.compile(r"^\s*-+(?:\s+-+)*\s*$")


def _table_rows(lines: list[str], at: int) -> tuple[list[tuple[int, int]], list[str]]:
    """The column spans of the table whose rule (``----  ---``) is line ``at``, and its rows:
    the lines after it whose gaps between columns are blank."""
    spans = [(m.start(), m.end()) for m in re.finditer(r"-+", lines[at])]
    gaps = [end for _, end in spans[:-1]]
    rows: list[str] = []
    for line in lines[at + 1 :]:
        if not line.strip() or _RULE.match(line):
            break
        if sum(1 for g in gaps if g < len(line) and line[g] != " ") > 1:
            break
        rows.append(line)
    return spans, rows


def _column_ranges(text: str, filters: tuple[str, ...]) -> set[tuple[str, str]]:
    """Each table column's least and greatest value over its rows, and over the rows that
    hold each of ``filters``; tables printed again with the same header (the runs of a
    repeated bench) count as one."""
    found: set[tuple[str, str]] = set()
    lines = text.splitlines()
    tables: dict[str, tuple[list[tuple[int, int]], list[str]]] = {}
    for at, line in enumerate(lines):
        if at > 0 and _RULE.match(line):
            spans, rows = _table_rows(lines, at)
            tables.setdefault(lines[at - 1].strip(), (spans, []))[1].extend(rows)
    for spans, rows in tables.values():
        for chosen in ("", *filters):
            picked = [r for r in rows if chosen in r]
            for start, end in spans:
                cells = [_first_number(row[start:end]) for row in picked]
                values = {float(c): c for c in cells if c is not None}
                if len([c for c in cells if c is not None]) > 1:
                    found.add((values[min(values)], values[max(values)]))
    return found


def _first_number(cell: str) -> str | None:
    m = re.match(_NUM, cell.strip())
    return _plain(m[0]) if m else None


def of_text(text: str, section: str | None = None, filters: tuple[str, ...] = ()) -> Figures:
    """A printed run's figures: each ``low-high`` is a range (its ends are not singles), and so
    is each table column's least and greatest value over its rows (and over the rows holding
    each of ``filters``)."""
    singles: set[str] = set()
    ranges: set[tuple[str, str]] = set()
    text = text if section is None else _section(text, section)
    _add_text(text, singles, ranges)
    ranges |= _column_ranges(text, filters)
    return Figures(frozenset(singles), frozenset(ranges))


def of_file(
    name: str, content: str, section: str | None = None, filters: tuple[str, ...] = ()
) -> Figures:
    if name.endswith(".json"):
        return of_json(json.loads(content))
    return of_text(content, section, filters)


def _same(written: str, value: str, percent: bool) -> bool:
    """``written`` is ``value``, as it stands or rounded to the digits ``written`` shows (a
    percentage may also be a fraction's hundredfold: ``98%`` for ``0.98``)."""
    if written == value:
        return True
    digits = len(written.partition(".")[2])
    want = float(written)
    scales = (1.0, 100.0) if percent else (1.0,)
    return any(round(float(value) * scale, digits) == want for scale in scales)


def _matches(token: Token, figures: Figures) -> bool:
    if len(token.numbers) == 1:
        return any(_same(token.numbers[0], v, token.percent) for v in figures.singles)
    low, high = token.numbers
    return any(
        _same(low, a, token.percent) and _same(high, b, token.percent) for a, b in figures.ranges
    )


def absent(body: str, figures: Figures) -> list[str]:
    """The figures of ``body`` that are not at their place in the run, as ``body`` writes
    them (a range as ``low-high``)."""
    return [str(t) for t in dict.fromkeys(tokens(body)) if not _matches(t, figures)]
