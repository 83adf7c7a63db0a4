"""Which dead letters a command works on: by reason, code, table, chunk id, source and time.
Each filter given must match (values within one filter: any of them)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from rowbatch.consumer.dlq.letters import DeadLetter


class SelectionError(ValueError):
    """A filter the command line cannot mean (the message names it)."""


_AGO = re.compile(r"([0-9]+)\s*([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_moment(text: str, *, now: datetime, option: str) -> datetime:
    """``--since`` / ``--until``: an ISO 8601 time (UTC when it names no offset) or an age,
    ``30m``, ``2h``, ``7d`` (that long before ``now``)."""
    text = text.strip()
    ago = _AGO.fullmatch(text)
    try:
        if ago is not None:
            return now - timedelta(**{_UNITS[ago[2]]: int(ago[1])})
        moment = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1:] in "Zz" else text)
    except (ValueError, OverflowError):
        raise SelectionError(
            f"{option} {text!r}: give an ISO 8601 time (2026-12-03T08:00:00Z) or an age "
            "(30m, 2h, 7d) within the calendar"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Selection:
    """The filters; an empty one selects everything."""

    reasons: frozenset[str] = frozenset()
    codes: frozenset[str] = frozenset()
    tables: frozenset[str] = frozenset()
    chunk_ids: frozenset[str] = frozenset()
    sources: frozenset[str] = frozenset()
    since: datetime | None = None
    until: datetime | None = None

    def matches(self, letter: DeadLetter) -> bool:
        fields = (
            (self.reasons, letter.reason),
            (self.codes, letter.code),
            (self.tables, letter.table),
            (self.chunk_ids, letter.chunk_id),
            (self.sources, letter.source),
        )
        if any(wanted and value not in wanted for wanted, value in fields):
            return False
        if self.since is None and self.until is None:
            return True
        when = letter.time
        return (
            when is not None
            and (self.since is None or when >= self.since)
            and (self.until is None or when < self.until)
        )

    def describe(self) -> str:
        """The filters in words (``every dead letter`` when none)."""
        parts = [
            f"{name} {'|'.join(sorted(values))}"
            for name, values in (
                ("reason", self.reasons),
                ("code", self.codes),
                ("table", self.tables),
                ("chunk id", self.chunk_ids),
                ("source", self.sources),
            )
            if values
        ]
        if self.since is not None:
            parts.append(f"since {self.since.isoformat()}")
        if self.until is not None:
            parts.append(f"until {self.until.isoformat()}")
        return ", ".join(parts) or "every dead letter"


__all__ = ["Selection", "SelectionError", "parse_moment"]
