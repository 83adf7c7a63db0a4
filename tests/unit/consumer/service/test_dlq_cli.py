"""``rowbatch-consumer dlq`` (rowbatch/consumer/service/dlq_cli.py): the command line read into a
selection, argument errors (argparse's exit 2, or a clear message and exit 2), and a
configuration the tools cannot use (Pub/Sub without a dead-letter topic; ``replay`` of a table
run) -> exit 2, all before any broker is contacted. A table run's dead letters are counted from
its state folder (here an empty local one)."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from harness.proc import free_port
from rowbatch.consumer.dlq.kafka_queue import KafkaDeadLetterQueue
from rowbatch.consumer.dlq.selection import SelectionError
from rowbatch.consumer.service import cli as consumer_cli
from rowbatch.consumer.service.config import ConfigError, load_config
from rowbatch.consumer.service.dlq_cli import build_parser, main, open_queue, selection_of
from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.consumer.sources.table.dead_letters import (
    records,
    unreadable_record,
    write_dead_letters,
)
from rowbatch.consumer.sources.table.plan import DataFile, Unit
from rowbatch.consumer.sources.table.reader import Piece
from rowbatch.consumer.sources.table.state import StateFolder
from rowbatch.tables.formats import InputFormat
from rowbatch.wire.dead_letter import ReasonClass
from tests.unit.consumer.service.test_table_cli import REST

TABLE_SOURCE = """\
[source]
kind = "table"
input = "{root}/input"
schema = "id:int64"
state = "{root}/state"
"""

PUBSUB_WITHOUT_DLQ = """\
[source]
kind = "pubsub"
topic = "projects/p/topics/rows"
subscription = "projects/p/subscriptions/rows-scorer"
"""

KAFKA_SOURCE = """\
[source]
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topic = "rows"
group_id = "g"
"""


NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``ROWBATCH_*`` variable of the caller's may change the configuration read."""
    for name in list(os.environ):
        if name.startswith("ROWBATCH_"):
            monkeypatch.delenv(name)


def config_file(tmp_path: Path, source: str) -> Path:
    path = tmp_path / "consumer.toml"
    path.write_text(source.format(root=tmp_path.as_posix()) + REST)
    return path


# --- the command line -------------------------------------------------------------------


def test_defaults() -> None:
    args = build_parser().parse_args(["stats"])
    assert args.action == "stats"
    assert args.config is None
    assert (args.reason, args.code, args.table, args.chunk_id, args.source) == ([],) * 5
    assert (args.since, args.until, args.limit) == (None, None, None)
    assert (args.rows, args.max_replays, args.lease, args.timeout) == (3, 3, 60, 30.0)
    assert not args.json
    assert not args.dry_run
    assert args.to is None


def test_selection_of_the_filters() -> None:
    args = build_parser().parse_args(
        [
            "replay",
            "--reason",
            "undecodable",
            "--reason",
            "rejected-by-model",
            "--code",
            "invalid_json",
            "--table",
            "docs",
            "--chunk-id",
            "c1",
            "--source",
            "rows/0",
            "--since",
            "2h",
            "--until",
            "2026-12-03T07:30:00Z",
        ]
    )
    got = selection_of(args, NOW)
    assert got.reasons == frozenset({"undecodable", "rejected-by-model"})
    assert got.codes == frozenset({"invalid_json"})
    assert got.tables == frozenset({"docs"})
    assert got.chunk_ids == frozenset({"c1"})
    assert got.sources == frozenset({"rows/0"})
    assert got.since == NOW - timedelta(hours=2)
    assert got.until == datetime(2026, 12, 3, 7, 30, tzinfo=UTC)


def test_selection_of_nothing_selects_everything() -> None:
    got = selection_of(build_parser().parse_args(["stats"]), NOW)
    assert got.describe() == "every dead letter"


def test_a_bad_since_names_the_option() -> None:
    args = build_parser().parse_args(["stats", "--since", "last tuesday"])
    with pytest.raises(SelectionError, match=r"^--since 'last tuesday'"):
        selection_of(args, NOW)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["stats", "--lease", "5"], "--lease must be within 10-600"),
        (["stats", "--lease", "601"], "--lease must be within 10-600"),
        (["show", "--limit", "-1"], "--limit must be >= 0"),
        (["purge"], "invalid choice"),
        (["replay", "--max-replays", "many"], "invalid int value"),
    ],
)
def test_argument_errors_exit_2(
    argv: list[str], said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        main([*argv, "--config", str(config_file(tmp_path, KAFKA_SOURCE))])
    assert caught.value.code == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("lease", ["10", "600"])
def test_the_lease_bounds_are_allowed(lease: str) -> None:
    # parse only: main would go on to read the configuration
    assert build_parser().parse_args(["stats", "--lease", lease]).lease == int(lease)


def test_a_bad_since_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["stats", "--since", "yesterday", "--config", str(config_file(tmp_path, KAFKA_SOURCE))]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --since 'yesterday': ")
    assert "30m, 2h, 7d" in err


def test_a_bad_until_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", "--until", "2026-13-40", "--config", str(tmp_path / "none.toml")])
    assert code == 2
    assert capsys.readouterr().err.startswith("error: --until '2026-13-40': ")


@pytest.mark.parametrize("age", ["99999999d", "1000000000d"])
def test_a_huge_age_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], age: str) -> None:
    code = main(["stats", "--since", age, "--config", str(config_file(tmp_path, KAFKA_SOURCE))])
    assert code == 2
    assert capsys.readouterr().err.startswith(f"error: --since {age!r}: ")


