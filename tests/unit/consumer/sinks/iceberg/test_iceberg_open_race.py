"""Replicas starting together: the catalog database refuses to create what another consumer has
just created (the namespace, the table, the ledger's tables); ``open`` says so as a transient
fault, so start-up opens again, instead of exiting."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy.exc as sa_exc

from rowbatch.consumer.sinks.base import SinkError, SinkUnavailable
from rowbatch.consumer.sinks.iceberg.catalog import LedgerCatalog
from rowbatch.consumer.sinks.iceberg.sink import IcebergSink
from tests.unit.consumer.sinks.iceberg.test_iceberg_sink import SPEC


def _unique_violation() -> sa_exc.IntegrityError:
    return sa_exc.IntegrityError(
        "INSERT INTO iceberg_namespace_properties ...",
        {},
        Exception(
            'duplicate key value violates unique constraint "iceberg_namespace_properties_pkey"'
        ),
    )


def catalog(tmp_path: Path) -> LedgerCatalog:
    return LedgerCatalog(
        "rb", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh"
    )


async def test_a_namespace_created_meanwhile_is_transient_and_the_next_open_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    real = LedgerCatalog.create_namespace_if_not_exists
    raced = [True]

    def create(self: LedgerCatalog, namespace: str) -> None:
        if raced.pop() if raced else False:
            real(self, namespace)  # the other replica's, a moment earlier
            raise _unique_violation()
        real(self, namespace)

    monkeypatch.setattr(LedgerCatalog, "create_namespace_if_not_exists", create)
    sink = IcebergSink(lambda: catalog(tmp_path), namespace="ns")
    try:
        with pytest.raises(SinkUnavailable, match="another consumer created"):
            await sink.open(SPEC)
        await sink.open(SPEC)  # start-up's retry
    finally:
        await sink.close()


async def test_other_integrity_errors_at_open_stay_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    def create(self: LedgerCatalog, namespace: str) -> None:
        raise sa_exc.IntegrityError("INSERT ...", {}, Exception("NOT NULL constraint failed"))

    monkeypatch.setattr(LedgerCatalog, "create_namespace_if_not_exists", create)
    sink = IcebergSink(lambda: catalog(tmp_path), namespace="ns")
    try:
        with pytest.raises(SinkError) as raised:
            await sink.open(SPEC)
        assert not isinstance(raised.value, SinkUnavailable)
    finally:
        await sink.close()
