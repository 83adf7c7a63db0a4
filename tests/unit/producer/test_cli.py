"""``python -m rowbatch.producer publish`` end to end against a fake publisher: the rows that arrive
are the rows of the file, chunk ids are deterministic, big chunks are split, and every error is one
line naming the file/row/column/topic."""

from __future__ import annotations

import argparse
import io
import json
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from rowbatch.producer.cli.brokers import make_publisher
from rowbatch.producer.cli.main import main
from rowbatch.producer.cli.parser import build_parser
from rowbatch.producer.publishers.errors import TopicNotFound
from rowbatch.producer.publishers.kafka import KafkaPublisher
from rowbatch.producer.publishers.pubsub import PubSubPublisher
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_ROW_COUNT, H_TABLE
from tests.unit.producer.publish_fakes import FakePublisher, reassemble

BROKER = ["--broker", "kafka", "--bootstrap", "fake:9092", "--topic", "rows"]


def run_cli(
    argv: Sequence[str], publisher: FakePublisher | None = None, stdin: bytes | None = None
) -> tuple[int, str, str, FakePublisher]:
    publisher = publisher or FakePublisher()
    out, err = io.StringIO(), io.StringIO()
    code = main(
        list(argv),
        publisher_factory=lambda _opts: publisher,
        stdin=io.BytesIO(stdin) if stdin is not None else None,
        stdout=out,
        stderr=err,
    )
    return code, out.getvalue(), err.getvalue(), publisher


def _table(n: int) -> pa.Table:
    rng = np.random.default_rng(7)
    score = rng.random(n)
    return pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "text": [f'ряд {i} ✓ "quoted", comma' if i % 7 else "" for i in range(n)],
            "score": pa.array(score, mask=np.arange(n) % 11 == 3),
            "flag": np.arange(n) % 3 == 0,
        }
    )


def _messages(publisher: FakePublisher) -> list[tuple[bytes, dict[str, str]]]:
    return [(s.payload, s.attributes) for s in publisher.sent]


def _assert_same_rows(publisher: FakePublisher, expected: pa.Table) -> None:
    got = reassemble(_messages(publisher))
    assert set(got) == set(expected.column_names)
    for name in expected.column_names:
        column = expected.column(name)
        values, nulls = got[name]
        assert nulls.tolist() == column.is_null().to_pylist(), name
        want = column.to_pylist()
        have = [None if null else v for v, null in zip(values.tolist(), nulls, strict=True)]
        assert have == want, name


def test_publish_csv_in_chunks_of_n_rows(tmp_path: Path) -> None:
    table = _table(2500)
    path = tmp_path / "orders.csv"
    pcsv.write_csv(table, path)
    manifest = tmp_path / "summary.json"
    code, out, err, publisher = run_cli(
        [
            "publish",
            *BROKER,
            "--file",
            str(path),
            "--chunk-rows",
            "1000",
            "--encoding",
            "json",
            "--table",
            "orders",
            "--manifest",
            str(manifest),
        ]
    )
    assert code == 0, err
    assert err == ""  # no progress off a terminal, no noise
    assert [m.attributes[H_ROW_COUNT] for m in publisher.sent] == ["1000", "1000", "500"]
    assert {m.attributes[H_TABLE] for m in publisher.sent} == {"orders"}
    ids = [m.attributes[H_CHUNK_ID] for m in publisher.sent]
    assert re.fullmatch(r"orders-[0-9a-f]{12}:0", ids[0])
    prefix = ids[0].rsplit(":", 1)[0]
    assert ids == [f"{prefix}:{i}" for i in range(3)]
    _assert_same_rows(publisher, table)
    assert publisher.closed and publisher.flushed
    summary_bytes = sum(len(m.payload) for m in publisher.sent)
    line = out.strip()
    assert line.startswith("published: 2,500 rows, 3 chunks, ")
    assert "rows/s (json, fake topic fake-topic" in line
    data = json.loads(manifest.read_text())
    assert data["summary"]["rows"] == 2500 and data["summary"]["chunks"] == 3
    assert data["summary"]["bytes"] > summary_bytes  # payload + attributes
    assert data["summary"]["id_prefix"] == prefix


