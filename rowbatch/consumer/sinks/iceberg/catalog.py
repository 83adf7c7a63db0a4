"""pyiceberg's SQL catalog, with each rowbatch commit made in one database transaction that
moves the table's metadata pointer *and* writes the key ledger (:mod:`.ledger`).

pyiceberg stages a commit (new metadata file, manifest list and manifests written to the
warehouse), then swaps the table's metadata pointer in ``iceberg_tables`` with a compare-and-set
``UPDATE``. Here that ``UPDATE`` runs first in the transaction: it holds the table's row lock
until the transaction ends, so no other commit of the table can pass between it and our
``COMMIT``; under that lock the ledger is read for the rows this commit claims, and either every
claim is free (ledger rows inserted, committed together with the pointer) or the transaction
rolls back and :class:`~.ledger.AlreadyClaimed` says which rows were taken.

A lost compare-and-set (another writer committed since this one loaded the table) raises
pyiceberg's ``CommitFailedException``: pyiceberg's transaction retries it on fresh metadata
(``commit.retry.*`` table properties); each one is counted in ``conflicts``.

Written against pyiceberg 0.12 (``_update_and_stage_table``, ``_write_metadata``,
``IcebergTables``); :func:`check_pyiceberg` refuses a pyiceberg without them by name.
"""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa
from pyiceberg.catalog import Catalog
from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.update import TableRequirement, TableUpdate

from rowbatch.consumer.sinks.base import SinkError
from rowbatch.consumer.sinks.iceberg import ledger
from rowbatch.consumer.sinks.iceberg.ledger import AlreadyClaimed, CommitIntent

_NEEDED = ("_update_and_stage_table", "_write_metadata", "_convert_schema_if_needed")


def check_pyiceberg() -> None:
    """Raises ``SinkError`` when the installed pyiceberg lacks what the ledger commit uses."""
    import pyiceberg  # noqa: PLC0415

    missing = [name for name in _NEEDED if not hasattr(SqlCatalog, name)]
    if missing:
        raise SinkError(
            f"the Iceberg sink needs pyiceberg 0.12's SqlCatalog.{', '.join(missing)}, which "
            f"pyiceberg {pyiceberg.__version__} lacks: install pyiceberg 0.12 "
            "(pip install 'pyiceberg[pyarrow]==0.12.*')"
        )


class LedgerCatalog(SqlCatalog):
    """A :class:`SqlCatalog` whose commits carry the ledger intent set by :meth:`intent_for`."""

    def __init__(self, name: str, **properties: Any) -> None:
        check_pyiceberg()
        super().__init__(name, **properties)
        ledger.metadata.create_all(self.engine)
        self._local = threading.local()
        self.conflicts = 0
        """Commits that lost the compare-and-set to another writer (pyiceberg retried them)."""

    def set_intent(self, intent: CommitIntent | None) -> None:
        """The ledger claims of the next commit made from this thread (``None``: a plain
        pyiceberg commit)."""
        self._local.intent = intent

    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        intent: CommitIntent | None = getattr(self._local, "intent", None)
        if intent is None:
            return super().commit_table(table, requirements, updates)
        identifier = table.name()
        namespace = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
        name = Catalog.table_name_from(identifier)
        current = self.load_table(identifier)
        staged = self._update_and_stage_table(current, identifier, requirements, updates)
        self._write_metadata(
            metadata=staged.metadata, io=staged.io, metadata_path=staged.metadata_location
        )
        with self.engine.begin() as conn:
            swapped = conn.execute(
                sa.update(IcebergTables)
                .where(
                    IcebergTables.catalog_name == self.name,
                    IcebergTables.table_namespace == namespace,
                    IcebergTables.table_name == name,
                    IcebergTables.metadata_location == current.metadata_location,
                )
                .values(
                    metadata_location=staged.metadata_location,
                    previous_metadata_location=current.metadata_location,
                )
            )
            if swapped.rowcount < 1:
                self.conflicts += 1
                raise CommitFailedException(
                    f"table {namespace}.{name} was committed by another writer meanwhile"
                )
            taken = ledger.claimed(conn, intent.table_ident, intent.claims)
            if taken:
                raise AlreadyClaimed(taken)  # rolls back the pointer too
            ledger.record(conn, intent, staged.metadata_location)
        return CommitTableResponse(  # type: ignore[call-arg]  # pyiceberg's own call, by name
            metadata=staged.metadata, metadata_location=staged.metadata_location
        )

    # --- reads outside a commit -----------------------------------------------------------------

    def claimed(self, table_ident: str, wanted: ledger.Claims) -> ledger.Claims:
        with self.engine.connect() as conn:
            return ledger.claimed(conn, table_ident, wanted)

    def chunks_committed(self, table_ident: str, chunk_ids: list[str]) -> list[str]:
        with self.engine.connect() as conn:
            return ledger.chunks_committed(conn, table_ident, chunk_ids)

    def landed(self, table_ident: str, commit_id: str) -> bool:
        with self.engine.connect() as conn:
            return ledger.landed(conn, table_ident, commit_id)

    def close(self) -> None:
        self.engine.dispose()
