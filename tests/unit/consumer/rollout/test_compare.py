"""``rowbatch-consumer compare`` (rowbatch/consumer/rollout/compare*.py): the figures of a
comparison table the project's own sinks wrote (100 rows; the candidate differs on the rows with
``id % 10 == 7`` and fails on four, see tests/unit/test_rollout_read_table.py), checked
exactly against what was written; tolerances, NaN, zero vectors and many-valued class outputs
on hand-built tables; the report's text and JSON; the command's exit codes and messages."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from rowbatch.consumer.rollout.compare import (
    MATRIX_VALUES,
    TOP_PAIRS,
    compare_table,
    output_names,
)
from rowbatch.consumer.rollout.compare_cli import comparison_table, parse_tolerances
from rowbatch.consumer.rollout.compare_report import report_json, report_lines
from rowbatch.consumer.rollout.compare_values import (
    Comparison,
    NotComparable,
    Tolerance,
)
from rowbatch.consumer.rollout.read_table import read_comparison
from rowbatch.consumer.service import cli
from rowbatch.consumer.service.config import load_config
from rowbatch.consumer.sinks.settings import ParquetSinkSettings, SqliteSinkSettings
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink
from tests.unit.consumer.rollout.test_read_table import (
    DIFFERS,
    FAILED,
    IDS,
    RESULTS,
    TABLE,
    N,
    candidate,
    production,
    write_parquet,
    write_sqlite,
)

OK = ~np.isin(IDS, list(FAILED))
"""The rows with both answers."""


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``ROWBATCH_*`` variable of the caller's may change the configuration read."""
    for name in list(os.environ):
        if name.startswith("ROWBATCH_"):
            monkeypatch.delenv(name)


async def written(kind: str, tmp_path: Path) -> pa.Table:
    if kind == "sqlite":
        await write_sqlite(tmp_path / "results.sqlite")
        return read_comparison(SqliteSinkSettings(path=tmp_path / "results.sqlite"), TABLE)
    await write_parquet(tmp_path / TABLE)
    return read_comparison(ParquetSinkSettings(url=str(tmp_path / "scores")), TABLE)


def key(i: int) -> tuple[str, int, int]:
    return (f"c{i // 50}", i % 50, i)


def differences(name: str) -> np.ndarray[Any, Any]:
    """candidate - production on the rows with both answers, as the comparison computes it."""
    return candidate()[name][OK].astype(np.float64) - production()[name][OK].astype(np.float64)