def test_same_file_and_settings_give_the_same_chunk_ids(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    pcsv.write_csv(_table(30), path)
    argv = ["publish", *BROKER, "--file", str(path), "--chunk-rows", "10"]
    first = run_cli(argv)[3]
    again = run_cli(argv)[3]
    other = run_cli([*argv[:-1], "11"])[3]
    ids = [[m.attributes[H_CHUNK_ID] for m in p.sent] for p in (first, again, other)]
    assert ids[0] == ids[1]
    assert ids[0][0].split(":")[0] != ids[2][0].split(":")[0]
    named = run_cli([*argv, "--id-prefix", "orders-db"])[3]
    assert [m.attributes[H_CHUNK_ID] for m in named.sent] == [
        "orders-db:0",
        "orders-db:1",
        "orders-db:2",
    ]


def test_publish_parquet_as_arrow_with_vectors_and_nulls(tmp_path: Path) -> None:
    n = 1234
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((n, 4)).astype(np.float32)
    vectors = pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 4)
    table = pa.table(
        {
            "id": np.arange(n, dtype=np.int64),
            "label": pa.array([None if i % 5 == 0 else f"l{i}" for i in range(n)]),
            "emb": vectors,
            "weight": pa.array(rng.random(n).astype(np.float32)),
        }
    )
    path = tmp_path / "emb.parquet"
    pq.write_table(table, path)
    code, out, err, publisher = run_cli(
        ["publish", *BROKER, "--file", str(path), "--chunk-rows", "500"]
    )
    assert code == 0, err
    assert len(publisher.sent) == 3
    assert {m.attributes["content-type"] for m in publisher.sent} == {
        "application/vnd.apache.arrow.stream"
    }
    assert {m.attributes[H_TABLE] for m in publisher.sent} == {"emb"}  # from the file name
    got = reassemble(_messages(publisher))
    assert got["emb"][0].dtype == np.float32
    np.testing.assert_array_equal(got["emb"][0], emb)
    assert got["weight"][0].dtype == np.float32
    assert got["label"][1].tolist() == [i % 5 == 0 for i in range(n)]
    assert "1,234 rows, 3 chunks" in out


def test_publish_jsonl_from_stdin(tmp_path: Path) -> None:
    lines = "".join(json.dumps({"id": i, "v": [i, i + 0.5]}) + "\n" for i in range(25))
    code, out, err, publisher = run_cli(
        [
            "publish",
            *BROKER,
            "--file",
            "-",
            "--format",
            "jsonl",
            "--table",
            "vecs",
            "--chunk-rows",
            "10",
            "--encoding",
            "json",
        ],
        stdin=lines.encode(),
    )
    assert code == 0, err
    assert [m.attributes[H_ROW_COUNT] for m in publisher.sent] == ["10", "10", "5"]
    assert publisher.sent[0].attributes[H_CHUNK_ID].startswith("stdin-")
    chunk = decode_chunk(publisher.sent[2].payload, publisher.sent[2].attributes)
    assert chunk.columns["v"].tolist() == [[i, i + 0.5] for i in range(20, 25)]
    assert "25 rows, 3 chunks" in out


def test_csv_with_a_declared_schema(tmp_path: Path) -> None:
    path = tmp_path / "s.csv"
    path.write_text('id,count,features\n1,5,"[0.5, 1.5]"\n2,,"[2, 3]"\n', encoding="utf-8")
    code, _, err, publisher = run_cli(
        [
            "publish",
            *BROKER,
            "--file",
            str(path),
            "--schema",
            "id:int64,count:float32,features:vector[float32,2]",
        ]
    )
    assert code == 0, err
    chunk = decode_chunk(publisher.sent[0].payload, publisher.sent[0].attributes)
    assert [str(chunk.types[c]) for c in chunk.columns] == [
        "int64",
        "float32",
        "vector[float32,2]",
    ]
    assert chunk.null_masks["count"].tolist() == [False, True]


