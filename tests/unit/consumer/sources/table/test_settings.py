"""``[source] kind = "table"``: this worker's shard from ``shard``, else from an Indexed Job's
``$JOB_COMPLETION_INDEX``, else 0 for a single shard; anything else is an error that says
what to set."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rowbatch.consumer.sources.table.settings import (
    JOB_INDEX_VARIABLE,
    TableSettings,
    table_write_rows,
)


@pytest.fixture(autouse=True)
def _no_job_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOB_INDEX_VARIABLE, raising=False)


def test_defaults() -> None:
    settings = TableSettings(input="/data")
    assert settings.kind == "table"
    assert (settings.shards, settings.shard, settings.chunk_rows) == (1, None, 1024)
    assert settings.shard_index() == 0


def test_the_schema_is_given_by_its_alias_or_name() -> None:
    assert TableSettings.model_validate({"input": "x", "schema": "id:int64"}).schema_text == (
        "id:int64"
    )
    by_name = TableSettings.model_validate({"input": "x", "schema_text": "id:int64"})
    assert by_name.schema_text == "id:int64"


def test_the_shard_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOB_INDEX_VARIABLE, "1")
    assert TableSettings(input="x", shards=4, shard=3).shard_index() == 3


@pytest.mark.parametrize(("text", "shard"), [("0", 0), ("2", 2), ("3", 3)])
def test_the_shard_comes_from_the_job_completion_index(
    monkeypatch: pytest.MonkeyPatch, text: str, shard: int
) -> None:
    monkeypatch.setenv(JOB_INDEX_VARIABLE, text)
    assert TableSettings(input="x", shards=4).shard_index() == shard


def test_several_shards_without_a_shard_is_an_error() -> None:
    settings = TableSettings(input="x", shards=3)
    with pytest.raises(ValueError, match=r"shards = 3 but no shard is given") as caught:
        settings.shard_index()
    assert "--shard K/N" in str(caught.value)
    assert JOB_INDEX_VARIABLE in str(caught.value)


@pytest.mark.parametrize("text", ["4", "17", "-1", "one", "", " 1"])
def test_a_job_index_out_of_range_or_not_a_number_is_an_error(
    monkeypatch: pytest.MonkeyPatch, text: str
) -> None:
    monkeypatch.setenv(JOB_INDEX_VARIABLE, text)
    with pytest.raises(ValueError, match=r"JOB_COMPLETION_INDEX = .* is not a shard index below"):
        TableSettings(input="x", shards=4).shard_index()


def test_a_job_index_is_checked_for_a_single_shard_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JOB_INDEX_VARIABLE, "1")
    with pytest.raises(ValueError, match="below shards = 1"):
        TableSettings(input="x").shard_index()


@pytest.mark.parametrize(("shard", "shards"), [(4, 4), (9, 2), (1, 1)])
def test_a_shard_not_below_shards_is_refused(shard: int, shards: int) -> None:
    with pytest.raises(ValidationError, match=rf"shard {shard} is not below shards = {shards}"):
        TableSettings(input="x", shard=shard, shards=shards)


@pytest.mark.parametrize(
    "fields",
    [
        {"input": ""},
        {"input": "x", "shards": 0},
        {"input": "x", "shard": -1},
        {"input": "x", "chunk_rows": 0},
        {"input": "x", "format": "orc"},
        {"input": "x", "unknown": 1},
    ],
)
def test_bad_values_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        TableSettings.model_validate(fields)


@pytest.mark.parametrize(
    ("in_flight", "writers", "rows"), [(4, 2, 512), (4, 1, 1024), (8, 2, 1024), (1, 2, 256)]
)
def test_a_table_runs_writes_together_hold_one_batch_per_slot(
    in_flight: int, writers: int, rows: int
) -> None:
    assert table_write_rows(256, in_flight, writers) == rows
    assert writers * rows <= max(in_flight, writers) * 256