# --- the figures ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["sqlite", "parquet"])
async def test_figures_of_a_table_the_sinks_wrote(tmp_path: Path, kind: str) -> None:
    found = compare_table(await written(kind, tmp_path), {})
    assert (found.rows, found.candidate_failed) == (N, 4)
    assert found.errors == (("deadline exceeded", 3), ("model rejected the request", 1))
    assert found.distinct_errors == 2
    assert found.key_columns == ("chunk_id", "row_index", "id")
    assert [o.name for o in found.outputs] == ["score", "label", "embedding"]
    for output in found.outputs:
        assert (output.compared, output.missing, output.agree) == (96, 4, 86)
        assert output.differing_total == 10
        assert output.agreement == pytest.approx(86 / 96)

    score, label, embedding = found.outputs
    assert (score.kind, score.type, score.tolerance) == ("numeric", "float32", Tolerance())
    diff = differences("score")
    assert score.difference is not None and score.abs_difference is not None
    want = np.quantile(diff, [0.5, 0.9, 0.99])
    assert (score.difference.p50, score.difference.p90, score.difference.p99) == pytest.approx(want)
    assert (score.difference.min, score.difference.max) == pytest.approx((0.0, 2.5))
    assert score.abs_difference.p99 == pytest.approx(np.quantile(np.abs(diff), 0.99))
    assert score.histogram is not None
    counts, edges = np.histogram(diff, bins=16)
    assert score.histogram.counts == tuple(counts.tolist())
    assert score.histogram.edges == pytest.approx(edges.tolist())
    # largest difference first: id 97 differs by 2.5, then 87 (2.25) ... 7 (0.25)
    outside = [97, 87, 77, 67, 57, 47, 37, 27, 17, 7]
    assert [d.key for d in score.differing] == [key(i) for i in outside]
    first = score.differing[0]
    assert (first.production, first.candidate, first.abs_difference) == pytest.approx(
        (9.7, 12.2, 2.5)
    )

    assert (label.kind, label.type, label.difference, label.histogram) == (
        "class",
        "int32",
        None,
        None,
    )
    assert label.confusion is not None and label.confusion.complete
    mine, theirs = production()["label"][OK].tolist(), candidate()["label"][OK].tolist()
    assert Counter({(p, c): k for p, c, k in label.confusion.pairs}) == Counter(
        zip(mine, theirs, strict=True)
    )
    assert label.confusion.pairs[0][2] == max(Counter(zip(mine, theirs, strict=True)).values())
    flipped = [i for i in IDS.tolist() if DIFFERS[i]]  # in key order
    assert [d.key for d in label.differing] == [key(i) for i in flipped]
    assert [(d.production, d.candidate) for d in label.differing] == [
        (i % 3, (i + 1) % 3) for i in flipped
    ]

    assert (embedding.kind, embedding.type) == ("vector", "float32[8]")
    assert embedding.abs_difference is not None and embedding.cosine is not None
    assert embedding.abs_difference.max == pytest.approx(0.5, abs=1e-6)
    assert embedding.abs_difference.p50 == 0.0
    p = production()["embedding"][OK].astype(np.float64)
    c = candidate()["embedding"][OK].astype(np.float64)
    cosine = (p * c).sum(axis=1) / np.linalg.norm(p, axis=1) / np.linalg.norm(c, axis=1)
    assert embedding.cosine.min == pytest.approx(cosine.min())
    assert embedding.cosine.p50 == pytest.approx(1.0)
    assert {d.key for d in embedding.differing} == {key(i) for i in flipped}
    assert all(d.abs_difference == pytest.approx(0.5, abs=1e-6) for d in embedding.differing)

    v1, v3 = found.versions
    assert (v1.production_version, v1.candidate_model, v1.candidate_version) == ("1", "scorer", "2")
    assert (v1.rows, v1.candidate_failed, v3.rows, v3.candidate_failed) == (75, 3, 25, 1)
    assert v1.latency_ms is not None and v3.candidate_latency_ms is not None
    assert (v1.latency_ms.p50, v1.latency_ms.p99) == pytest.approx(
        np.quantile(10.0 + IDS[:75], [0.5, 0.99])
    )
    assert v3.candidate_latency_ms.p99 == pytest.approx(np.quantile(20.0 + 2 * IDS[75:], 0.99))


async def test_tolerances_and_the_rows_listed(tmp_path: Path) -> None:
    table = await written("sqlite", tmp_path)
    loose = {"score": Tolerance(0.3), "embedding": Tolerance(0.0, 10.0)}
    found = compare_table(table, loose, flipped=3)
    score, label, embedding = found.outputs
    assert score.agree == 87  # id 7 differs by 0.25 only
    assert score.tolerance == Tolerance(0.3)
    assert [d.key for d in score.differing] == [key(97), key(87), key(77)]
    assert (label.agree, len(label.differing), label.differing_total) == (86, 3, 10)
    p = production()["embedding"][OK].astype(np.float64)
    c = candidate()["embedding"][OK].astype(np.float64)
    assert embedding.agree == int((np.abs(c - p) <= 10.0 * np.abs(p)).all(axis=1).sum())
    nothing = compare_table(table, {}, flipped=0)
    assert all(o.differing == () and o.differing_total == 10 for o in nothing.outputs)


def layout(n: int, **outputs: pa.Array) -> pa.Table:
    """A comparison table of ``n`` rows in one chunk with ``outputs`` (production and
    ``__candidate`` columns), no passthrough, no failures."""
    return pa.table(
        {
            "chunk_id": ["c"] * n,
            "row_index": list(range(n)),
            "source_message_id": ["m"] * n,
            **outputs,
            "production_version": ["1"] * n,
            "latency_ms": [1.0] * n,
            "candidate_latency_ms": pa.nulls(n, pa.float64()),
            "candidate_error": pa.nulls(n, pa.string()),
            "model_name": ["m"] * n,
            "model_version": ["2"] * n,
            "processed_at": pa.nulls(n, pa.timestamp("us", tz="UTC")),
        }
    )


