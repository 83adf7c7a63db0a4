"""``rowbatch-consumer table``: the configuration's ``[source]`` made a table source by the
command line (``--input`` replaces a broker source, ``--shard K/N`` and ``--new-run`` override
the file), and the summary printed when a table run ends."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.cli import main, table_config
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig, load_config
from rowbatch.consumer.service.table_run import TableSummary, summarize, write_summary
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.table.settings import JOB_INDEX_VARIABLE, TableSettings
from rowbatch.consumer.sources.table.source import TableCounts, TableModel, TableSource
from tests.unit.consumer.sources.table.data import write_dataset

PUBSUB_SOURCE = """\
[source]
kind = "pubsub"
topic = "projects/p/topics/rows"
subscription = "projects/p/subscriptions/rows-scorer"
dead_letter_topic = "projects/p/topics/rows-scorer-dlq"
"""

TABLE_SOURCE = """\
[source]
kind = "table"
input = "/data/events"
schema = "id:int64"
state = "gs://bucket/state/"
chunk_rows = 500
shards = 8
"""

REST = """
[model]
url = "127.0.0.1:8001"
name = "scorer"

[binding]
inputs = { x = "X" }
outputs = { SCORE = "score" }
passthrough = { id = "int64" }

[sink]
kind = "sqlite"
path = "results.sqlite"
table = "scores"
"""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JOB_INDEX_VARIABLE, raising=False)


def config_file(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "consumer.toml"
    path.write_text(source + REST)
    return path


def load(tmp_path: Path, source: str) -> ConsumerConfig:
    return load_config(config_file(tmp_path, source))


def args(
    input: str | None = None,
    shard: str | None = None,
    new_run: bool = False,
    summary: Path | None = None,
) -> argparse.Namespace:
    return argparse.Namespace(input=input, shard=shard, new_run=new_run, summary=summary)


# --- table_config -------------------------------------------------------------------------------


def test_input_replaces_a_broker_source(tmp_path: Path) -> None:
    config = load(tmp_path, PUBSUB_SOURCE)
    assert isinstance(config.source, PubSubSettings)
    out = table_config(config, args(input="s3://lake/events/"))
    assert isinstance(out.source, TableSettings)
    assert out.source.input == "s3://lake/events/"
    assert out.source == TableSettings(input="s3://lake/events/")  # the defaults otherwise
    assert out.model == config.model
    assert out.binding == config.binding
    assert out.sink == config.sink
    assert isinstance(config.source, PubSubSettings), "the original is left as it was"


def test_a_broker_source_without_input_is_a_config_error(tmp_path: Path) -> None:
    config = load(tmp_path, PUBSUB_SOURCE)
    with pytest.raises(ConfigError, match=r"kind = 'pubsub'; give --input PATH_OR_URL"):
        table_config(config, args())


def test_a_table_source_is_kept_and_overridden_by_the_command_line(tmp_path: Path) -> None:
    config = load(tmp_path, TABLE_SOURCE)
    kept = table_config(config, args())
    assert kept.source == config.source
    assert isinstance(kept.source, TableSettings)
    assert (kept.source.schema_text, kept.source.chunk_rows) == ("id:int64", 500)

    out = table_config(config, args(input="/data/other", shard="1/4", new_run=True))
    assert isinstance(out.source, TableSettings)
    assert out.source.input == "/data/other"
    assert (out.source.shard, out.source.shards) == (1, 4)
    assert out.source.new_run is True
    # the rest of the file's [source] is kept
    assert out.source.schema_text == "id:int64"
    assert out.source.state == "gs://bucket/state/"
    assert out.source.chunk_rows == 500


def test_shard_sets_shard_and_shards(tmp_path: Path) -> None:
    out = table_config(load(tmp_path, PUBSUB_SOURCE), args(input="/d", shard="1/4"))
    assert isinstance(out.source, TableSettings)
    assert (out.source.shard, out.source.shards) == (1, 4)
    assert out.source.shard_index() == 1
    assert out.source.new_run is False


def test_new_run_sets_new_run(tmp_path: Path) -> None:
    out = table_config(load(tmp_path, PUBSUB_SOURCE), args(input="/d", new_run=True))
    assert isinstance(out.source, TableSettings)
    assert out.source.new_run is True


@pytest.mark.parametrize("text", ["1", "1/", "/4", "a/b", "1/4/2", "-1/4", "1 / 4", "1:4"])
def test_shard_text_that_is_not_k_of_n_is_a_config_error(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match=r"--shard .*give K/N"):
        table_config(load(tmp_path, PUBSUB_SOURCE), args(input="/d", shard=text))


@pytest.mark.parametrize(("text", "said"), [("4/4", "is not below shards = 4"), ("0/0", "shards")])
def test_a_shard_out_of_range_is_a_config_error(tmp_path: Path, text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=r"table: invalid \[source\]") as caught:
        table_config(load(tmp_path, PUBSUB_SOURCE), args(input="/d", shard=text))
    assert said in str(caught.value)


def test_a_shard_with_a_superscript_digit_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        table_config(load(tmp_path, PUBSUB_SOURCE), args(input="/d", shard="\u00b2/4"))


def test_main_refuses_table_flags_with_another_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, PUBSUB_SOURCE)
    with pytest.raises(SystemExit) as caught:
        main(["check", "--config", str(path), "--input", "/d"])
    assert caught.value.code == 2
    assert "go with the table command" in capsys.readouterr().err


def test_main_table_without_input_on_a_broker_config_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, PUBSUB_SOURCE)
    assert main(["table", "--config", str(path)]) == 2
    assert "give --input PATH_OR_URL" in capsys.readouterr().err


# --- the summary --------------------------------------------------------------------------------


async def finished_source(tmp_path: Path) -> TableSource:
    write_dataset(tmp_path / "in", [("a.parquet", 3)], 3)
    source = TableSource(
        TableSettings(input=str(tmp_path / "in"), state=str(tmp_path / "state")),
        model=TableModel("scorer", "1", {}),
    )
    await source.check()
    return source


async def summary_of(tmp_path: Path, *, complete: bool, planned: int | None) -> TableSummary:
    source = await finished_source(tmp_path)
    source.counts = TableCounts(
        planned=planned, skipped=1_000, read=1_234_000, written=1_233_990, dead_lettered=10
    )
    source.complete = complete
    metrics = Metrics()
    for rows in (100, 300):
        metrics.batch_size.observe(rows)
    return summarize(source, metrics=metrics, target_batch_size=400, in_flight=3, wall_s=100.0)


async def test_the_summary_lines_hold_the_figures(tmp_path: Path) -> None:
    summary = await summary_of(tmp_path, complete=True, planned=1_235_000)
    assert summary.rows_per_s == pytest.approx(12_340.0)
    assert (summary.batches, summary.mean_batch_rows) == (2, 200.0)
    assert summary.batch_fill == 0.5
    text = "\n".join(summary.lines())
    assert summary.lines()[0] == "table run complete"
    for figure in [
        "1,235,000 planned",
        "1,000 skipped",
        "1,234,000 read",
        "1,233,990 written",
        "10 dead-lettered",
        "1:40 wall",
        "12,340 rows/s",
        "2 batches of 200.0 rows",
        "50% of the target 400",
        str(tmp_path / "state" / "shard-0-of-1"),
    ]:
        assert figure in text, figure


async def test_an_incomplete_run_with_unknown_rows_says_so(tmp_path: Path) -> None:
    summary = await summary_of(tmp_path, complete=False, planned=None)
    lines = summary.lines()
    assert lines[0] == "table run NOT complete (stopped; a rerun resumes)"
    assert "? planned" in lines[1]


async def test_an_unreadable_part_makes_the_run_incomplete_and_is_named(tmp_path: Path) -> None:
    source = await finished_source(tmp_path)
    source.counts.unreadable.append("a.parquet rows 0-2: cannot read it: corrupt")
    summary = summarize(source, metrics=Metrics(), target_batch_size=400, in_flight=3, wall_s=1.0)
    lines = summary.lines()
    assert lines[0] == "table run NOT complete (1 part(s) of the input could not be read)"
    assert lines[-1] == "  unreadable: a.parquet rows 0-2: cannot read it: corrupt"
    assert json.loads(summary.to_json())["unreadable"] == [source.counts.unreadable[0]]


async def test_the_summary_json_holds_the_figures(tmp_path: Path) -> None:
    summary = await summary_of(tmp_path, complete=True, planned=1_235_000)
    data = json.loads(summary.to_json())
    assert data["complete"] is True
    assert data["planned_rows"] == 1_235_000
    assert data["skipped_rows"] == 1_000
    assert data["read_rows"] == 1_234_000
    assert data["written_rows"] == 1_233_990
    assert data["dead_lettered_rows"] == 10
    assert data["wall_s"] == 100.0
    assert data["rows_per_s"] == pytest.approx(12_340.0)
    assert data["batches"] == 2
    assert data["mean_batch_rows"] == 200.0
    assert data["target_batch_size"] == 400
    assert data["in_flight"] == 3
    assert data["batch_fill"] == 0.5
    assert data["state"] == str(tmp_path / "state" / "shard-0-of-1")


async def test_write_summary_prints_the_lines_and_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = await summary_of(tmp_path, complete=True, planned=None)
    target = tmp_path / "summary.json"
    write_summary(summary, target, sys.stderr)
    assert capsys.readouterr().err.splitlines() == summary.lines()
    assert json.loads(target.read_text()) == json.loads(summary.to_json())


def test_a_run_with_nothing_written_has_no_rate_or_fill() -> None:
    values: dict[str, object] = dict.fromkeys(TableSummary.__dataclass_fields__, 0)
    values |= {
        "complete": True,
        "planned_rows": None,
        "state": "s",
        "wall_s": 0.0,
        "unreadable": (),
    }
    summary = TableSummary(**values)  # type: ignore[arg-type]
    assert summary.batch_fill == 0.0
    assert "0 written" in summary.lines()[1]
