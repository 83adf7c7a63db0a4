"""The Iceberg sink: rows are streamed into large data files as they are written, and made part of
the table by :meth:`IcebergSink.commit` (the pipeline acks a message only after the commit that
holds its last row: :mod:`rowbatch.consumer.engine.commit_stage`). See the package docstring for
the exactly-once design."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Any, Final, TypeVar

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry, Counter, Histogram

from rowbatch.consumer.sinks.base import (
    ResultRows,
    SinkError,
    SinkUnavailable,
    TableSpec,
    first_line,
    in_thread,
    utc,
)
from rowbatch.consumer.sinks.iceberg import schema as table_schema
from rowbatch.consumer.sinks.iceberg.faults import classify_iceberg_error
from rowbatch.consumer.sinks.iceberg.files import (
    ClosedFile,
    data_path,
    rows_without,
    without,
    write_rows,
)
from rowbatch.consumer.sinks.iceberg.ledger import (
    AlreadyClaimed,
    Claims,
    CommitIntent,
    contains,
    merge_claims,
    merged,
    overlap,
    runs,
)
from rowbatch.consumer.sinks.rolling import (
    ROW_GROUP_BYTES,
    FileBroken,
    RollingFile,
    held_bytes,
    row_group_bytes_for,
)

log = logging.getLogger(__name__)

_T = TypeVar("_T")

COMMIT_ID_PROPERTY: Final = "rowbatch.commit-id"
"""The snapshot summary property naming the commit (the ledger's ``commit_id``)."""

_EVERY_ROW: Final = [(0, 1 << 62)]


class IcebergMetrics:
    """The sink's own figures (``None`` registry: not exported)."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        kw: dict[str, Any] = {"registry": registry}
        self.commits = Counter("rowbatch_iceberg_commits", "Iceberg commits made", **kw)
        self.conflicts = Counter(
            "rowbatch_iceberg_commit_conflicts",
            "Iceberg commits that lost the race to another writer and were retried",
            **kw,
        )
        self.files = Counter("rowbatch_iceberg_files", "Data files committed", **kw)
        self.rows = Counter("rowbatch_iceberg_rows_committed", "Rows committed", **kw)
        self.dropped = Counter(
            "rowbatch_iceberg_rows_already_committed",
            "Rows written again (a redelivery) found in the table and left out",
            **kw,
        )
        self.seconds = Histogram(
            "rowbatch_iceberg_commit_seconds",
            "Time to close the data files and commit them",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            **kw,
        )


class IcebergSink:
    """Result rows in the Iceberg table ``namespace.table`` of a :class:`LedgerCatalog`
    (built on :meth:`open` by ``catalog_factory``)."""

    def __init__(
        self,
        catalog_factory: Callable[[], Any],
        *,
        namespace: str,
        target_file_bytes: int = 128 * 1024 * 1024,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._factory = catalog_factory
        self._namespace = namespace
        self.target_file_bytes = target_file_bytes
        self.row_group_bytes = ROW_GROUP_BYTES
        """Arrow bytes gathered per row group (:meth:`fit_buffers` sizes it to the budget)."""
        self._metrics = IcebergMetrics(registry)
        self._lock = asyncio.Lock()
        self._catalog: Any = None
        self._table: Any = None
        self._spec: TableSpec | None = None
        self._ident = ""
        self._key = ""
        """The table in the ledger: catalog name, namespace and table (catalogs may share a
        database)."""
        self._file_schema: pa.Schema | None = None
        self._open: dict[str, RollingFile] = {}
        self._closed: list[ClosedFile] = []
        self._staged: Claims = {}
        """The rows in the files not yet committed (open or closed)."""
        self._unknown: tuple[str, frozenset[str]] | None = None
        """The id and files of a commit whose outcome is not known (it failed midway)."""
        self._conflicts_seen = 0

    # --- Sink -----------------------------------------------------------------------------------

    async def open(self, table: TableSpec) -> None:
        async with self._lock:
            if self._spec is not None:
                raise SinkError("IcebergSink is already open")
            await self._guarded("open", self._open_table, table)
            self._spec = table

    async def write(self, rows: ResultRows) -> int:
        spec = self._require()
        if len(rows) == 0:
            return 0
        async with self._lock:
            stored: int = await self._guarded("write", self._write, spec, rows)
            return stored

    async def commit(self) -> None:
        """Closes the open data files and commits every file written since the last commit in
        one snapshot; when this returns, every row written before it is in the table."""
        self._require()
        async with self._lock:
            with self._metrics.seconds.time():
                await self._guarded("commit", self._commit)

    def fit_buffers(self, budget_bytes: int) -> int:
        self.row_group_bytes = row_group_bytes_for(budget_bytes)
        return held_bytes(self.row_group_bytes)

    def uncommitted_bytes(self) -> int:
        """Bytes of data files (open or closed) not yet committed."""
        return sum(f.written_bytes for f in self._open.values()) + sum(f.size for f in self._closed)

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        self._require()
        if not chunk_ids:
            return
        async with self._lock:
            await self._guarded("delete_chunks", self._delete, list(chunk_ids))

    async def close(self) -> None:
        async with self._lock:
            for f in self._open.values():
                f.abort()
            self._open.clear()
            self._closed.clear()
            self._spec = None
            if self._catalog is not None:
                await in_thread(self._catalog.close)
                self._catalog = None
                await in_thread(_stop_pyiceberg_threads)

    # --- internals ------------------------------------------------------------------------------

    def _require(self) -> TableSpec:
        if self._spec is None:
            raise SinkError("IcebergSink is not open")
        return self._spec

    async def _guarded(self, what: str, func: Callable[..., _T], *args: Any) -> _T:
        try:
            return await in_thread(func, *args)
        except (SinkError, AlreadyClaimed):
            raise
        except FileBroken as exc:
            raise SinkError(f"Iceberg sink {what} on {self._ident}: {exc}") from exc
        except Exception as exc:
            if what == "open" and _created_meanwhile(exc):
                raise SinkUnavailable(
                    f"Iceberg sink open on {self._ident or 'its table'}: another consumer "
                    f"created the same catalog object at the same moment ({first_line(exc)}); "
                    "opening again"
                ) from exc
            broken = [f for f in self._open.values() if f.broken is not None]
            if broken:
                fault = FileBroken(broken[0].path, exc)
                raise SinkError(f"Iceberg sink {what} on {self._ident}: {fault}") from exc
            raise classify_iceberg_error(exc, f"Iceberg sink {what} on {self._ident}") from exc
        finally:
            self._count_conflicts()

    def _count_conflicts(self) -> None:
        if self._catalog is not None and self._catalog.conflicts > self._conflicts_seen:
            self._metrics.conflicts.inc(self._catalog.conflicts - self._conflicts_seen)
            self._conflicts_seen = self._catalog.conflicts

    def _open_table(self, spec: TableSpec) -> None:
        catalog = self._factory()
        try:
            self._open_in(catalog, spec)
        except BaseException:
            catalog.close()  # its connections, not left to the garbage collector
            raise

    def _open_in(self, catalog: Any, spec: TableSpec) -> None:
        from pyiceberg.exceptions import (  # noqa: PLC0415
            NamespaceAlreadyExistsError,
            NoSuchTableError,
            TableAlreadyExistsError,
        )

        wanted = table_schema.arrow_schema(spec)
        ident = f"{self._namespace}.{spec.name}"
        with contextlib.suppress(NamespaceAlreadyExistsError):  # another replica's, meanwhile
            catalog.create_namespace_if_not_exists(self._namespace)
        try:
            table = catalog.load_table(ident)
        except NoSuchTableError:
            try:
                table = self._create(catalog, ident, wanted)
            except TableAlreadyExistsError:
                table = catalog.load_table(ident)
        table_schema.check(f"Iceberg table {ident}", table.schema(), wanted)
        self._catalog, self._table, self._ident = catalog, table, ident
        self._key = f"{catalog.name}.{ident}"
        self._conflicts_seen = catalog.conflicts
        from pyiceberg.io.pyarrow import schema_to_pyarrow  # noqa: PLC0415

        self._file_schema = schema_to_pyarrow(table.schema())

    @staticmethod
    def _create(catalog: Any, ident: str, wanted: pa.Schema) -> Any:
        """Creates the table, partitioned by day from its first snapshot on."""
        schema = catalog._convert_schema_if_needed(wanted)
        return catalog.create_table(
            ident, schema=schema, partition_spec=table_schema.partition_spec(schema)
        )

    def _write(self, spec: TableSpec, rows: ResultRows) -> int:
        assert self._file_schema is not None
        table = table_schema.file_rows(spec, self._file_schema, rows)
        chunk_id, row_index = rows.chunk_id, rows.row_index
        keep = self._fresh(chunk_id, row_index)
        if keep is not None:  # a redelivery: rows staged or committed already are left out
            self._metrics.dropped.inc(int((~keep).sum()))
            if not keep.any():
                return 0
            table = table.filter(pa.array(keep))
            chunk_id, row_index = chunk_id[keep], row_index[keep]
        claims = runs(chunk_id, row_index)
        day = utc(rows.processed_at).date().isoformat()
        current = self._open.get(day)
        if current is None:
            path = data_path(self._table.location(), day)
            current = RollingFile(
                path,
                self._file_schema,
                self._opener(path),
                self.target_file_bytes,
                row_group_bytes=self.row_group_bytes,
            )
            self._open[day] = current
        current.add(table, claims)
        for chunk, ranges in claims.items():
            self._staged[chunk] = merged([*self._staged.get(chunk, ()), *ranges])
        if current.full:
            self._roll(day)
        return int(table.num_rows)

    def _fresh(
        self, chunk_id: NDArray[np.object_], row_index: NDArray[np.int64]
    ) -> NDArray[np.bool_] | None:
        """Which rows to write (``None``: all): not those staged here since the last commit or
        committed by anyone (the ledger), nor the second of a key repeated in the write."""
        n = int(chunk_id.shape[0])
        claims = runs(chunk_id, row_index)
        keep: NDArray[np.bool_] | None = None
        if sum(e - s for ranges in claims.values() for s, e in ranges) < n:
            keep = np.ones(n, dtype=bool)
            seen: set[tuple[str, int]] = set()
            for i, key in enumerate(zip(chunk_id.tolist(), row_index.tolist(), strict=True)):
                if key in seen:
                    keep[i] = False
                seen.add(key)
        staged = {c: overlap(r, self._staged[c]) for c, r in claims.items() if c in self._staged}
        for gone in (
            {c: r for c, r in staged.items() if r},
            self._catalog.claimed(self._key, claims),
        ):
            for chunk, ranges in gone.items():
                keep = np.ones(n, dtype=bool) if keep is None else keep
                mine = chunk_id == chunk
                keep[mine] &= ~contains(ranges, row_index[mine])
        return keep

    def _opener(self, path: str) -> Callable[[], Any]:
        io = self._table.io
        return lambda: io.new_output(path).create(overwrite=True)

    def _roll(self, day: str) -> None:
        """Closes the day's open file (it is committed with the next commit)."""
        current = self._open[day]
        try:
            size = current.close()
        except BaseException as exc:
            if current.broken is None:  # opening the file failed: nothing lost, retried
                raise
            raise FileBroken(current.path, exc) from exc
        del self._open[day]
        if size is not None:
            claims = merge_claims(current.claims)
            self._closed.append(ClosedFile(current.path, current.rows, claims, size))

    def _delete(self, chunk_ids: list[str]) -> None:
        doomed = {c for c in chunk_ids if c in self._staged}
        if doomed:  # out of the files not yet committed, at once (a replay may follow)
            for day, f in list(self._open.items()):
                if f.drop_chunks(doomed):
                    self._roll(day)
            self._closed = self._rewrite(self._closed, dict.fromkeys(doomed, _EVERY_ROW))
            for chunk in doomed:
                del self._staged[chunk]
        committed = self._catalog.chunks_committed(self._key, chunk_ids)
        if committed:
            self._delete_committed(committed)

    def _delete_committed(self, chunk_ids: list[str]) -> None:
        """Deletes the committed rows of ``chunk_ids`` (their data files rewritten without
        them: copy-on-write) and their ledger rows, in one commit."""
        from pyiceberg.expressions import In  # noqa: PLC0415
        from pyiceberg.io.pyarrow import parquet_file_to_data_file  # noqa: PLC0415

        assert self._file_schema is not None
        gone = dict.fromkeys(chunk_ids, _EVERY_ROW)
        intent = CommitIntent(self._key, uuid.uuid4().hex, releases=tuple(chunk_ids))
        self._table.refresh()
        doomed = In("chunk_id", set(chunk_ids))  # type: ignore[call-arg,arg-type]
        tasks = list(self._table.scan(row_filter=doomed).plan_files())
        tx = self._table.transaction()
        props = {COMMIT_ID_PROPERTY: intent.commit_id}
        with tx.update_snapshot(snapshot_properties=props).overwrite() as overwrite:
            for task in tasks:
                kept = rows_without(self._table.io, task.file.file_path, self._file_schema, gone)
                if kept is None:
                    continue
                overwrite.delete_data_file(task.file)
                if kept.num_rows:
                    day = task.file.file_path.rsplit("/", 2)[-2].partition("=")[2]
                    path = data_path(self._table.location(), day)
                    write_rows(self._table.io, kept, path)
                    overwrite.append_data_file(
                        parquet_file_to_data_file(self._table.io, tx.table_metadata, path)
                    )
        self._catalog.set_intent(intent)
        try:
            tx.commit_transaction()
        finally:
            self._catalog.set_intent(None)
        log.info("deleted the committed rows of %d dead-lettered chunk(s)", len(chunk_ids))

    def _commit(self) -> None:
        for day in list(self._open):
            self._roll(day)
        if self._unknown is not None:
            commit_id, paths = self._unknown
            if self._catalog.landed(self._key, commit_id):
                log.info("commit %s had landed before its outcome was lost", commit_id)
                self._closed = [f for f in self._closed if f.path not in paths]
            self._unknown = None
        if not self._closed:
            self._staged = {}
            return
        while self._closed:
            commit_id = uuid.uuid4().hex
            files = list(self._closed)
            intent = CommitIntent(
                self._key,
                commit_id,
                claims=_joined(files),
                rows=sum(f.rows for f in files),
                files=len(files),
            )
            try:
                self._append(files, intent)
            except AlreadyClaimed as exc:
                dropped = sum(e - s for ranges in exc.taken.values() for s, e in ranges)
                self._metrics.dropped.inc(dropped)
                log.info("commit %s: %s; writing the files again without them", commit_id, exc)
                self._closed = self._rewrite(files, exc.taken)
                continue
            self._closed, self._staged, self._unknown = [], {}, None
            self._metrics.commits.inc()
            self._metrics.files.inc(len(files))
            self._metrics.rows.inc(intent.rows)

    def _append(self, files: list[ClosedFile], intent: CommitIntent) -> None:
        from pyiceberg.io.pyarrow import parquet_file_to_data_file  # noqa: PLC0415

        self._table.refresh()
        tx = self._table.transaction()
        props = {COMMIT_ID_PROPERTY: intent.commit_id}
        with tx.update_snapshot(snapshot_properties=props).fast_append() as append:
            for f in files:
                append.append_data_file(
                    parquet_file_to_data_file(self._table.io, tx.table_metadata, f.path)
                )
        self._catalog.set_intent(intent)
        self._unknown = (intent.commit_id, frozenset(f.path for f in files))
        try:
            tx.commit_transaction()
        except AlreadyClaimed:
            self._unknown = None
            raise
        finally:
            self._catalog.set_intent(None)

    def _rewrite(
        self, files: list[ClosedFile], gone: dict[str, list[tuple[int, int]]]
    ) -> list[ClosedFile]:
        assert self._file_schema is not None
        out = []
        for f in files:
            if not any(chunk in gone for chunk in f.claims):
                out.append(f)
                continue
            day = f.path.rsplit("/", 2)[-2].partition("=")[2]
            kept = without(
                self._table.io, f, self._file_schema, gone, data_path(self._table.location(), day)
            )
            if kept is not None:
                out.append(kept)
        return out


def _joined(files: list[ClosedFile]) -> Claims:
    return merge_claims(f.claims for f in files)


def _created_meanwhile(exc: BaseException) -> bool:
    """Whether ``exc`` is the catalog database refusing to create what another consumer has
    just created (replicas starting together: the namespace, the table, the ledger tables)."""
    import sqlalchemy.exc as sa_exc  # noqa: PLC0415

    if not isinstance(exc, sa_exc.IntegrityError | sa_exc.ProgrammingError):
        return False
    text = str(exc).lower()
    return "already exists" in text or "duplicate key" in text or "unique" in text


def _stop_pyiceberg_threads() -> None:
    """Ends pyiceberg's shared worker threads (not daemons: left running they would hold the
    process open at exit); pyiceberg starts new ones if it needs them again."""
    from pyiceberg.utils.concurrent import ExecutorFactory  # noqa: PLC0415

    executor, ExecutorFactory._instance = ExecutorFactory._instance, None
    if executor is not None:
        executor.shutdown(wait=True)
