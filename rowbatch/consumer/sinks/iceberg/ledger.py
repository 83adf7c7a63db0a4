"""The key ledger: which rows (``chunk_id`` and a range of ``row_index``) each commit put into
an Iceberg table, kept in the SQL catalog's own database and written in the same database
transaction that moves the table's metadata pointer
(:mod:`rowbatch.consumer.sinks.iceberg.catalog`).

So a row is in the table exactly when the ledger says so: a commit that finds any of its rows
claimed by another commit rolls back whole (pointer and ledger), and its writer drops those rows
and commits the rest. One ledger row per run of consecutive rows of one chunk in a commit
(usually one per message), never one per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import sqlalchemy as sa
from numpy.typing import NDArray

#: Ranges are half-open: ``(start, end)`` holds ``row_index`` start .. end - 1.
Ranges = list[tuple[int, int]]
Claims = dict[str, Ranges]

_IN_SLICE: Final = 1000
"""Chunk ids per ``IN (...)`` query: well under every database's parameter limit."""

metadata = sa.MetaData()

ledger_rows = sa.Table(
    "rowbatch_iceberg_ledger",
    metadata,
    sa.Column("table_ident", sa.String(767), primary_key=True),
    sa.Column("chunk_id", sa.String(1024), primary_key=True),
    sa.Column("row_start", sa.BigInteger, primary_key=True),
    sa.Column("row_end", sa.BigInteger, nullable=False),
    sa.Column("commit_id", sa.String(64), nullable=False),
)

commits = sa.Table(
    "rowbatch_iceberg_commits",
    metadata,
    sa.Column("table_ident", sa.String(767), primary_key=True),
    sa.Column("commit_id", sa.String(64), primary_key=True),
    sa.Column("metadata_location", sa.String(1000), nullable=False),
    sa.Column("rows", sa.BigInteger, nullable=False),
    sa.Column("files", sa.Integer, nullable=False),
    sa.Column("committed_at", sa.DateTime(timezone=True), server_default=sa.func.now()),
)


@dataclass(frozen=True)
class CommitIntent:
    """What one commit claims (``claims``: chunk -> row ranges) and releases (``releases``:
    chunks whose rows it deletes), under a fresh ``commit_id``."""

    table_ident: str
    commit_id: str
    claims: Mapping[str, Ranges] = field(default_factory=dict)
    releases: Sequence[str] = ()
    rows: int = 0
    files: int = 0


class AlreadyClaimed(Exception):
    """Some rows of a commit are in the table already (another commit, maybe another
    replica's, holds them): the commit was rolled back; ``taken`` names the rows."""

    def __init__(self, taken: Claims) -> None:
        rows = sum(end - start for ranges in taken.values() for start, end in ranges)
        super().__init__(f"{rows} rows of {len(taken)} chunk(s) are committed already")
        self.taken = taken


def runs(chunk_id: NDArray[np.object_], row_index: NDArray[np.int64]) -> Claims:
    """The rows as ranges per chunk: one range per run of consecutive rows of one chunk."""
    n = int(chunk_id.shape[0])
    out: Claims = {}
    if n == 0:
        return out
    rows = row_index.astype(np.int64, copy=False)
    breaks = np.ones(n, dtype=bool)
    if n > 1:
        breaks[1:] = (chunk_id[1:] != chunk_id[:-1]) | (rows[1:] != rows[:-1] + 1)
    starts = np.flatnonzero(breaks)
    ends = np.append(starts[1:], n)
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        out.setdefault(str(chunk_id[s]), []).append((int(rows[s]), int(rows[e - 1]) + 1))
    return {chunk: merged(ranges) for chunk, ranges in out.items()}


def merged(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, with touching or overlapping ranges joined."""
    out: Ranges = []
    for start, end in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def merge_claims(parts: Iterable[Mapping[str, Ranges]]) -> Claims:
    joined: dict[str, list[tuple[int, int]]] = {}
    for part in parts:
        for chunk, ranges in part.items():
            joined.setdefault(chunk, []).extend(ranges)
    return {chunk: merged(ranges) for chunk, ranges in joined.items()}


def overlap(mine: Ranges, theirs: Ranges) -> Ranges:
    """The rows in both (each sorted and merged)."""
    out: Ranges = []
    i = j = 0
    while i < len(mine) and j < len(theirs):
        start, end = max(mine[i][0], theirs[j][0]), min(mine[i][1], theirs[j][1])
        if start < end:
            out.append((start, end))
        if mine[i][1] < theirs[j][1]:
            i += 1
        else:
            j += 1
    return out


def contains(ranges: Ranges, values: NDArray[np.int64]) -> NDArray[np.bool_]:
    """Which of ``values`` fall in ``ranges``."""
    hit = np.zeros(values.shape[0], dtype=bool)
    for start, end in ranges:
        hit |= (values >= start) & (values < end)
    return hit


def _slices(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), _IN_SLICE):
        yield items[i : i + _IN_SLICE]


def claimed(conn: sa.Connection, table_ident: str, wanted: Mapping[str, Ranges]) -> Claims:
    """The rows of ``wanted`` that the ledger holds for the table (by any commit)."""
    taken: Claims = {}
    chunks = sorted(wanted)
    for part in _slices(chunks):
        query = sa.select(
            ledger_rows.c.chunk_id, ledger_rows.c.row_start, ledger_rows.c.row_end
        ).where(ledger_rows.c.table_ident == table_ident, ledger_rows.c.chunk_id.in_(part))
        held: dict[str, list[tuple[int, int]]] = {}
        for chunk, start, end in conn.execute(query):
            held.setdefault(str(chunk), []).append((int(start), int(end)))
        for chunk, ranges in held.items():
            both = overlap(wanted[chunk], merged(ranges))
            if both:
                taken[chunk] = both
    return taken


def chunks_committed(conn: sa.Connection, table_ident: str, chunk_ids: Sequence[str]) -> list[str]:
    """Those of ``chunk_ids`` with any row in the table."""
    found: set[str] = set()
    for part in _slices(sorted(set(chunk_ids))):
        query = (
            sa.select(ledger_rows.c.chunk_id)
            .where(ledger_rows.c.table_ident == table_ident, ledger_rows.c.chunk_id.in_(part))
            .distinct()
        )
        found.update(str(row[0]) for row in conn.execute(query))
    return sorted(found)


def landed(conn: sa.Connection, table_ident: str, commit_id: str) -> bool:
    """Whether the commit ``commit_id`` is in the table (its outcome was not known)."""
    query = sa.select(commits.c.commit_id).where(
        commits.c.table_ident == table_ident, commits.c.commit_id == commit_id
    )
    return conn.execute(query).first() is not None


def record(conn: sa.Connection, intent: CommitIntent, metadata_location: str) -> None:
    """Writes the intent's claims and releases (inside the commit's transaction)."""
    for part in _slices(list(intent.releases)):
        conn.execute(
            ledger_rows.delete().where(
                ledger_rows.c.table_ident == intent.table_ident, ledger_rows.c.chunk_id.in_(part)
            )
        )
    values = [
        {
            "table_ident": intent.table_ident,
            "chunk_id": chunk,
            "row_start": start,
            "row_end": end,
            "commit_id": intent.commit_id,
        }
        for chunk, ranges in intent.claims.items()
        for start, end in ranges
    ]
    if values:
        conn.execute(ledger_rows.insert(), values)
    conn.execute(
        commits.insert().values(
            table_ident=intent.table_ident,
            commit_id=intent.commit_id,
            metadata_location=metadata_location,
            rows=intent.rows,
            files=intent.files,
        )
    )
