"""Result rows as a Parquet dataset, hive-partitioned by day, on a local path or an object store.

Layout (``root`` is ``url_or_path``: a local path, ``file://``, ``s3://``, ``gs://``... any URI
``pyarrow.fs.FileSystem.from_uri`` knows)::

    root/processed_date=2024-05-01/part-20240501T120000123456-<uuid>.parquet   one per write
    root/_rowbatch/keys.sqlite                                                 the key index

Readers see one table: ``pyarrow.dataset.dataset(root, partitioning="hive")``, DuckDB
``read_parquet('root/**/*.parquet', hive_partitioning = true)``, Spark ``read.parquet(root)``,
``pandas.read_parquet(root)``. Names starting with ``_`` or ``.`` (the index, files being
written) are hidden from all of them. ``processed_date`` is the UTC date of ``processed_at``.

Columns: ``chunk_id`` string, ``row_index`` int64, ``source_message_id`` string, the passthrough
and output columns (ints and floats keep their width, except ``float16`` which is stored as
``float32``; text is string, bytes binary, bool bool; a vector is ``fixed_size_list<dim>`` of its
element type), ``model_name``, ``model_version`` strings, ``processed_at`` timestamp (us, UTC).

Idempotency: the key index (SQLite) maps each written ``(chunk_id, row_index)`` to its file.
A ``write`` (1) records the new file as *pending* with the keys not seen before, (2) writes
those rows to a hidden temporary name in the partition directory, (3) renames it to its final
name (the atomic commit; on object stores a copy, atomic per object), (4) marks the file
*committed*. ``open`` reconciles a crash: a pending file that exists is committed, one that does
not is dropped with its keys. ``delete_chunks`` journals the chunk ids first, rewrites each
affected file without them (temporary file + rename; a file left empty is deleted), then drops
their keys and the journal entry; ``open`` finishes a journalled deletion a crash interrupted.
If the index is missing while the dataset has files, ``open`` rebuilds it from the files.

Limitations: one writer per dataset. A lock file next to the index makes a second sink on the
same index fail at ``open``; sinks with *different* indexes over the same dataset (two hosts on
one bucket) are not detected and could duplicate rows: run one writer per dataset, or use the
PostgreSQL sink for many writers. For non-local filesystems the index is kept on local disk at
``index_path`` (required there); losing it costs a rebuild, which reads every file's keys.

Strings are stored as is, U+0000 included; the wire's bytes are ``binary``.

Faults (:func:`classify_parquet_error`): object-store errors that pass (HTTP 5xx, 429 /
``SlowDown`` / throttling, timeouts, connection errors: from pyarrow's filesystems, fsspec or
obstore), a full local disk (``ENOSPC``, ``EDQUOT``) and a busy key index raise
:class:`~consumer.sinks.base.SinkUnavailable`; the next call first settles what the failed one
left (as ``open`` does after a crash), so retrying the same write neither loses nor duplicates
rows. A value pyarrow cannot convert to its column's type raises
:class:`~consumer.sinks.base.RowsRejected` naming the column; anything else from the store
(not found, access denied) is a plain :class:`~consumer.sinks.base.SinkError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import os
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from itertools import repeat
from pathlib import Path
from typing import IO, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from numpy.typing import NDArray

from consumer.sinks.base import (
    TEXT_DTYPES,
    ColumnSpec,
    ResultRows,
    RowsRejected,
    SinkError,
    SinkUnavailable,
    TableMismatch,
    TableSpec,
    check_keys,
    column_values,
    first_line,
    in_thread,
    null_mask,
    table_columns,
    utc,
)
from consumer.sinks.sqlite import classify_sqlite_error, sqlite_transaction

PARTITION: Final = "processed_date"
_INDEX_DIR: Final = "_rowbatch"
_TIMESTAMP: Final = pa.timestamp("us", tz="UTC")
_BUSY_TIMEOUT_S: Final = 30.0

_INDEX_SCHEMA: Final = """
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


# --- fault classification ---------------------------------------------------------------------

