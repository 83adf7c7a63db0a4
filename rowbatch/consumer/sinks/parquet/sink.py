"""The Parquet sink: writes, deletions and crash recovery, keeping the dataset's files and the
key index in step (see the package docstring for the protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import pyarrow as pa

from rowbatch.consumer.sinks.base import ResultRows, SinkError, TableSpec, in_thread
from rowbatch.consumer.sinks.parquet.faults import classify_parquet_error, store_fault
from rowbatch.consumer.sinks.parquet.files import DatasetFiles, locate, part_path, partition
from rowbatch.consumer.sinks.parquet.index import KeyIndex
from rowbatch.consumer.sinks.parquet.lease import WriterLease
from rowbatch.consumer.sinks.parquet.rows import (
    arrow_schema,
    check_schema,
    describe_schema,
    to_arrow,
)
from rowbatch.consumer.sinks.rolling import (
    ROW_GROUP_BYTES,
    FileBroken,
    RollingFile,
    held_bytes,
    row_group_bytes_for,
)

_T = TypeVar("_T")

_INDEX_DIR: Final = "_rowbatch"


@dataclass
class _Staged:
    """A data file of the dataset being written, or written and waiting to be published."""

    rel: str
    file_id: int
    file: RollingFile
    size: int = 0


class ParquetSink:
    """Result rows in the Parquet dataset at ``url_or_path`` (see the package docstring)."""

    def __init__(
        self,
        url_or_path: str,
        *,
        index_path: Path | None = None,
        compression: str = "snappy",
        target_file_bytes: int = 128 * 1024 * 1024,
        lease_clock: Callable[[], float] = time.time,
    ) -> None:
        self._url = str(url_or_path)
        self._fs, root = locate(self._url)
        self._files = DatasetFiles(self._fs, root, compression=compression)
        if index_path is None:
            if not self._files.local:
                raise SinkError(
                    f"ParquetSink on {self._url}: a non-local dataset needs index_path= "
                    "(a local file for the key index)"
                )
            index_path = Path(root) / _INDEX_DIR / "keys.sqlite"
        self._index_path = Path(index_path)
        self._lease = WriterLease(self._fs, root, self._index_path, clock=lease_clock)
        self._index: KeyIndex | None = None
        self._table: TableSpec | None = None
        self._schema: pa.Schema | None = None
        self._lock = asyncio.Lock()
        #: A write or delete failed part way: the next one first settles what it left.
        self._unsettled = False
        self._compression = compression
        self.target_file_bytes = target_file_bytes
        """A data file is rolled (closed, then published at the next commit) at this size."""
        self.row_group_bytes = ROW_GROUP_BYTES
        """Arrow bytes gathered per row group (:meth:`fit_buffers` sizes it to the budget)."""
        self._writing: dict[str, _Staged] = {}
        """The file being written in each partition folder."""
        self._closed: list[_Staged] = []
        """Files written in full, renamed into place at the next commit."""

    # --- Sink ----------------------------------------------------------------------------------

    async def open(self, table: TableSpec) -> None:
        schema = arrow_schema(table)
        async with self._lock:
            if self._table is not None:
                raise SinkError("ParquetSink is already open")
            await self._guarded("open", self._open, schema)
            self._table, self._schema = table, schema
            self._unsettled = False

    async def write(self, rows: ResultRows) -> int:
        table, schema = self._require()
        if len(rows) == 0:
            return 0
        async with self._lock:
            self._require()
            stored: int = await self._guarded("write", self._write, table, schema, rows)
            return stored

    async def commit(self) -> None:
        """Publishes every file written since the last commit (rename into place, marked
        committed in the index): the rows written before it are in the dataset when it
        returns."""
        self._require()
        async with self._lock:
            self._require()
            await self._guarded("commit", self._commit)

    def fit_buffers(self, budget_bytes: int) -> int:
        self.row_group_bytes = row_group_bytes_for(budget_bytes)
        return held_bytes(self.row_group_bytes)

    def uncommitted_bytes(self) -> int:
        writing, closed = list(self._writing.values()), list(self._closed)
        return sum(s.file.written_bytes for s in writing) + sum(s.size for s in closed)

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
            for staged in self._writing.values():  # never published: forgotten at the next open
                staged.file.abort()
            self._writing.clear()
            self._closed.clear()
            await in_thread(self._release)

    async def _guarded(self, what: str, func: Callable[..., _T], *args: Any) -> _T:
        """``func(*args)`` in a worker thread, settling first what a failed call left; a store,
        disk or index failure is raised classified (:func:`classify_parquet_error`)."""

        def run() -> _T:
            if self._unsettled and self._index is not None:
                self._reconcile(self._index)
                self._unsettled = False
            return func(*args)

        try:
            return await in_thread(run)
        except BaseException as exc:
            if what != "open":
                self._unsettled = True
            broken = [s.file for s in self._writing.values() if s.file.broken is not None]
            if isinstance(exc, FileBroken) or broken:
                fault = exc if isinstance(exc, FileBroken) else FileBroken(broken[0].path, exc)
                raise SinkError(f"Parquet sink {what} on {self._url}: {fault}") from exc
            if store_fault(exc):
                raise classify_parquet_error(exc, f"Parquet sink {what} on {self._url}") from exc
            raise

    # --- open / close --------------------------------------------------------------------------

    def _open(self, schema: pa.Schema) -> None:
        self._index = KeyIndex.open(self._index_path)
        try:
            self._lease.acquire()
            self._check_or_adopt(self._index, schema)
            self._reconcile(self._index)
        except BaseException:
            self._release()
            raise

    def _check_or_adopt(self, index: KeyIndex, schema: pa.Schema) -> None:
        """Checks the spec against the dataset's recorded schema; a fresh index records it,
        first rebuilding the keys from any files already in the dataset."""
        wanted = describe_schema(schema)
        stored = index.recorded_schema()
        if stored is not None:
            check_schema(f"Parquet dataset {self._url}", stored, wanted)
            return
        files = sorted(self._files.data_files())
        if files:
            found = describe_schema(self._files.read_schema(files[0]))
            check_schema(f"Parquet dataset {self._url} ({files[0]})", found, wanted)
        keys = ((rel, self._files.read(rel, ["chunk_id", "row_index"])) for rel in files)
        index.adopt(keys, wanted)

    def _reconcile(self, index: KeyIndex) -> None:
        """Settles what a crash left: pending files (not those this sink still writes or is
        to publish) and journalled deletions."""
        mine = {s.file_id for s in (*self._writing.values(), *self._closed)}
        for file_id, rel in index.pending():
            if file_id in mine:
                continue
            if self._files.exists(rel):  # renamed before the crash: its keys are right
                index.commit(file_id)
            else:
                self._files.remove(self._files.hidden(rel, "tmp"))
                index.forget(file_id)
        if index.has_deletions():
            self._apply_deletions(index)

    def _release(self) -> None:
        index, self._index = self._index, None
        if index is not None:
            with contextlib.suppress(Exception):  # best effort: the lease lapses anyway
                self._lease.release()
            index.close()

    def _require(self) -> tuple[TableSpec, pa.Schema]:
        if self._table is None or self._schema is None:
            raise SinkError("ParquetSink is not open")
        return self._table, self._schema

    def _require_index(self) -> KeyIndex:
        if self._index is None:
            raise SinkError("ParquetSink is not open")
        return self._index

    # --- write ---------------------------------------------------------------------------------

    def _write(self, spec: TableSpec, schema: pa.Schema, rows: ResultRows) -> int:
        """Streams the rows whose keys the index has not seen into the partition's open file
        (published at the next commit); returns how many."""
        index = self._require_index()
        self._lease.renew()
        table = to_arrow(spec, schema, rows)
        folder = partition(rows.processed_at)
        staged = self._writing.get(folder)
        if staged is None:
            rel = part_path(rows.processed_at)
            staged = _Staged(rel, index.start_file(rel), self._rolling(rel, schema))
            self._writing[folder] = staged
        chunk_ids = [str(c) for c in rows.chunk_id.tolist()]
        row_index = rows.row_index.tolist()
        claimed = index.claim_keys(staged.file_id, chunk_ids, row_index)
        if claimed is not None:
            if not claimed:
                return 0  # every row is there already
            keep = np.zeros(len(chunk_ids), dtype=bool)
            for i, key in enumerate(zip(chunk_ids, row_index, strict=True)):
                if key in claimed:  # the first of repeated keys in the batch wins
                    keep[i] = True
                    claimed.discard(key)
            table = table.filter(pa.array(keep))
        staged.file.add(table, {})
        if staged.file.full:
            self._roll(folder)
        return int(table.num_rows)

    def _rolling(self, rel: str, schema: pa.Schema) -> RollingFile:
        tmp = self._files.hidden(rel, "tmp")
        return RollingFile(
            tmp,
            schema,
            lambda: self._files.open_output(tmp),
            self.target_file_bytes,
            compression=self._compression,
            row_group_bytes=self.row_group_bytes,
        )

    def _roll(self, folder: str) -> None:
        """Closes the folder's open file (published at the next commit). A failure before
        anything was streamed out (opening the file) is the store's, retried like any; one
        midway leaves the file broken, kept so every later call says so."""
        staged = self._writing[folder]
        try:
            size = staged.file.close()
        except BaseException as exc:
            if staged.file.broken is None:
                raise
            raise FileBroken(staged.file.path, exc) from exc
        del self._writing[folder]
        if size is None:  # no row was ever streamed out: nothing to publish
            self._require_index().forget(staged.file_id)
            return
        staged.size = size
        self._closed.append(staged)

    def _commit(self) -> None:
        index = self._require_index()
        self._lease.renew()
        for folder in list(self._writing):
            self._roll(folder)
        while self._closed:
            staged = self._closed[0]
            tmp = self._files.hidden(staged.rel, "tmp")
            if self._files.exists(tmp) or not self._files.exists(staged.rel):
                self._files.finish(tmp, staged.rel)  # else renamed by a commit that failed after
            index.commit(staged.file_id)
            self._closed.pop(0)

    # --- delete --------------------------------------------------------------------------------

    def _delete(self, index: KeyIndex, chunk_ids: list[str]) -> None:
        self._commit()  # the deletions rewrite published files only
        index.journal_deletions(chunk_ids)
        self._apply_deletions(index)

    def _apply_deletions(self, index: KeyIndex) -> None:
        """Rewrites every file holding a journalled chunk without it, then forgets the keys.
        Safe to repeat: a file already rewritten has nothing left to remove."""
        import pyarrow.compute as pc  # noqa: PLC0415 (12 MiB of RSS: only when deleting)

        doomed, files = index.deletions()
        gone = pa.array(doomed, type=pa.string())
        emptied: list[int] = []
        for file_id, rel in files:
            self._files.remove(self._files.hidden(rel, "rewrite"))
            if not self._files.exists(rel):
                emptied.append(file_id)
                continue
            table = self._files.read(rel)
            keep = pc.invert(pc.is_in(table["chunk_id"], value_set=gone))
            if pc.all(keep).as_py():
                continue
            kept = table.filter(keep)
            if kept.num_rows == 0:
                self._files.delete(rel)
                emptied.append(file_id)
            else:
                self._files.publish(kept, rel, "rewrite")
        index.finish_deletions(emptied)