def test_negative_rows_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as done:
        main(["show", "--rows", "-1", "--config", str(tmp_path / "none.toml")])
    assert done.value.code == 2


# --- configurations ------------------------------------------------------------------------


def test_replay_of_a_table_run_exits_2_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["replay", "--config", str(config_file(tmp_path, TABLE_SOURCE))])
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "error: replay: a table run's dead letters are not replayed by publishing"
    )
    assert "--new-run" in captured.err


def test_the_consumer_command_hands_dlq_to_the_tools(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = consumer_cli.main(
        ["dlq", "replay", "--dry-run", "--config", str(config_file(tmp_path, TABLE_SOURCE))]
    )
    assert code == 2
    assert "not replayed by publishing" in capsys.readouterr().err


def test_stats_of_a_table_run_without_dead_letters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "state").mkdir()
    code = main(["stats", "--json", "--config", str(config_file(tmp_path, TABLE_SOURCE))])
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {
        "read": 0,
        "selected": 0,
        "duplicates": 0,
        "by_reason": {},
        "groups": [],
    }


def test_stats_and_show_of_a_table_run_read_its_dead_letter_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The files a run writes (rows, and a part of a file unreadable to its end, its rows never
    counted), as ``stats`` and ``show`` read them: the unknown size said in words."""
    folder = StateFolder(str(tmp_path / "state"), "shard-0-of-1")
    rows = pa.table({"id": [1, 2]})
    piece = Piece(
        Unit(0, DataFile("/in/a.csv", "a.csv", InputFormat.CSV, "a.csv", ()), 0, 0, 2), 0, rows
    )
    reason = DeadLetterReason(ReasonClass.UNDECODABLE, "bad", "invalid_value")
    write_dead_letters(folder, list(records(piece, reason, attempt=1)))
    write_dead_letters(folder, [unreadable_record("b.csv", 10, None, "stops parsing")])
    config = str(config_file(tmp_path, TABLE_SOURCE))

    assert main(["stats", "--config", config]) == 0
    lines = capsys.readouterr().out.splitlines()
    [readable] = [line for line in lines if "invalid_value" in line]
    [unreadable] = [line for line in lines if "unreadable_input" in line]
    assert readable.split()[5:7] == ["2", "2"]  # 2 letters, 2 rows
    assert "0 known + 1 letter of unknown size" in unreadable
    assert "?" not in "\n".join(lines)
    assert lines[-1] == "3 selected of 3 read"

    assert main(["stats", "--json", "--config", config]) == 0
    groups = json.loads(capsys.readouterr().out)["groups"]
    assert [(g["code"], g["rows"], g["letters_without_row_count"]) for g in groups] == [
        ("invalid_value", 2, 0),
        ("unreadable_input", 0, 1),
    ]

    assert main(["show", "--config", config]) == 0
    shown = capsys.readouterr().out
    for ref in ("shard-0-of-1/a.csv#0", "shard-0-of-1/a.csv#1", "shard-0-of-1/b.csv#10"):
        assert ref in shown


def test_pubsub_without_a_dead_letter_topic_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["show", "--config", str(config_file(tmp_path, PUBSUB_WITHOUT_DLQ))])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: [source] names no dead_letter_topic")
    assert "set dead_letter_topic" in err


def test_open_queue_refuses_pubsub_without_a_dead_letter_topic(tmp_path: Path) -> None:
    pubsub = load_config(config_file(tmp_path, PUBSUB_WITHOUT_DLQ))
    with pytest.raises(ConfigError, match="names no dead_letter_topic"):
        open_queue(pubsub, timeout_s=1.0)


def test_open_queue_of_a_kafka_source_connects_to_nothing(tmp_path: Path) -> None:
    queue = open_queue(load_config(config_file(tmp_path, KAFKA_SOURCE)), timeout_s=1.0)
    assert isinstance(queue, KafkaDeadLetterQueue)
    assert queue.where == "Kafka topic rows.dlq at 127.0.0.1:9092"
    assert queue.default_target == "rows"


def test_a_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["stats", "--config", str(tmp_path / "absent.toml")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


# --- a broker that does not answer ------------------------------------------------------------


def test_pubsub_that_does_not_answer_exits_4_and_is_not_an_empty_queue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pulls to an address nobody listens on fail like "no message yet" once retried to their
    deadline; the command must say the service did not answer, not print empty counts."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", f"127.0.0.1:{free_port()}")
    source = """\
[source]
kind = "pubsub"
subscription = "projects/p1/subscriptions/sub-a"
dead_letter_topic = "projects/p1/topics/dlq-a"
"""
    code = main(["stats", "--timeout", "1", "--config", str(config_file(tmp_path, source))])
    captured = capsys.readouterr()
    assert code == 4, captured
    assert captured.out == ""
    assert "did not answer for projects/p1/subscriptions/sub-a-dlq within 1 s" in captured.err


def test_kafka_that_does_not_answer_exits_4(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = KAFKA_SOURCE.replace("127.0.0.1:9092", f"127.0.0.1:{free_port()}")
    code = main(["stats", "--timeout", "2", "--config", str(config_file(tmp_path, source))])
    assert code == 4
    assert "cannot read Kafka topic rows.dlq" in capsys.readouterr().err
