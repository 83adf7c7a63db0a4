"""``python -m bench share``'s record: the rotation of the configurations, a drain's samples
(each process's first row, the middle rate), a run's derived figures and checks, each
configuration's median, range and ratios, how the rows were spread among the processes, the
tables and the JSON. No services: samples and runs are made up here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import cli, share
from bench.share_report import (
    CLASSIC_ONE,
    CONFIGS,
    SHARE_ONE,
    Config,
    Failed,
    Params,
    Process,
    Run,
    Sample,
    ShareBench,
    first_rows,
    middle_rate,
    order,
    ratio_to,
    share_spread,
    spreads,
    totals,
)
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint

ROWS = 150_000
PARAMS = Params(
    rows=ROWS,
    record_rows=100,
    producer_batch_records=4,
    model="share_fixed",
    base_ms=50.0,
    instances=8,
    batch_rows=200,
    max_in_flight=1,
    max_wait_ms=20.0,
    members=2,
    max_poll_records=8,
    lock_s=30.0,
    settle_s=3.0,
    sample_s=0.2,
    repeat=2,
    cores=2,
)


def run_(
    config: Config,
    index: int,
    drain_s: float,
    shares: tuple[float, ...] | None = None,
    **kw: Any,
) -> Run:
    n = config.processes
    if shares is None:
        shares = (1.0,) + (0.0,) * (n - 1) if config.kind == "classic" else (1 / n,) * n
    rows = [round(ROWS * s) for s in shares]
    rows[0] += ROWS - sum(rows)
    values: dict[str, Any] = {
        "kind": config.kind,
        "processes": n,
        "index": index,
        "position": order(index).index(config) + 1,
        "rows": ROWS,
        "produce_s": 1.0,
        "drain_s": drain_s,
        "middle_rows_per_s": ROWS / drain_s * 1.05,
        "per_process": tuple(
            Process(r, r // 100 if config.kind == "share" else 0, 0.4 if r else None, r * 30e-6)
            for r in rows
        ),
        "machine_busy": 0.4,
        "server_busy": 0.1 * n,
        "server_requests": ROWS // 200,
        "server_execution_ms": 51.0,
        "server_queue_ms": 0.2,
        "in_table": ROWS,
        "distinct": ROWS,
        "redelivered": 0,
        "refused_acks": 0,
        "dead_letters": 0,
    }
    values.update(kw)
    return Run(**values)


def bench_runs() -> tuple[Run, ...]:
    drains = {
        SHARE_ONE: (40.0, 42.0),
        Config("share", 2): (20.0, 21.0),
        Config("share", 4): (12.0, 12.5),
        CLASSIC_ONE: (40.0, 40.0),
        Config("classic", 4): (41.0, 41.0),
    }
    out: list[Run] = []
    for index in (1, 2):
        for config in order(index):
            shares = (0.27, 0.25, 0.25, 0.23) if config == Config("share", 4) else None
            out.append(run_(config, index, drains[config][index - 1], shares))
    return tuple(out)


def test_each_round_rotates_the_configurations() -> None:
    assert order(1) == CONFIGS
    assert order(2) == (*CONFIGS[1:], CONFIGS[0])
    assert order(len(CONFIGS) + 1) == CONFIGS
    firsts = {order(i)[0] for i in range(1, len(CONFIGS) + 1)}
    assert firsts == set(CONFIGS)
    assert [c.label for c in CONFIGS] == [
        "share x1",
        "share x2",
        "share x4",
        "classic x1",
        "classic x4",
    ]


def test_first_rows_is_when_each_process_was_first_seen_writing() -> None:
    samples = [
        Sample(0.2, (0, 0, 0)),
        Sample(0.4, (100, 0, 0)),
        Sample(0.6, (300, 200, 0)),
        Sample(0.8, (500, 400, 0)),
    ]
    assert first_rows(samples, 3) == (0.4, 0.6, None)
    assert first_rows([], 2) == (None, None)


def test_the_middle_rate_runs_from_10_to_90_percent_of_the_rows() -> None:
    samples = [Sample(t / 10, (t * 100.0,)) for t in range(0, 101)]  # 1,000 rows/s
    assert middle_rate(samples, 10_000) == pytest.approx(1_000.0)
    # Two processes: their sum counts.
    two = [Sample(t / 10, (t * 50.0, t * 50.0)) for t in range(0, 101)]
    assert middle_rate(two, 10_000) == pytest.approx(1_000.0)
    # Never reaching 90 %, or both marks in one sample: no rate.
    assert middle_rate(samples[:50], 10_000) is None
    assert middle_rate([Sample(0.0, (0,)), Sample(1.0, (10_000,))], 10_000) is None


def test_a_run_derives_its_rate_shares_cpu_and_cycle() -> None:
    r = run_(Config("share", 4), 1, 12.0, (0.4, 0.3, 0.2, 0.1))
    assert r.rows_per_s == pytest.approx(12_500.0)
    assert r.shares == pytest.approx((0.4, 0.3, 0.2, 0.1))
    assert r.working == 4
    assert r.cpu_us_per_row == pytest.approx(30.0)
    # 200-row requests, 4 processes each at 3,125 rows/s: 64 ms a request.
    assert r.cycle_ms(200) == pytest.approx(64.0)
    idle = run_(Config("classic", 4), 1, 40.0)
    assert idle.working == 1
    assert idle.shares == (1.0, 0.0, 0.0, 0.0)
    assert idle.cycle_ms(200) == pytest.approx(200 / 3_750 * 1e3)


def test_a_lost_a_doubled_row_or_a_dead_letter_makes_the_run_unclean() -> None:
    config = Config("share", 2)
    assert run_(config, 1, 20.0).clean
    lost = run_(config, 1, 20.0, distinct=ROWS - 3, in_table=ROWS - 3)
    assert (lost.lost, lost.twice, lost.clean) == (3, 0, False)
    doubled = run_(config, 1, 20.0, in_table=ROWS + 2)
    assert (doubled.lost, doubled.twice, doubled.clean) == (0, 2, False)
    assert not run_(config, 1, 20.0, dead_letters=1).clean
    # Rows written twice (a redelivery's no-op rewrite) are work done again, not a failure.
    first = Process(ROWS // 2 + 800, 758, 0.4, 2.0)
    second = Process(ROWS // 2, 750, 0.4, 2.0)
    rewrite = run_(config, 1, 20.0, per_process=(first, second), redelivered=8)
    assert (rewrite.rewritten, rewrite.clean) == (800, True)
    bench = ShareBench(PARAMS, (run_(config, 1, 20.0), lost))
    assert not bench.clean
    assert "ROW CHECK FAILED share x2 round 1: 3 lost" in bench.render()
    failed = ShareBench(PARAMS, (run_(config, 1, 20.0),), (Failed("share", 4, 1, "boom"),))
    assert not failed.clean
    assert "FAILED share x4 round 1: boom" in failed.render()


def test_each_configuration_gets_the_median_and_range_of_its_own_runs() -> None:
    got = spreads(bench_runs())
    assert list(got) == list(CONFIGS)
    assert got[SHARE_ONE]["drain_s"].low == 40.0
    assert got[SHARE_ONE]["drain_s"].high == 42.0
    assert got[Config("share", 4)]["rows_per_s"].median == pytest.approx(
        (ROWS / 12.0 + ROWS / 12.5) / 2
    )
    assert spreads([]) == {}


def test_the_ratios_are_of_the_medians_and_of_each_round() -> None:
    runs = bench_runs()
    four = ratio_to(runs, Config("share", 4), SHARE_ONE)
    assert four.medians == pytest.approx((1 / 12 + 1 / 12.5) / (1 / 40 + 1 / 42))
    assert four.rounds is not None
    assert four.rounds.values == pytest.approx((40 / 12, 42 / 12.5))
    against_classic = ratio_to(runs, Config("share", 4), CLASSIC_ONE)
    assert against_classic.medians == pytest.approx((1 / 12 + 1 / 12.5) / 2 / (1 / 40))
    missing = ratio_to([r for r in runs if r.config != SHARE_ONE], Config("share", 4), SHARE_ONE)
    assert (missing.medians, missing.rounds) == (None, None)
    # A round whose baseline failed is left out of the per-round ratios.
    partial = [r for r in runs if not (r.config == SHARE_ONE and r.index == 2)]
    got = ratio_to(partial, Config("share", 4), SHARE_ONE).rounds
    assert got is not None
    assert got.values == pytest.approx((40 / 12,))


def test_the_share_spread_gives_the_largest_and_smallest_process_and_the_idle_ones() -> None:
    runs = bench_runs()
    four = share_spread(runs, Config("share", 4))
    assert four is not None
    assert (four.largest.low, four.largest.high) == pytest.approx((0.27, 0.27))
    assert (four.smallest.low, four.smallest.high) == pytest.approx((0.23, 0.23))
    assert four.idle_processes == 0
    assert four.last_first_row_s is not None
    classic = share_spread(runs, Config("classic", 4))
    assert classic is not None
    assert classic.largest.median == 1.0
    assert classic.smallest.median == 0.0
    assert classic.idle_processes == 6
    assert classic.last_first_row_s is None  # three of its processes never wrote
    assert share_spread([], SHARE_ONE) is None


def test_totals_sum_the_checks_of_a_configurations_runs() -> None:
    runs = [
        run_(SHARE_ONE, 1, 40.0, redelivered=4, refused_acks=1),
        run_(SHARE_ONE, 2, 40.0, redelivered=2),
        run_(CLASSIC_ONE, 1, 40.0),
    ]
    got = totals(runs, SHARE_ONE)
    assert got == {
        "lost": 0,
        "twice": 0,
        "dead_letters": 0,
        "rewritten": 0,
        "redelivered": 6,
        "refused_acks": 1,
    }


def test_the_summary_table_shows_each_configuration_against_one_consumer() -> None:
    table = ShareBench(PARAMS, bench_runs()).summary_table()
    labels = [row[0] for row in table.rows]
    assert labels == [c.label for c in CONFIGS]
    by_label = {row[0]: dict(zip(table.columns, row, strict=False)) for row in table.rows}
    assert by_label["share x1"]["x N=1"] == "1.00"
    assert by_label["share x4"]["x N=1"] == f"{(1 / 12 + 1 / 12.5) / (1 / 40 + 1 / 42):.2f}"
    assert by_label["classic x4"]["largest share"] == "100%..100%"
    assert by_label["classic x4"]["smallest share"] == "0%..0%"
    assert by_label["share x4"]["lost/twice/dlq"] == "0/0/0"
    text = table.render()
    assert "one partition, 150,000 rows" in text
    assert "fixed_latency 50 ms per execution on 8 instances" in text
    assert "one process <= 4,000 rows/s" in text
    assert "ceiling 32,000 rows/s" in text


def test_the_runs_table_lists_each_run_in_the_order_run() -> None:
    runs = bench_runs()
    table = ShareBench(PARAMS, runs).runs_table()
    assert [row[0] for row in table.rows] == [
        f"{r.index}.{r.position} {r.config.label}" for r in runs
    ]
    assert table.rows[0][0] == "1.1 share x1"
    four = next(row for row in table.rows if row[0].endswith("share x4"))
    assert "27.0% / 25.0% / 25.0% / 23.0%" in four
    assert all(row[-1] == "ok" for row in table.rows)


def test_the_json_holds_header_params_runs_and_summary() -> None:
    bench = ShareBench(PARAMS, bench_runs(), (Failed("share", 2, 3, "boom"),))
    got = json.loads(json.dumps(bench.to_json({"command": "x", "machine": {"cores": 2}})))
    assert got["command"] == "x"
    assert got["params"]["one_consumer_bound_rows_per_s"] == pytest.approx(4_000.0)
    assert got["params"]["server_ceiling_rows_per_s"] == pytest.approx(32_000.0)
    assert got["clean"] is False
    assert got["failed"] == [{"kind": "share", "processes": 2, "index": 3, "error": "boom"}]
    assert set(got["summary"]) == {c.label for c in CONFIGS}
    four = got["summary"]["share x4"]
    assert four["rows_per_s"]["min"] == pytest.approx(ROWS / 12.5)
    assert four["x_same_kind_one"] == pytest.approx((1 / 12 + 1 / 12.5) / (1 / 40 + 1 / 42))
    assert four["largest_share"]["max"] == pytest.approx(0.27)
    assert got["summary"]["classic x4"]["idle_processes"] == 6
    assert len(got["runs"]) == 10
    first = got["runs"][0]
    assert first["config"] == "share x1"
    assert first["clean"] is True
    assert first["shares"] == [1.0]


def test_the_configurations_sources_and_model() -> None:
    rig = share.Rig(
        kafka=KafkaEndpoint("127.0.0.1:9092", Path("/tmp/k"), 1),
        postgres=PostgresEndpoint("127.0.0.1", 5432, "rowbatch", "rowbatch"),
        triton_url="127.0.0.1:8001",
        workdir=Path("/tmp/w"),
    )
    shared = share.consumer_config(rig, "share", "t", "g", "tbl")
    assert shared["source"] == {
        "kind": "kafka-share",
        "bootstrap_servers": "127.0.0.1:9092",
        "topic": "t",
        "group_id": "g",
        "dead_letter_topic": "t.dlq",
        "members": 2,
        "max_poll_records": 8,
        "lock_duration_s": 30.0,
    }
    assert shared["model"] == {
        "url": "127.0.0.1:8001",
        "name": "share_fixed",
        "batch_size": 200,
        "max_in_flight": 1,
        "adapt": False,
        "max_wait_ms": 20.0,
    }
    classic = share.consumer_config(rig, "classic", "t", "g", "tbl")
    assert classic["source"]["kind"] == "kafka"
    assert "members" not in classic["source"]
    assert classic["sink"]["table"] == "tbl"


def test_rows_must_be_whole_records() -> None:
    with pytest.raises(SystemExit):
        share.parse_args(["--rows", "1050"])
    with pytest.raises(SystemExit):
        share.parse_args(["--rows", "500"])
    with pytest.raises(SystemExit):
        share.parse_args(["--repeat", "0"])
    assert share.parse_args([]).rows == 150_000
    assert share.parse_args([]).repeat == 3


def test_the_subcommand_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(share, "main", fake_main)
    assert cli.main(["share", "--repeat", "2"]) == 0
    assert seen == [["--repeat", "2"]]