def test_nan_zero_vectors_and_text() -> None:
    nan = float("nan")
    table = layout(
        4,
        x=pa.array([nan, nan, 1.0, None]),
        x__candidate=pa.array([nan, 2.0, 1.0, 5.0]),
        v=pa.array([[0.0, 0.0], [0.0, 0.0], [1.0, 0.0], [1.0, 1.0]], pa.list_(pa.float32())),
        v__candidate=pa.array(
            [[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [-1.0, -1.0]], pa.list_(pa.float32())
        ),
        t=pa.array(["a", "b", "c", None]),
        t__candidate=pa.array(["a", "c", "c", "d"]),
    )
    found = compare_table(table, {})
    x, v, t = found.outputs
    assert (x.compared, x.missing, x.agree) == (3, 1, 2)  # NaN agrees with NaN only
    assert [d.key for d in x.differing] == [("c", 1)]
    assert x.differing[0].abs_difference == float("inf")
    assert x.difference is not None and x.difference.max == 0.0  # finite differences only
    assert (v.kind, v.type, v.agree) == ("vector", "float32[2]", 2)
    assert [d.key for d in v.differing] == [("c", 3), ("c", 1)]
    assert [d.cosine for d in v.differing] == pytest.approx([-1.0, 0.0])
    assert v.cosine is not None and (v.cosine.min, v.cosine.max) == pytest.approx((-1.0, 1.0))
    assert (t.kind, t.type, t.compared, t.agree) == ("class", "string", 3, 2)
    assert t.confusion is not None
    assert t.confusion.pairs == (("a", "a", 1), ("b", "c", 1), ("c", "c", 1))
    assert found.candidate_failed == 0 and found.errors == ()
    assert found.versions[0].candidate_latency_ms is None


def test_a_candidate_that_failed_on_every_row() -> None:
    vectors = pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float32()))
    table = layout(
        2,
        v=vectors,
        v__candidate=pa.nulls(2, pa.list_(pa.float32())),
        x=pa.array([1.0, 2.0]),
        x__candidate=pa.nulls(2, pa.float64()),
    )
    at = table.schema.get_field_index("candidate_error")
    table = table.set_column(at, "candidate_error", pa.array(["boom", "boom"]))
    found = compare_table(table, {})
    assert (found.candidate_failed, found.errors) == (2, (("boom", 2),))
    for output in found.outputs:
        assert (output.compared, output.missing, output.agreement) == (0, 2, None)
        assert (output.abs_difference, output.histogram, output.differing) == (None, None, ())
    lines = report_lines(found, "t")
    assert "candidate errors: 2 rows, 1 message" in lines
    assert "  agreement -: 0 of 0 rows with both answers (2 without)" in lines
    uneven = layout(
        1, v=pa.array([[1.0, 2.0]]), v__candidate=pa.array([[1.0]], pa.list_(pa.float64()))
    )
    with pytest.raises(NotComparable, match="v: vectors of 2 and 1 elements"):
        compare_table(uneven, {})


def test_a_many_valued_class_keeps_the_most_common_pairs() -> None:
    n = 200
    production_values = [i % 40 for i in range(n)]
    candidate_values = [v if i % 4 else (v + 1) % 40 for i, v in enumerate(production_values)]
    table = layout(n, k=pa.array(production_values), k__candidate=pa.array(candidate_values))
    confusion = compare_table(table, {}).outputs[0].confusion
    assert confusion is not None and not confusion.complete
    assert len(confusion.pairs) == TOP_PAIRS
    assert confusion.distinct == len(set(zip(production_values, candidate_values, strict=True)))
    assert [k for _, _, k in confusion.pairs] == sorted(
        (k for _, _, k in confusion.pairs), reverse=True
    )
    assert MATRIX_VALUES < 40


def test_tables_that_are_not_comparisons_and_bad_tolerances() -> None:
    assert output_names(["a", "a__candidate", "b__candidate", "c"]) == ["a"]
    with pytest.raises(NotComparable, match="no column ends in __candidate"):
        compare_table(layout(1, score=pa.array([1.0])), {})
    bare = pa.table({"chunk_id": ["c"], "row_index": [0], "s": [1.0], "s__candidate": [1.0]})
    with pytest.raises(NotComparable, match="it lacks production_version, latency_ms"):
        compare_table(bare, {})
    table = layout(
        1,
        s=pa.array([1.0]),
        s__candidate=pa.array([1.0]),
        k=pa.array([1]),
        k__candidate=pa.array([1]),
    )
    for name in ("k", "nope"):
        with pytest.raises(
            NotComparable, match=rf"--tolerance {name}: not a float or vector output .*those: s;"
        ):
            compare_table(table, {name: Tolerance()})