def test_a_chunk_too_big_for_one_message_is_split(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    pcsv.write_csv(_table(1000), path)
    publisher = FakePublisher(max_chunk_bytes=8000)
    code, out, err, _ = run_cli(
        ["publish", *BROKER, "--file", str(path), "--id-prefix", "big", "--chunk-rows", "600"],
        publisher,
    )
    assert code == 0, err
    ids = [m.attributes[H_CHUNK_ID] for m in publisher.sent]
    first = [i for i in ids if i.startswith("big:0.")]
    second = [i for i in ids if i.startswith("big:1.")]
    assert first == [f"big:0.{k}" for k in range(len(first))] and len(first) > 1
    assert second == [f"big:1.{k}" for k in range(len(second))] and len(second) > 1
    assert len(ids) == len(first) + len(second)
    assert all(len(m.payload) < 8000 for m in publisher.sent)
    _assert_same_rows(publisher, _table(1000))
    assert f"1,000 rows, {len(ids)} chunks" in out


def test_a_row_over_the_limit_is_named(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    texts = ["short"] * 10
    texts[6] = "x" * 50_000
    pcsv.write_csv(pa.table({"id": list(range(10)), "text": texts}), path)
    code, out, err, _ = run_cli(
        ["publish", *BROKER, "--file", str(path), "--chunk-rows", "4"],
        FakePublisher(max_chunk_bytes=10_000),
    )
    assert code == 1
    assert err.count("\n") == 1
    assert f"{path}: data row 7 alone encodes to " in err
    assert "over the 10,000-byte limit of one message on fake topic 'fake-topic'" in err
    assert "published before the error: 4 rows, 1 chunks" in out


def test_chunks_in_flight_when_the_input_turns_bad_are_confirmed_and_counted(
    tmp_path: Path,
) -> None:
    """The bad row is found while the first chunk's publish is still in flight (a slow
    broker): that chunk is confirmed before the error, so the summary counts what the broker
    has (it used to be cancelled, its fate unknown, and the summary said nothing)."""
    path = tmp_path / "huge.csv"
    texts = ["short"] * 10
    texts[6] = "x" * 50_000
    pcsv.write_csv(pa.table({"id": list(range(10)), "text": texts}), path)
    publisher = FakePublisher(max_chunk_bytes=10_000, delay_s=0.3)
    code, out, err, _ = run_cli(
        ["publish", *BROKER, "--file", str(path), "--chunk-rows", "4"], publisher
    )
    assert code == 1
    assert "data row 7 alone encodes to " in err
    assert "published before the error: 4 rows, 1 chunks" in out
    assert len(publisher.sent) == 1


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--schema", "id:int64,when:timestamp"], "column 'when': unknown column type 'timestamp'"),
        (["--schema", "nope:int64"], "--schema names column(s) ['nope']"),
        ([], "column 'day'"),
    ],
)
def test_column_errors_are_one_line(tmp_path: Path, argv: list[str], expected: str) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,day\n1,2024-01-02\n", encoding="utf-8")
    code, out, err, publisher = run_cli(["publish", *BROKER, "--file", str(path), *argv])
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("rowbatch-producer publish: error: ")
    assert expected in err
    assert out == "" and publisher.sent == []


def test_missing_file_and_missing_topic_are_one_line(tmp_path: Path) -> None:
    code, _, err, _ = run_cli(["publish", *BROKER, "--file", str(tmp_path / "no.csv")])
    assert code == 1 and err.count("\n") == 1
    assert f"{tmp_path / 'no.csv'}: cannot open it" in err
    path = tmp_path / "ok.csv"
    path.write_text("id\n1\n", encoding="utf-8")
    missing = FakePublisher(start_error=TopicNotFound("Kafka topic 'rows' does not exist"))
    code, out, err, _ = run_cli(["publish", *BROKER, "--file", str(path)], missing)
    assert code == 1
    assert err == "rowbatch-producer publish: error: Kafka topic 'rows' does not exist\n"
    assert out == ""
    assert missing.closed