#: errno values of faults that pass: a full disk, and the network's own.
_TRANSIENT_ERRNOS: Final = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EAGAIN,
    }
)
#: How object stores and their clients word a fault that passes (S3/GCS/Azure via pyarrow's
#: AWS/Google SDKs, fsspec's s3fs/gcsfs, obstore): 5xx, 429/throttling, timeouts, connections.
_TRANSIENT_WORDS: Final = re.compile(
    r"\b(?:HTTP|status|response code|error code|code)\D{0,12}(?:5\d\d|429)\b"
    r"|\b(?:5\d\d|429) (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Time"
    r"|Too Many Requests|Slow Down)"
    r"|SlowDown|SLOW_DOWN|Throttl|TooManyRequests|Too Many Requests|RequestTimeout"
    r"|Request ?Time-?out|timed? ?out|Timeout|ServiceUnavailable|Service Unavailable"
    r"|InternalError|Internal Server Error|Bad Gateway|BackendError|rateLimitExceeded"
    r"|NETWORK_CONNECTION|connection (?:reset|refused|aborted|closed|error)|Broken pipe"
    r"|curlCode: ?(?:6|7|28|35|52|55|56)\b|temporarily unavailable|try again"
    r"|No space left on device|Disk quota exceeded|disk (?:is )?full",
    re.IGNORECASE,
)
_STATUS_ATTRS: Final = ("status", "status_code", "http_status", "code")


def _status_of(exc: BaseException) -> int | None:
    """An HTTP status the exception carries (aiohttp/requests/google-api/botocore style)."""
    for attr in _STATUS_ATTRS:
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata")
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(status, int):
            return status
    return None


