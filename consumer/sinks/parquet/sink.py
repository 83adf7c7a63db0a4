"""The Parquet sink: writes, deletions and crash recovery, keeping the dataset's files and the
key index in step (see the package docstring for the protocol)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np
import pyarrow as pa

from rowbatch.consumer.sinks.base import ResultRows, SinkError, TableSpec, in_thread
from rowbatch.consumer.sinks.parquet.faults import classify_parquet_error, store_fault
from rowbatch.consumer.sinks.parquet.files import DatasetFiles, locate, part_path
from rowbatch.consumer.sinks.parquet.index import KeyIndex
from rowbatch.consumer.sinks.parquet.rows import (
    arrow_schema,
    check_schema,
    describe_schema,
    to_arrow,
)

_T = TypeVar("_T")

_INDEX_DIR: Final = "_rowbatch"


class ParquetSink:
    """Result rows in the Parquet dataset at ``url_or_path`` (see the package docstring)."""

    def __init__(
        self,
        url_or_path: str,
        *,
        index_path: Path | None = None,
        compression: str = "snappy",
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
        self._index: KeyIndex | None = None
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

    async def write(self, rows: ResultRows) -> int:
        table, schema = self._require()
        if len(rows) == 0:
            return 0
        async with self._lock:
            self._require()
            stored: int = await self._guarded("write", self._write, table, schema, rows)
            return stored

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
            if store_fault(exc):
                raise classify_parquet_error(exc, f"Parquet sink {what} on {self._url}") from exc
            raise

    # --- open / close --------------------------------------------------------------------------

    def _open(self, schema: pa.Schema) -> None:
        self._index = KeyIndex.open(self._index_path)
        try:
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
        """Settles what a crash left: pending files and journalled deletions."""
        for file_id, rel in index.pending():
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
        """Writes the rows whose keys the index has not seen; returns how many."""
        index = self._require_index()
        table = to_arrow(spec, schema, rows)
        rel = part_path(rows.processed_at)
        chunk_ids = [str(c) for c in rows.chunk_id.tolist()]
        row_index = rows.row_index.tolist()
        file_id, claimed = index.claim(rel, chunk_ids, row_index)
        if claimed is not None:
            if not claimed:
                return 0  # every row is there already
            keep = np.zeros(len(chunk_ids), dtype=bool)
            for i, key in enumerate(zip(chunk_ids, row_index, strict=True)):
                if key in claimed:  # the first of repeated keys in the batch wins
                    keep[i] = True
                    claimed.discard(key)
            table = table.filter(pa.array(keep))
        try:
            self._files.publish(table, rel, "tmp")
        except BaseException:
            with contextlib.suppress(Exception):
                self._files.remove(self._files.hidden(rel, "tmp"))
                if not self._files.exists(rel):
                    index.forget(file_id)
            raise
        index.commit(file_id)
        return int(table.num_rows)

    # --- delete --------------------------------------------------------------------------------

    def _delete(self, index: KeyIndex, chunk_ids: list[str]) -> None:
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