def test_a_failure_midway_reports_what_was_published(tmp_path: Path) -> None:
    path = tmp_path / "r.csv"
    pcsv.write_csv(_table(10_000), path)
    manifest = tmp_path / "m.json"
    code, out, err, publisher = run_cli(
        [
            "publish",
            *BROKER,
            "--file",
            str(path),
            "--max-in-flight",
            "1",
            "--manifest",
            str(manifest),
        ],
        FakePublisher(fail_at=2),
    )
    assert code == 1
    assert "refused chunk" in err and err.count("\n") == 1
    assert "published before the error: 2,000 rows, 2 chunks" in out
    data = json.loads(manifest.read_text())
    assert data["summary"]["complete"] is False and "refused chunk" in data["error"]
    assert publisher.closed


def test_usage_errors(tmp_path: Path) -> None:
    path = tmp_path / "ok.csv"
    path.write_text("id\n1\n", encoding="utf-8")
    code, _, err, _ = run_cli(["publish", *BROKER, "--file", "-", "--format", "csv"], stdin=b"")
    assert code == 2 and "--table NAME" in err
    code, _, err, _ = run_cli(["publish", *BROKER, "--file", "-", "--table", "t"], stdin=b"a\n")
    assert code == 1 and "give the format with --format" in err
    code, _, err, _ = run_cli(
        [
            "publish",
            *BROKER,
            "--file",
            str(path),
            "--encoding",
            "json",
            "--arrow-compression",
            "lz4",
        ]
    )
    assert code == 2 and "--arrow-compression needs --encoding arrow" in err
    with pytest.raises(SystemExit) as info:
        run_cli(["publish", *BROKER, "--file", str(path), "--chunk-rows", "0"])
    assert info.value.code == 2


def _opts(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["publish", "--file", "x.csv", *argv])


def test_make_publisher_builds_the_chosen_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PUBSUB_PROJECT_ID", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    pubsub = make_publisher(
        _opts(
            ["--broker", "pubsub", "--topic", "rows", "--project", "p1", "--emulator-host", "h:1"]
        )
    )
    assert isinstance(pubsub, PubSubPublisher)
    assert pubsub.topic == "projects/p1/topics/rows" and pubsub.address == "h:1"
    kafka = make_publisher(
        _opts(
            [
                "--broker",
                "kafka",
                "--bootstrap",
                "b:9092",
                "--topic",
                "rows",
                "--compression",
                "gzip",
                "--max-message-bytes",
                "2000000",
            ]
        )
    )
    assert isinstance(kafka, KafkaPublisher)
    assert kafka.address == "b:9092" and kafka.max_message_bytes == 2_000_000


def test_make_publisher_usage_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("PUBSUB_PROJECT_ID", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    path = tmp_path / "ok.csv"
    path.write_text("id\n1\n", encoding="utf-8")
    err = io.StringIO()
    code = main(["publish", "--broker", "kafka", "--topic", "t", "--file", str(path)], stderr=err)
    assert code == 2 and "needs --bootstrap" in err.getvalue()
    err = io.StringIO()
    code = main(["publish", "--broker", "pubsub", "--topic", "t", "--file", str(path)], stderr=err)
    assert code == 2 and "no project; pass --project" in err.getvalue()
    err = io.StringIO()
    code = main(
        [
            "publish",
            "--broker",
            "pubsub",
            "--project",
            "p",
            "--topic",
            "t",
            "--file",
            str(path),
            "--compression",
            "zstd",
        ],
        stderr=err,
    )
    assert code == 2 and "--compression is for Kafka" in err.getvalue()