def _passes(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    status = _status_of(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return bool(_TRANSIENT_WORDS.search(f"{type(exc).__name__}: {exc}"))


def classify_parquet_error(exc: BaseException, doing: str = "") -> SinkError:
    """The sink error for a failure of the filesystem, object store or key index:
    :class:`SinkUnavailable` when it passes (looked for along the exception's causes: an
    errno, an HTTP status, the store's words), else :class:`SinkError`. The message is
    ``doing`` then the first line of the store's own words."""
    if isinstance(exc, sqlite3.Error):  # the key index
        fault = classify_sqlite_error(exc, doing)
        return SinkError(str(fault)) if isinstance(fault, RowsRejected) else fault
    message = f"{doing}: {first_line(exc)}" if doing else first_line(exc)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if _passes(link):
            return SinkUnavailable(message)
        link = link.__cause__ or link.__context__
    return SinkError(message)


def _store_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a store, filesystem or index failure to classify; anything else (a
    bug, a test's stand-in for a crash) propagates as it is."""
    if isinstance(exc, SinkError):
        return False
    if isinstance(exc, OSError | sqlite3.Error | pa.ArrowException | TimeoutError):
        return True
    module = type(exc).__module__.split(".")[0]
    return module in ("botocore", "aiobotocore", "obstore", "aiohttp", "google", "requests")


def _arrow_type(col: ColumnSpec) -> pa.DataType:
    if col.dtype in TEXT_DTYPES:
        base = pa.string()
    elif col.dtype == "bytes":
        base = pa.binary()
    elif col.dtype == "float16":
        base = pa.float32()
    else:
        base = pa.from_numpy_dtype(np.dtype(col.dtype))
    # "element" is what Parquet's compliant nested types call it, so files read back the same
    return pa.list_(pa.field("element", base), col.dim) if col.dim else base


def arrow_schema(table: TableSpec) -> pa.Schema:
    """The schema of every file of the dataset (without the ``processed_date`` partition)."""
    columns = table_columns(table)
    for col in columns:
        if col.name == PARTITION:
            raise SinkError(f"column {PARTITION!r} is the Parquet sink's partition column")
    return pa.schema(
        [
            pa.field("chunk_id", pa.string(), nullable=False),
            pa.field("row_index", pa.int64(), nullable=False),
            pa.field("source_message_id", pa.string()),
            *(pa.field(c.name, _arrow_type(c)) for c in columns),
            pa.field("model_name", pa.string()),
            pa.field("model_version", pa.string()),
            pa.field("processed_at", _TIMESTAMP),
        ]
    )


def _column(rows: ResultRows, col: ColumnSpec, kind: pa.DataType) -> pa.Array:
    values = column_values(rows, col)
    try:
        return _convert(values, rows, col, kind)
    except (TypeError, ValueError, OverflowError, pa.ArrowNotImplementedError) as exc:
        raise RowsRejected(
            f"Parquet sink: column {col.name!r}: pyarrow cannot store a value as {kind}:"
            f" {first_line(exc)}"
        ) from exc


def _convert(
    values: NDArray[Any], rows: ResultRows, col: ColumnSpec, kind: pa.DataType
) -> pa.Array:
    mask = null_mask(rows, col.name)
    if col.dtype in TEXT_DTYPES or col.dtype == "bytes":
        return pa.array(values, type=kind, mask=mask)
    stored = np.dtype("float32" if col.dtype == "float16" else col.dtype)
    if not col.dim:
        return pa.array(values.astype(stored, copy=False), type=kind, mask=mask)
    flat = np.ascontiguousarray(values, dtype=stored).reshape(-1)
    return pa.FixedSizeListArray.from_arrays(
        pa.array(flat, type=kind.value_type),
        col.dim,
        mask=None if mask is None else pa.array(mask),
    )


def to_arrow(table: TableSpec, schema: pa.Schema, rows: ResultRows) -> pa.Table:
    check_keys(rows)
    n = len(rows)
    at = np.datetime64(utc(rows.processed_at).replace(tzinfo=None), "us")
    arrays = [
        _key(rows.chunk_id, "chunk_id", pa.string()),
        _key(rows.row_index, "row_index", pa.int64()),
        _key(rows.source_message_id, "source_message_id", pa.string()),
        *(_column(rows, c, schema.field(c.name).type) for c in table_columns(table)),
        pa.repeat(pa.scalar(rows.model_name, pa.string()), n),
        pa.repeat(pa.scalar(rows.model_version, pa.string()), n),
        pa.array(np.full(n, at), type=_TIMESTAMP),
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _key(values: NDArray[Any], name: str, kind: pa.DataType) -> pa.Array:
    try:
        return pa.array(values, type=kind)
    except (TypeError, ValueError, OverflowError) as exc:
        raise RowsRejected(
            f"Parquet sink: column {name!r}: pyarrow cannot store a value as {kind}:"
            f" {first_line(exc)}"
        ) from exc


def _type_name(kind: pa.DataType) -> str:
    """The type without nested field names (readers call a list's element differently)."""
    if pa.types.is_fixed_size_list(kind):
        return f"{_type_name(kind.value_type)}[{kind.list_size}]"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return f"list<{_type_name(kind.value_type)}>"
    return str(kind)


def _describe(schema: pa.Schema) -> list[tuple[str, str]]:
    return [(f.name, _type_name(f.type)) for f in schema]


def _mismatch(where: str, stored: list[tuple[str, str]], wanted: list[tuple[str, str]]) -> None:
    """Raises TableMismatch naming the first column where the dataset and the spec differ."""
    have = dict(stored)
    for name, kind in wanted:
        if name not in have:
            raise TableMismatch(f"{where} lacks column {name!r} ({kind})", column=name)
        if have[name] != kind:
            raise TableMismatch(
                f"{where}: column {name!r} is {have[name]}, expected {kind}", column=name
            )
    known = {name for name, _ in wanted}
    extra = [name for name, _ in stored if name not in known]
    if extra:
        raise TableMismatch(f"{where} has column {extra[0]!r} the spec lacks", column=extra[0])


class ParquetSink:
    """Result rows in the Parquet dataset at ``url_or_path`` (see the module docstring)."""

    def __init__(
        self,
        url_or_path: str,
        *,
        index_path: Path | None = None,
        compression: str = "snappy",
    ) -> None:
        self._url = str(url_or_path)
        if "://" in self._url:
            self._fs, root = pafs.FileSystem.from_uri(self._url)
        else:
            self._fs, root = pafs.LocalFileSystem(), str(Path(self._url).resolve())
        self._root = root.rstrip("/") or "/"
        self._local = isinstance(self._fs, pafs.LocalFileSystem)
        if index_path is None:
            if not self._local:
                raise SinkError(
                    f"ParquetSink on {self._url}: a non-local dataset needs index_path= "
                    "(a local file for the key index)"
                )
            index_path = Path(self._root) / _INDEX_DIR / "keys.sqlite"
        self._index_path = Path(index_path)
        self._compression = compression
        self._index: sqlite3.Connection | None = None
        self._lock_file: IO[bytes] | None = None
        self._table: TableSpec | None = None
        self._schema: pa.Schema | None = None
        self._lock = asyncio.Lock()
        #: A write or delete failed part way: the next one first settles what it left.
        self._unsettled = False

    # --- Sink ----------------------------------------------------------------------------------

    async def open(self, table: TableSpec) -> None:
        schema = arrow_schema(table)
        async with self._lock:
            if self._table is not None:
                raise SinkError("ParquetSink is already open")
            await self._guarded("open", self._open, schema)
            self._table, self._schema = table, schema
            self._unsettled = False

    async def write(self, rows: ResultRows) -> None:
        table, schema = self._require()
        if len(rows) == 0:
            return
        async with self._lock:
            self._require()
            await self._guarded("write", self._write, table, schema, rows)

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        self._require()
        if not chunk_ids:
            return
        async with self._lock:
            index = self._require_index()
            await self._guarded("delete_chunks", self._delete, index, list(chunk_ids))

    async def close(self) -> None:
        async with self._lock:
            self._table = self._schema = None
            await in_thread(self._release)

    async def _guarded(self, what: str, func: Callable[..., None], *args: Any) -> None:
        """``func(*args)`` in a worker thread, settling first what a failed call left; a store,
        disk or index failure is raised classified (:func:`classify_parquet_error`)."""

        def run() -> None:
            if self._unsettled and self._index is not None:
                self._reconcile(self._index)
                self._unsettled = False
            func(*args)

        try:
            await in_thread(run)
        except BaseException as exc:
            if what != "open":
                self._unsettled = True
            if _store_fault(exc):
                raise classify_parquet_error(exc, f"Parquet sink {what} on {self._url}") from exc
            raise

    # --- paths ---------------------------------------------------------------------------------

    def _abs(self, rel: str) -> str:
        return f"{self._root}/{rel}"

    @staticmethod
    def _hidden(rel: str, suffix: str) -> str:
        folder, _, name = rel.rpartition("/")
        return f"{folder}/.{name}.{suffix}"

    def _exists(self, rel: str) -> bool:
        return bool(self._fs.get_file_info(self._abs(rel)).type == pafs.FileType.File)

    def _remove(self, rel: str) -> None:
        if self._exists(rel):
            self._fs.delete_file(self._abs(rel))

    def _data_files(self) -> Iterator[str]:
        """Relative paths of the dataset's visible ``.parquet`` files."""
        selector = pafs.FileSelector(self._root, allow_not_found=True, recursive=True)
        for info in self._fs.get_file_info(selector):
            rel = info.path[len(self._root) :].lstrip("/")
            hidden = any(part.startswith(("_", ".")) for part in rel.split("/"))
            if info.type == pafs.FileType.File and rel.endswith(".parquet") and not hidden:
                yield rel

    def _publish(self, table: pa.Table, rel: str, suffix: str) -> None:
        """Writes ``table`` to a hidden temporary name, then renames it to ``rel`` (atomic)."""
        tmp = self._hidden(rel, suffix)
        folder = self._abs(rel).rpartition("/")[0]
        self._fs.create_dir(folder, recursive=True)
        strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
        with self._fs.open_output_stream(self._abs(tmp)) as out:
            pq.write_table(table, out, compression=self._compression, use_dictionary=strings)
        if self._local:
            _fsync(self._abs(tmp))
        self._fs.move(self._abs(tmp), self._abs(rel))
        if self._local:
            _fsync(folder)

    def _read(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        with self._fs.open_input_file(self._abs(rel)) as src:
            return pq.read_table(src, columns=columns)

    # --- open / close --------------------------------------------------------------------------

    def _open(self, schema: pa.Schema) -> None:
        self._index_path.parent.mkdir(parents=True, exist_ok=True)
        lock = self._index_path.with_name(self._index_path.name + ".lock").open("ab")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            lock.close()
            raise SinkError(
                f"another ParquetSink is writing the dataset indexed at {self._index_path} "
                "(one writer per dataset)"
            ) from exc
        self._lock_file = lock
        try:
            index = sqlite3.connect(
                self._index_path,
                timeout=_BUSY_TIMEOUT_S,
                isolation_level=None,
                check_same_thread=False,
            )
            self._index = index
            index.execute("PRAGMA journal_mode=WAL")
            index.execute("PRAGMA synchronous=FULL")
            index.executescript(_INDEX_SCHEMA)
            self._check_or_adopt(index, schema)
            self._reconcile(index)
        except BaseException:
            self._release()
            raise

    def _check_or_adopt(self, index: sqlite3.Connection, schema: pa.Schema) -> None:
        """Checks the spec against the dataset's recorded schema; a fresh index records it,
        first rebuilding the keys from any files already in the dataset."""
        wanted = _describe(schema)
        row = index.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is not None:
            stored = [(str(name), str(kind)) for name, kind in json.loads(row[0])]
            _mismatch(f"Parquet dataset {self._url}", stored, wanted)
            return
        files = sorted(self._data_files())
        if files:
            with self._fs.open_input_file(self._abs(files[0])) as src:
                found = pq.read_schema(src)
            _mismatch(f"Parquet dataset {self._url} ({files[0]})", _describe(found), wanted)

        def adopt(conn: sqlite3.Connection) -> None:
            for rel in files:
                keys = self._read(rel, ["chunk_id", "row_index"])
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
            conn.execute("INSERT INTO meta VALUES ('schema', ?)", (json.dumps(wanted),))

        sqlite_transaction(index, adopt)

    def _reconcile(self, index: sqlite3.Connection) -> None:
        """Settles what a crash left: pending files and journalled deletions."""
        pending = index.execute("SELECT id, path FROM files WHERE state = 'pending'").fetchall()
        for file_id, rel in pending:
            if self._exists(rel):  # renamed before the crash: its keys are right
                sqlite_transaction(index, partial(_commit, file_id=int(file_id)))
            else:
                self._remove(self._hidden(rel, "tmp"))
                sqlite_transaction(index, partial(_forget, file_id=int(file_id)))
        if index.execute("SELECT 1 FROM deletions LIMIT 1").fetchone() is not None:
            self._apply_deletions(index)

    def _release(self) -> None:
        index, self._index = self._index, None
        if index is not None:
            index.close()
        lock, self._lock_file = self._lock_file, None
        if lock is not None:
            lock.close()  # releases the flock

    def _require(self) -> tuple[TableSpec, pa.Schema]:
        if self._table is None or self._schema is None:
            raise SinkError("ParquetSink is not open")
        return self._table, self._schema

    def _require_index(self) -> sqlite3.Connection:
        if self._index is None:
            raise SinkError("ParquetSink is not open")
        return self._index

    # --- write ---------------------------------------------------------------------------------

    def _write(self, spec: TableSpec, schema: pa.Schema, rows: ResultRows) -> None:
        index = self._require_index()
        table = to_arrow(spec, schema, rows)
        at = utc(rows.processed_at)
        rel = (
            f"{PARTITION}={at.date().isoformat()}/"
            f"part-{datetime.now(UTC):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex}.parquet"
        )
        chunk_ids = [str(c) for c in rows.chunk_id.tolist()]
        row_index = rows.row_index.tolist()

        def claim(conn: sqlite3.Connection) -> tuple[int, set[tuple[str, int]] | None]:
            """Records the file as pending with the keys not seen before: ``None`` when every
            row is new (the usual case), else the set of new keys (empty: nothing to write)."""
            cur = conn.execute("INSERT INTO files (path, state) VALUES (?, 'pending')", (rel,))
            file_id = int(cur.lastrowid or 0)
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO keys VALUES (?, ?, ?)",
                zip(chunk_ids, row_index, repeat(file_id), strict=False),
            )
            if conn.total_changes - before == len(chunk_ids):
                return file_id, None
            mine = conn.execute("SELECT chunk_id, row_index FROM keys WHERE file = ?", (file_id,))
            claimed = {(str(c), int(r)) for c, r in mine}
            if not claimed:
                conn.execute("DELETE FROM files WHERE id = ?", (file_id,))
            return file_id, claimed

        file_id, claimed = sqlite_transaction(index, claim)
        if claimed is not None:
            if not claimed:
                return  # every row is there already
            keep = np.zeros(len(chunk_ids), dtype=bool)
            for i, key in enumerate(zip(chunk_ids, row_index, strict=True)):
                if key in claimed:  # the first of repeated keys in the batch wins
                    keep[i] = True
                    claimed.discard(key)
            table = table.filter(pa.array(keep))
        try:
            self._publish(table, rel, "tmp")
        except BaseException:
            with contextlib.suppress(Exception):
                self._remove(self._hidden(rel, "tmp"))
                if not self._exists(rel):
                    sqlite_transaction(index, lambda c: _forget(c, file_id))
            raise
        sqlite_transaction(index, lambda c: _commit(c, file_id))

    # --- delete --------------------------------------------------------------------------------

    def _delete(self, index: sqlite3.Connection, chunk_ids: list[str]) -> None:
        sqlite_transaction(
            index,
            lambda c: c.executemany(
                "INSERT OR IGNORE INTO deletions VALUES (?)", [(c,) for c in chunk_ids]
            ),
        )
        self._apply_deletions(index)

    def _apply_deletions(self, index: sqlite3.Connection) -> None:
        """Rewrites every file holding a journalled chunk without it, then forgets the keys.
        Safe to repeat: a file already rewritten has nothing left to remove."""
        doomed = [str(r[0]) for r in index.execute("SELECT chunk_id FROM deletions")]
        files = index.execute(
            "SELECT DISTINCT f.id, f.path FROM keys k JOIN files f ON f.id = k.file"
            " WHERE k.chunk_id IN (SELECT chunk_id FROM deletions)"
        ).fetchall()
        gone = pa.array(doomed, type=pa.string())
        emptied: list[int] = []
        for file_id, rel in files:
            self._remove(self._hidden(rel, "rewrite"))
            if not self._exists(rel):
                emptied.append(file_id)
                continue
            table = self._read(rel)
            keep = pc.invert(pc.is_in(table["chunk_id"], value_set=gone))
            if pc.all(keep).as_py():
                continue
            kept = table.filter(keep)
            if kept.num_rows == 0:
                self._fs.delete_file(self._abs(rel))
                emptied.append(file_id)
            else:
                self._publish(kept, rel, "rewrite")

        def forget(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM keys WHERE chunk_id IN (SELECT chunk_id FROM deletions)")
            for file_id in emptied:
                _forget(conn, file_id)
            conn.execute("DELETE FROM deletions")

        sqlite_transaction(index, forget)


def _commit(conn: sqlite3.Connection, file_id: int) -> None:
    conn.execute("UPDATE files SET state = 'committed' WHERE id = ?", (file_id,))


def _forget(conn: sqlite3.Connection, file_id: int) -> None:
    conn.execute("DELETE FROM keys WHERE file = ?", (file_id,))
    conn.execute("DELETE FROM files WHERE id = ?", (file_id,))


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["PARTITION", "ParquetSink", "arrow_schema", "to_arrow"]
