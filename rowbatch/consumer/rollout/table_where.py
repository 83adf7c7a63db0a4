"""Where a comparison table is, for messages, and how reading it fails
(:mod:`.read_table`)."""

from __future__ import annotations

from dataclasses import dataclass


class TableMissing(Exception):
    """The table is not in the store; the message names both."""


class ReadFailed(Exception):
    """The store failed the read; the message names the table, the store and its words."""


@dataclass(frozen=True)
class Where:
    """A table as its store names it (``schema.table``, ``namespace.table``, a dataset root)
    and the store, for messages (never a password)."""

    table: str
    store: str

    def __str__(self) -> str:
        return f"{self.table} in {self.store}"
