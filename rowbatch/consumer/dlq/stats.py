"""``dlq stats``: the dead letters counted by reason, code, table, source and consumer version,
with their rows and the first and last time, as a table or JSON. Copies of one letter (the same
``DeadLetter.identity``: one chunk dead-lettered again after a redelivery) count once, in the
group of the first read, and are counted apart as ``duplicates``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rowbatch.consumer.dlq.letters import DeadLetter

GroupKey = tuple[str, str, str, str, str]
COLUMNS = ("reason", "code", "table", "source", "version")


@dataclass
class Group:
    """The dead letters of one key."""

    count: int = 0
    rows: int = 0
    unknown_rows: int = 0
    """Letters whose row count cannot be read (e.g. a missing header)."""
    replayed_before: int = 0
    """Letters that came back after a replay."""
    first: datetime | None = None
    last: datetime | None = None
    duplicates: int = 0
    """Copies of this group's letters read after them (not in ``count`` nor ``rows``)."""

    def add(self, letter: DeadLetter) -> None:
        self.count += 1
        rows = letter.row_count
        if rows is None:
            self.unknown_rows += 1
        else:
            self.rows += rows
        if letter.replays:
            self.replayed_before += 1
        when = letter.time
        if when is not None:
            self.first = when if self.first is None else min(self.first, when)
            self.last = when if self.last is None else max(self.last, when)


@dataclass
class Stats:
    """Counts of the letters added, by ``(reason, code, table, source, version)``."""

    groups: dict[GroupKey, Group] = field(default_factory=dict)
    read: int = 0
    """Every letter read, selected or not."""
    _first_of: dict[bytes, GroupKey] = field(default_factory=dict, repr=False, compare=False)
    """The group of the first letter of each ``copy_key`` added."""

    def add(self, letter: DeadLetter) -> None:
        copy_key = letter.copy_key
        if copy_key is not None:
            first = self._first_of.get(copy_key)
            if first is not None:
                self.groups[first].duplicates += 1
                return
        key = (letter.reason, letter.code, letter.table, letter.source, letter.consumer_version)
        self.groups.setdefault(key, Group()).add(letter)
        if copy_key is not None:
            self._first_of[copy_key] = key

    @property
    def total(self) -> int:
        return sum(g.count for g in self.groups.values())

    @property
    def duplicates(self) -> int:
        """Letters added that were copies of one added before (counted once, not in total)."""
        return sum(g.duplicates for g in self.groups.values())

    def by_reason(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, group in self.groups.items():
            out[key[0]] = out.get(key[0], 0) + group.count
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "selected": self.total,
            "duplicates": self.duplicates,
            "by_reason": self.by_reason(),
            "groups": [
                {
                    **dict(zip(COLUMNS, key, strict=True)),
                    "count": g.count,
                    "duplicates": g.duplicates,
                    "rows": g.rows,
                    "letters_without_row_count": g.unknown_rows,
                    "replayed_before": g.replayed_before,
                    "first": _iso(g.first),
                    "last": _iso(g.last),
                }
                for key, g in sorted(self.groups.items())
            ],
        }

    def lines(self) -> list[str]:
        """The table; a ``duplicates`` column only when some letters were copies."""
        copies = self.duplicates
        head = (*COLUMNS, "count", *(("duplicates",) if copies else ()), "rows", "first", "last")
        body = [
            (
                *key,
                str(g.count),
                *((str(g.duplicates),) if copies else ()),
                _rows(g),
                _iso(g.first) or "-",
                _iso(g.last) or "-",
            )
            for key, g in sorted(self.groups.items())
        ]
        footer = f"{self.total} selected of {self.read} read"
        if copies:
            footer += f" ({copies} {'duplicate' if copies == 1 else 'duplicates'} collapsed)"
        return [*table_lines(head, body), footer]


def _rows(group: Group) -> str:
    """The rows column: the sum, and how many letters it leaves out when some carry no row
    count (a message without a readable ``rowbatch-row-count``, a table run's unreadable
    part of a file whose rows were never counted)."""
    if not group.unknown_rows:
        return str(group.rows)
    letters = "letter" if group.unknown_rows == 1 else "letters"
    return f"{group.rows} known + {group.unknown_rows} {letters} of unknown size"


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat(timespec="seconds")


def table_lines(head: tuple[str, ...], body: Iterable[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell, numbers right-aligned."""
    rows = [head, *body]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    out = []
    for row in rows:
        cells = [
            cell.rjust(w) if cell.isdigit() else cell.ljust(w)
            for cell, w in zip(row, widths, strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return out


__all__ = ["Group", "Stats", "table_lines"]