def test_parse_tolerances() -> None:
    assert parse_tolerances(["score=1e-4", "embedding=0.001:0.01"]) == {
        "score": Tolerance(1e-4, 0.0),
        "embedding": Tolerance(0.001, 0.01),
    }
    for bad in ("score", "score=", "=1", "score=x", "score=1:y", "score=-1", "score=1:-0.5"):
        with pytest.raises(ValueError, match="give COLUMN=ATOL or COLUMN=ATOL:RTOL"):
            parse_tolerances([bad])


# --- the report -------------------------------------------------------------------------------


async def figures(tmp_path: Path) -> Comparison:
    return compare_table(await written("sqlite", tmp_path), {}, flipped=2)


async def test_the_text_report(tmp_path: Path) -> None:
    lines = report_lines(await figures(tmp_path), "t in somewhere")
    text = "\n".join(lines)
    assert lines[:2] == [
        "comparison table t in somewhere",
        "100 rows compared; the candidate failed on 4 (4.00%)",
    ]
    assert "candidate errors: 4 rows, 2 messages" in text
    assert "     3  deadline exceeded" in text
    assert "  production  candidate  rows  failed  latency_ms p50" in text
    assert "scorer:2     75       3" in text
    assert "output score: numeric (float32), atol 1e-06 rtol 0" in lines
    assert text.count("agreement 89.58%: 86 of 96 rows with both answers (4 without)") == 3
    assert "  candidate - production, 16 bins:" in lines
    bars = [line for line in lines if line.endswith("#")]
    assert len(bars) == 11  # the bins holding rows: 0 (86 rows) and one per differing row
    assert max(bars, key=len).endswith("#" * 40)
    assert "output label: class (int32)" in lines
    assert "    0  29   3   0" in lines  # the confusion table's first row
    assert "  10 rows flipped, 2 shown (in key order):" in lines
    assert "  10 rows outside the tolerance, 2 shown (largest |difference| first):" in lines
    assert "output embedding: vector (float32[8]), atol 1e-06 rtol 0" in lines
    assert any(line.startswith("  cosine similarity") for line in lines)


async def test_the_json_report_holds_the_same_figures(tmp_path: Path) -> None:
    found = report_json(await figures(tmp_path), "t", "SQLite database x")
    again = json.loads(json.dumps(found, allow_nan=False))
    assert again == found
    assert (found["table"], found["store"], found["rows"], found["candidate_failed"]) == (
        "t",
        "SQLite database x",
        100,
        4,
    )
    assert found["candidate_errors"]["most_common"][0] == {
        "message": "deadline exceeded",
        "rows": 3,
    }
    assert [v["rows"] for v in found["versions"]] == [75, 25]
    assert set(found["versions"][0]["latency_ms"]) == {"min", "p50", "p90", "p99", "max"}
    score, label, embedding = found["outputs"]
    assert (score["agree"], score["compared"], score["tolerance"]) == (
        86,
        96,
        {"atol": 1e-6, "rtol": 0.0},
    )
    assert len(score["histogram"]["edges"]) == 17 and sum(score["histogram"]["counts"]) == 96
    assert score["outside_tolerance"]["total"] == 10
    assert score["outside_tolerance"]["rows"][0] == {
        "chunk_id": "c1",
        "row_index": 47,
        "id": 97,
        "production": pytest.approx(9.7),
        "candidate": pytest.approx(12.2),
        "abs_difference": pytest.approx(2.5),
    }
    assert label["flipped"]["total"] == 10
    assert label["flipped"]["rows"][0] == {
        "chunk_id": "c0",
        "row_index": 7,
        "id": 7,
        "production": 1,
        "candidate": 2,
    }
    assert sum(p["rows"] for p in label["confusion"]["pairs"]) == 96
    assert set(embedding) >= {"abs_difference", "cosine", "outside_tolerance"}
    assert "histogram" not in embedding and "confusion" not in embedding


# --- the command ------------------------------------------------------------------------------

CONFIG = """\
[source]
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topic = "rows"
group_id = "g"

[model]
url = "127.0.0.1:8001"
name = "scorer"
{candidate}
[binding]
inputs = {{ x = "X" }}
outputs = {{ SCORE = "score", LABEL = "label", EMB = "embedding" }}
passthrough = {{ id = "int64" }}

[sink]
{sink}
table = "scores"
"""
SHADOW = '\n[model.candidate]\nmode = "shadow"\nversion = "2"\n'


