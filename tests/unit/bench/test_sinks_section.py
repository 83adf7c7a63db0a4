"""The ``sinks`` bench section's own logic, without services: the rotated order of the rounds,
the per-sink median and range, the ratio to PostgreSQL taken round by round, the table and the
JSON figures."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench import cli
from bench.sinks import (
    SINK_KINDS,
    SinkRun,
    SinksResult,
    ratios_to,
    round_orders,
    summarize,
)
from bench.spread import figures, spread


def _run(
    sink: str,
    round_no: int,
    rows_per_s: float,
    *,
    cpu: float = 20.0,
    files: int | None = None,
    commits: int | None = None,
    commit_s: float | None = None,
    in_sink: int = 1000,
) -> SinkRun:
    seconds = 1000 / rows_per_s
    return SinkRun(
        sink=sink,
        case=f"round {round_no}",
        round=round_no,
        position=1,
        rows=1000,
        seconds=seconds,
        written_s=seconds * 0.5,
        startup_s=3.0,
        rows_per_s=rows_per_s,
        written_rows_per_s=rows_per_s * 2,
        cpu_us_per_row=cpu,
        tail_cpu_s=0.5,
        peak_rss_mib=150.0,
        busy=0.1,
        data_files=files,
        rows_per_file=None if not files else in_sink / files,
        commits=commits,
        commit_s=commit_s,
        rows_in_sink=in_sink,
        rows_expected=1000,
    )


RUNS = (
    _run("postgres", 1, 1000.0, cpu=30.0),
    _run("parquet", 1, 2000.0, files=4),
    _run("iceberg", 1, 500.0, files=1, commits=1, commit_s=0.3),
    _run("postgres", 2, 800.0, cpu=40.0),
    _run("parquet", 2, 2000.0, files=5),
    _run("iceberg", 2, 600.0, files=2, commits=2, commit_s=0.5),
    _run("postgres", 3, 1000.0, cpu=35.0),
    _run("parquet", 3, 1500.0, files=4),
    _run("iceberg", 3, 400.0, files=1, commits=1, commit_s=0.4),
)


def test_each_sink_runs_once_in_each_position_over_three_rounds() -> None:
    orders = round_orders(SINK_KINDS, 3)
    assert orders == [
        ("postgres", "parquet", "iceberg"),
        ("parquet", "iceberg", "postgres"),
        ("iceberg", "postgres", "parquet"),
    ]
    for position in range(3):
        assert {order[position] for order in orders} == set(SINK_KINDS)
    assert round_orders(SINK_KINDS, 1) == [("postgres", "parquet", "iceberg")]
    assert len(round_orders(SINK_KINDS, 5)) == 5


def test_ratios_pair_the_runs_of_the_same_round() -> None:
    assert ratios_to(RUNS, "iceberg") == pytest.approx([0.5, 0.75, 0.4])
    assert ratios_to(RUNS, "parquet") == pytest.approx([2.0, 2.5, 1.5])
    assert ratios_to(RUNS, "parquet", written=True) == pytest.approx([2.0, 2.5, 1.5])
    # a round without PostgreSQL has no ratio
    assert ratios_to([_run("parquet", 1, 100.0)], "parquet") == []


def test_summaries_are_medians_with_their_range() -> None:
    by_sink = {s.sink: s for s in summarize(RUNS)}
    assert list(by_sink) == ["postgres", "parquet", "iceberg"]

    pg = by_sink["postgres"]
    assert (pg.rows_per_s, pg.rows_per_s_low, pg.rows_per_s_high) == (1000.0, 800.0, 1000.0)
    assert (pg.cpu_us_per_row, pg.cpu_us_per_row_low, pg.cpu_us_per_row_high) == (35, 30, 40)
    assert pg.vs_base is None and pg.data_files is None and pg.commits is None
    assert pg.runs == 3 and pg.all_in_sink

    pq = by_sink["parquet"]
    assert pq.rows_per_s == 2000.0
    assert (pq.vs_base, pq.vs_base_low, pq.vs_base_high) == pytest.approx((2.0, 1.5, 2.5))
    assert pq.data_files == 4 and pq.rows_per_file == 250.0
    assert pq.commit_s_mean is None

    ice = by_sink["iceberg"]
    assert (ice.rows_per_s, ice.rows_per_s_low, ice.rows_per_s_high) == (500.0, 400.0, 600.0)
    assert (ice.vs_base, ice.vs_base_low, ice.vs_base_high) == pytest.approx((0.5, 0.4, 0.75))
    assert ice.data_files == 1 and ice.rows_per_file == 1000.0 and ice.commits == 1
    assert ice.commit_s_mean == pytest.approx(1.2 / 4)  # every commit of every round
    assert ice.written_rows_per_s == 1000.0
    assert ice.written_vs_base == pytest.approx(0.5)  # 1000 / 2000, 1200 / 1600, 800 / 2000
    assert ice.tail_s == pytest.approx(1000 / 500 * 0.5)


def test_a_run_short_of_rows_is_flagged() -> None:
    [pg] = summarize([_run("postgres", 1, 1000.0, in_sink=999)])
    assert not pg.all_in_sink


def _result(runs: tuple[SinkRun, ...] = RUNS) -> SinksResult:
    return SinksResult(
        model="scorer",
        rows=1000,
        chunk_rows=500,
        messages=2,
        rounds=3,
        orders=tuple(round_orders(SINK_KINDS, 3)),
        target_file_mb=128.0,
        commit_interval_s=10.0,
        parquet_settings={"target_file_mb": 128.0, "commit_interval_s": 10.0},
        runs=runs,
        sinks=summarize(runs),
    )


def test_the_table_has_a_row_per_sink() -> None:
    table = _result().table()
    assert table.title.startswith("10. Result-table sinks side by side: scorer, 1,000 rows")
    assert len(table.columns) == len(table.rows[0])
    rows = {row[0]: dict(zip(table.columns, row, strict=True)) for row in table.rows}
    assert list(rows) == ["postgres", "parquet", "iceberg"]
    assert rows["postgres"]["rows/s"] == "1,000"
    assert rows["postgres"]["files"] == "-" and rows["postgres"]["commits"] == "-"
    assert len(set(table.columns)) == len(table.columns) - 1  # "range" twice
    assert rows["iceberg"]["vs postgres"] == "0.50x"
    assert rows["parquet"]["written vs pg"] == "2.00x"
    assert rows["postgres"]["vs postgres"] == "1"
    assert rows["parquet"]["rows/file"] == "250"
    assert rows["iceberg"]["s/commit"] == "0.30"
    assert all(row["in sink"] == "ok" for row in rows.values())
    rendered = table.render()
    assert "postgres > parquet > iceberg; parquet > iceberg > postgres" in rendered
    assert "Parquet [sink] extras: target_file_mb 128, commit_interval_s 10." in rendered
    older = dataclasses.replace(_result(), parquet_settings={})
    assert "extras: none (one file per write, no commits)" in older.table().render()
    short = _result((*RUNS[:-1], _run("iceberg", 3, 400.0, files=1, in_sink=10)))
    assert "MISSING" in short.table().render()


def test_the_json_figures_name_each_run_and_each_sink() -> None:
    as_json = json.loads(json.dumps(dataclasses.asdict(_result())))
    assert [s["sink"] for s in as_json["sinks"]] == ["postgres", "parquet", "iceberg"]
    assert len(as_json["runs"]) == 9
    found = figures({"sinks": as_json})
    assert found["sinks sinks iceberg: vs_base"] == pytest.approx(0.5)
    # each round's run is a figure of its own, none overwritten by another round's
    assert {found[f"sinks runs postgres round {r}: rows_per_s"] for r in (1, 2, 3)} == {
        1000.0,
        800.0,
    }
    assert found["sinks runs iceberg round 2: commits"] == 2.0
    # and the spread over repeated runs of the section works on them
    assert spread([{"sinks": as_json}] * 2)["sinks sinks parquet: rows_per_s"].median == 2000.0


def test_the_section_is_registered() -> None:
    assert "sinks" in cli.SECTIONS
    args = cli.parse_args(["--only", "sinks", "--quick"])
    assert args.only == ("sinks",)
