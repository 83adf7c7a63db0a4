"""The Parquet sink's key index: a local SQLite file recording which data file holds each
written ``(chunk_id, row_index)``, which files are pending (written but not yet known to have
been renamed into place), the deletions in progress, and the dataset's schema. A lock file
next to it keeps a second sink off the same index."""

from __future__ import annotations

import fcntl
import json
import sqlite3
from collections.abc import Iterable, Sequence
from itertools import repeat
from pathlib import Path
from typing import IO, Final

import pyarrow as pa

from rowbatch.consumer.sinks.base import SinkError
from rowbatch.consumer.sinks.sqlite.db import BUSY_TIMEOUT_S, sqlite_transaction

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE,          -- relative to the dataset root
    state TEXT NOT NULL CHECK (state IN ('pending', 'committed'))
);
CREATE TABLE IF NOT EXISTS keys (
    chunk_id TEXT NOT NULL,
    row_index INTEGER NOT NULL,
    file INTEGER NOT NULL,
    PRIMARY KEY (chunk_id, row_index)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS keys_by_file ON keys (file);
CREATE TABLE IF NOT EXISTS deletions (chunk_id TEXT PRIMARY KEY) WITHOUT ROWID;
"""


class KeyIndex:
    """An open key index; every change is one SQLite transaction. Errors are SQLite's own
    (the sink classifies them)."""

    def __init__(self, conn: sqlite3.Connection, lock: IO[bytes]) -> None:
        self._conn = conn
        self._lock = lock

    @classmethod
    def open(cls, path: Path) -> KeyIndex:
        """Locks and opens (or creates) the index at ``path``; :class:`SinkError` if another
        sink holds it."""
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = path.with_name(path.name + ".lock").open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock.close()
            raise SinkError(
                f"another ParquetSink is writing the dataset indexed at {path} "
                "(one writer per dataset)"
            ) from exc
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(
                path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(_SCHEMA)
        except BaseException:
            if conn is not None:
                conn.close()
            lock.close()
            raise
        return cls(conn, lock)

    def close(self) -> None:
        self._conn.close()
        self._lock.close()  # releases the flock

    # --- the dataset's schema and files -------------------------------------------------------

    def recorded_schema(self) -> list[tuple[str, str]] | None:
        """The dataset's ``(column, type)`` list as recorded, or ``None`` in a fresh index."""
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            return None
        return [(str(name), str(kind)) for name, kind in json.loads(row[0])]

    def adopt(self, files: Iterable[tuple[str, pa.Table]], schema: list[tuple[str, str]]) -> None:
        """Records existing data files as committed with their keys (``chunk_id`` and
        ``row_index`` columns), and the dataset's schema: a rebuild of a lost index."""

        def adopt(conn: sqlite3.Connection) -> None:
            for rel, keys in files:
                cur = conn.execute(
                    "INSERT INTO files (path, state) VALUES (?, 'committed')", (rel,)
                )
                conn.executemany(
                    "INSERT OR IGNORE INTO keys VALUES (?, ?, ?)",
                    zip(
                        keys["chunk_id"].to_pylist(),
                        keys["row_index"].to_pylist(),
                        repeat(cur.lastrowid),
                        strict=False,
                    ),
                )
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (json.dumps(schema),))

        sqlite_transaction(self._conn, adopt)

    def pending(self) -> list[tuple[int, str]]:
        """``(file id, path)`` of the files recorded but not marked committed."""
        rows = self._conn.execute("SELECT id, path FROM files WHERE state = 'pending'")
        return [(int(file_id), str(rel)) for file_id, rel in rows.fetchall()]

    def start_file(self, rel: str) -> int:
        """Records a new file as pending; its id."""
        return sqlite_transaction(
            self._conn,
            lambda c: int(
                c.execute("INSERT INTO files (path, state) VALUES (?, 'pending')", (rel,)).lastrowid
                or 0
            ),
        )

    def claim_keys(
        self, file_id: int, chunk_ids: Sequence[str], row_index: Sequence[int]
    ) -> set[tuple[str, int]] | None:
        """Records the keys not seen before (in any file, this one included) as the pending
        file's: ``None`` when every key is new (the usual case), else the set of those that
        are (maybe empty)."""

        def claim(conn: sqlite3.Connection) -> set[tuple[str, int]] | None:
            chunks = sorted(set(chunk_ids))
            seen: set[tuple[str, int]] = set()
            for i in range(0, len(chunks), 500):
                part = chunks[i : i + 500]
                marks = ",".join("?" * len(part))
                rows = conn.execute(
                    f"SELECT chunk_id, row_index FROM keys WHERE chunk_id IN ({marks})",  # noqa: S608
                    part,
                )
                seen.update((str(c), int(r)) for c, r in rows)
            keys = list(zip(chunk_ids, row_index, strict=True))
            new = [k for k in dict.fromkeys(keys) if k not in seen]
            conn.executemany("INSERT INTO keys VALUES (?, ?, ?)", [(c, r, file_id) for c, r in new])
            return None if len(new) == len(keys) else set(new)

        return sqlite_transaction(self._conn, claim)

    def commit(self, file_id: int) -> None:
        """Marks the file committed: it is in place under its final name."""
        sqlite_transaction(
            self._conn,
            lambda c: c.execute("UPDATE files SET state = 'committed' WHERE id = ?", (file_id,)),
        )

    def forget(self, file_id: int) -> None:
        """Drops the file and its keys (it never reached its final name)."""
        sqlite_transaction(self._conn, lambda c: _forget(c, file_id))

    # --- deletions ----------------------------------------------------------------------------

    def journal_deletions(self, chunk_ids: Sequence[str]) -> None:
        sqlite_transaction(
            self._conn,
            lambda c: c.executemany(
                "INSERT OR IGNORE INTO deletions VALUES (?)", [(c,) for c in chunk_ids]
            ),
        )

    def has_deletions(self) -> bool:
        return self._conn.execute("SELECT 1 FROM deletions LIMIT 1").fetchone() is not None

    def deletions(self) -> tuple[list[str], list[tuple[int, str]]]:
        """The journalled chunk ids, and ``(file id, path)`` of each file holding one."""
        doomed = [str(r[0]) for r in self._conn.execute("SELECT chunk_id FROM deletions")]
        files = self._conn.execute(
            "SELECT DISTINCT f.id, f.path FROM keys k JOIN files f ON f.id = k.file"
            " WHERE k.chunk_id IN (SELECT chunk_id FROM deletions)"
        ).fetchall()
        return doomed, [(int(file_id), str(rel)) for file_id, rel in files]

    def finish_deletions(self, emptied: Iterable[int]) -> None:
        """Once the files are rewritten: drops the journalled chunks' keys, the files left
        empty (``emptied``) and the journal."""

        def forget(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM keys WHERE chunk_id IN (SELECT chunk_id FROM deletions)")
            for file_id in emptied:
                _forget(conn, file_id)
            conn.execute("DELETE FROM deletions")

        sqlite_transaction(self._conn, forget)


def _forget(conn: sqlite3.Connection, file_id: int) -> None:
    conn.execute("DELETE FROM keys WHERE file = ?", (file_id,))
    conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