def config_file(tmp_path: Path, *, candidate: str = SHADOW, sink: str = "") -> Path:
    path = tmp_path / "consumer.toml"
    sink = sink or f'kind = "sqlite"\npath = "{tmp_path / "results.sqlite"}"'
    path.write_text(CONFIG.format(candidate=candidate, sink=sink))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli.main(["compare", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_default_table(tmp_path: Path) -> None:
    assert comparison_table(load_config(config_file(tmp_path))) == TABLE
    assert comparison_table(load_config(config_file(tmp_path, candidate=""))) == TABLE
    own = SHADOW + 'table = "shadow_v2"\n'
    assert comparison_table(load_config(config_file(tmp_path, candidate=own))) == "shadow_v2"


async def test_the_report_and_its_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await write_sqlite(tmp_path / "results.sqlite")
    config = config_file(tmp_path)
    report = tmp_path / "report.json"
    code, out, err = run(capsys, "--config", config, "--tolerance", "score=0.3", "--json", report)
    assert (code, err) == (0, "")
    assert out.startswith(
        f"comparison table {TABLE} in SQLite database {tmp_path}/results.sqlite\n"
    )
    assert "agreement 90.62%: 87 of 96" in out
    figures = json.loads(report.read_text())
    assert figures["outputs"][0]["agree"] == 87
    assert figures["outputs"][0]["tolerance"] == {"atol": 0.3, "rtol": 0.0}
    code, out, _ = run(capsys, "--config", config, "--json", "-", "--flipped", "1")
    assert code == 0
    only = json.loads(out)  # JSON alone on stdout
    assert len(only["outputs"][1]["flipped"]["rows"]) == 1


async def test_a_parquet_sinks_comparison_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await write_parquet(tmp_path / TABLE)
    sink = f'kind = "parquet"\nurl = "{tmp_path / "scores"}"'
    code, out, err = run(capsys, "--config", config_file(tmp_path, sink=sink))
    assert (code, err) == (0, "")
    assert out.startswith(f"comparison table {TABLE} in Parquet dataset {tmp_path}/{TABLE}\n")
    assert "100 rows compared; the candidate failed on 4 (4.00%)" in out


async def test_an_empty_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    await write_sqlite(tmp_path / "results.sqlite", rows=False)
    report = tmp_path / "report.json"
    code, out, _ = run(capsys, "--config", config_file(tmp_path), "--json", report)
    assert code == 0
    where = f"{TABLE} in SQLite database {tmp_path}/results.sqlite"
    assert out == f"comparison table {where}: no rows compared yet\n"
    assert json.loads(report.read_text())["rows"] == 0


async def test_errors_and_their_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_file(tmp_path)
    db = tmp_path / "results.sqlite"
    code, _, err = run(capsys, "--config", config)
    assert code == 2
    assert (
        err
        == f"error: no table {TABLE} in SQLite database {db}: the database file does not exist\n"
    )
    await write_sqlite(db)
    assert run(capsys, "--config", config, "--table", "other")[::2] == (
        2,
        f"error: no table other in SQLite database {db}\n",
    )
    code, _, err = run(capsys, "--config", config, "--tolerance", "score=abc")
    assert code == 2 and err.startswith("error: --tolerance 'score=abc': give COLUMN=ATOL")
    code, _, err = run(capsys, "--config", config, "--tolerance", "label=0.5")
    assert code == 2 and "--tolerance label: not a float or vector output" in err
    assert run(capsys, "--config", config, "--flipped", "-1")[::2] == (
        2,
        "error: --flipped must be >= 0\n",
    )
    code, _, err = run(capsys, "--config", tmp_path / "absent.toml")
    assert code == 2 and "absent.toml does not exist" in err
    results = SqliteSink(db)  # a result table, not a comparison
    await results.open(RESULTS)
    await results.close()
    code, _, err = run(capsys, "--config", config, "--table", "scores")
    assert code == 2 and err.startswith(
        f"error: scores in SQLite database {db}: not a comparison table"
    )
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"not a database at all" * 100)
    sink = f'kind = "sqlite"\npath = "{broken}"'
    code, _, err = run(capsys, "--config", config_file(tmp_path, sink=sink))
    assert code == 1 and err.startswith(
        f"error: reading {TABLE} in SQLite database {broken} failed"
    )


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(["compare", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: rowbatch-consumer compare [-h] [--config FILE] [--table NAME]")
    assert "exit codes: 0 the report was printed" in text and "``" not in text
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "compare --config FILE [--table NAME]" in capsys.readouterr().out
