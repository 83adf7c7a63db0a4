"""``python -m bench server_admission``'s record (issue 48): each mode's median and range over
its rounds, the admitted/fixed ratios, the totals of rows lost, the tables and the JSON. No
services: rounds are made up here."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from bench import cli, server_admission
from bench.server_admission_report import (
    Failed,
    LeaveJoin,
    Mode,
    Params,
    Round,
    ServerAdmission,
    ratios,
    spreads,
    totals,
)

CEILING = 6_400.0
PARAMS = Params(
    consumers=3,
    instances=2,
    base_ms=80.0,
    max_batch_size=256,
    ceiling_rows_per_s=CEILING,
    rows_per_round=81_920,
    rows_per_message=512,
    read_ahead=6,
    measure_s=3.0,
    settle_s=2.0,
    adapt_interval_s=0.25,
    max_wait_ms=20.0,
    repeat=3,
)


def round_(mode: Mode, index: int, rows_per_s: float, queue_ms: float, **kw: Any) -> Round:
    values: dict[str, Any] = {
        "mode": mode,
        "index": index,
        "rows_per_s": rows_per_s,
        "of_ceiling": rows_per_s / CEILING,
        "queue_ms": queue_ms,
        "waiting": queue_ms / 40.0,
        "window_sum": 12.0 if mode == "fixed" else 6.0,
        "in_flight_sum": 11.5 if mode == "fixed" else 5.5,
        "cpu_s_per_1k_rows": 0.02,
        "span_rows_written": 19_200,
        "rows_left_after_span": 40_000,
        "rows_expected": 81_920,
        "rows_distinct": 81_920,
        "rows_lost": 0,
        "duplicate_rows": 0,
        "skipped_duplicates": 0,
        "dead_letters": 0,
        "windows": (4.0, 4.0, 4.0) if mode == "fixed" else (2.0, 2.0, 2.0),
        "saturated": (0.0, 0.0, 0.0) if mode == "fixed" else (1.0, 1.0, 1.0),
    }
    values.update(kw)
    return Round(**values)


ROUNDS = (
    round_("fixed", 1, 6_300.0, 400.0),
    round_("admitted", 1, 6_250.0, 200.0),
    round_("fixed", 2, 6_200.0, 410.0),
    round_("admitted", 2, 6_350.0, 180.0),
    round_("fixed", 3, 6_350.0, 390.0),
    round_("admitted", 3, 6_300.0, 240.0),
)

MOVES = LeaveJoin(
    settled_rows_per_s=6_300.0,
    settled_queue_ms=200.0,
    settled_windows=(2.0, 2.0, 3.0),
    settled_window_mean=6.5,
    left_rows_per_s=6_280.0,
    left_queue_ms=190.0,
    left_windows=(3.0, 4.0),
    left_window_mean=6.8,
    reconverge_s=2.4,
    joined_rows_per_s=6_310.0,
    joined_queue_ms=210.0,
    joined_windows=(2.0, 3.0, 2.0),
    joined_window_mean=7.2,
    rows_left_after_span=10_000,
    rows_expected=245_760,
    rows_lost=0,
    duplicate_rows=0,
    dead_letters=0,
)


def test_each_mode_gets_the_median_and_range_of_its_own_rounds() -> None:
    by_mode = spreads(ROUNDS)
    assert by_mode["fixed"]["rows_per_s"].median == 6_300.0
    assert (by_mode["fixed"]["rows_per_s"].low, by_mode["fixed"]["rows_per_s"].high) == (
        6_200.0,
        6_350.0,
    )
    assert by_mode["admitted"]["queue_ms"].median == 200.0
    assert by_mode["admitted"]["queue_ms"].values == (200.0, 180.0, 240.0)
    assert by_mode["fixed"]["window_sum"].median == 12.0


def test_the_ratios_are_admitted_median_over_fixed_median() -> None:
    got = ratios(spreads(ROUNDS))
    assert got["queue_ms"] == pytest.approx(200.0 / 400.0)
    assert got["rows_per_s"] == pytest.approx(6_300.0 / 6_300.0)
    assert got["window_sum"] == pytest.approx(0.5)


def test_a_ratio_is_none_without_both_modes_or_over_a_zero() -> None:
    only_fixed = spreads(ROUNDS[::2])
    assert "admitted" not in only_fixed
    assert set(ratios(only_fixed).values()) == {None}
    zero = (round_("fixed", 1, 6_000.0, 0.0), round_("admitted", 1, 6_000.0, 10.0))
    assert ratios(spreads(zero))["queue_ms"] is None


def test_losses_and_duplicates_are_summed_per_mode_and_make_the_run_unclean() -> None:
    bad = (*ROUNDS, round_("admitted", 4, 6_000.0, 200.0, rows_lost=3, duplicate_rows=2))
    count = totals(bad)
    assert count["fixed"] == {
        "rows_lost": 0,
        "duplicate_rows": 0,
        "skipped_duplicates": 0,
        "dead_letters": 0,
    }
    assert count["admitted"]["rows_lost"] == 3
    assert count["admitted"]["duplicate_rows"] == 2
    assert ServerAdmission(PARAMS, ROUNDS, leave_join=MOVES).clean
    assert not ServerAdmission(PARAMS, bad, leave_join=MOVES).clean
    lost_moves = dataclasses.replace(MOVES, dead_letters=1)
    assert not ServerAdmission(PARAMS, ROUNDS, leave_join=lost_moves).clean


def test_a_failed_round_or_phase_is_recorded_and_makes_the_run_unclean() -> None:
    failed = ServerAdmission(
        PARAMS, ROUNDS[:5], (Failed("admitted", 3, "TimeoutError: every row"),), MOVES
    )
    assert not failed.clean
    assert "FAILED admitted round 3: TimeoutError: every row" in failed.render()
    no_moves = ServerAdmission(PARAMS, ROUNDS, leave_join_error="RuntimeError: boom")
    assert not no_moves.clean
    assert "RuntimeError: boom" in no_moves.render()


def test_the_summary_table_shows_medians_spreads_and_ratios() -> None:
    rendered = ServerAdmission(PARAMS, ROUNDS, leave_join=MOVES).summary_table().render()
    (line,) = [ln for ln in rendered.splitlines() if ln.strip().startswith("queue ms")]
    assert line.split()[-5:] == ["400", "390..410", "200", "180..240", "0.50"]
    (line,) = [ln for ln in rendered.splitlines() if ln.strip().startswith("server rows/s")]
    assert "6,200..6,350" in line
    assert "ceiling 6,400 rows/s" in rendered
    assert "3 fixed and 3 admitted rounds" in rendered


def test_the_rounds_table_lists_each_round_in_order() -> None:
    rendered = ServerAdmission(PARAMS, ROUNDS).rounds_table().render()
    names = [
        ln.split()[0] + ln.split()[1]
        for ln in rendered.splitlines()
        if ln[2:7] in {"fixed", "admit"}
    ]
    assert names == ["fixed1", "admitted1", "fixed2", "admitted2", "fixed3", "admitted3"]
    assert "0/0/0" in rendered


def test_the_leave_join_table_shows_each_phase_and_the_time_back() -> None:
    rendered = ServerAdmission(PARAMS, ROUNDS, leave_join=MOVES).render()
    assert "one left (2)" in rendered
    assert "7 (3 4)" in rendered  # the two left took the leaver's places
    assert "2.4 s" in rendered
    assert "<= 8" in rendered  # settled sum 7 + 1
    never = dataclasses.replace(MOVES, reconverge_s=None)
    assert "not within the limit" in ServerAdmission(PARAMS, ROUNDS, leave_join=never).render()
    assert ServerAdmission(PARAMS, ROUNDS).leave_join_table() is None


def test_the_json_holds_header_params_rounds_summary_and_ratios() -> None:
    head = {"command": "python -m bench server_admission", "git_commit": "abc"}
    record = ServerAdmission(PARAMS, ROUNDS, leave_join=MOVES).to_json(head)
    again = json.loads(json.dumps(record))
    assert again["git_commit"] == "abc"
    assert again["params"]["ceiling_rows_per_s"] == CEILING
    assert len(again["rounds"]) == 6
    assert again["rounds"][1]["mode"] == "admitted"
    assert again["summary"]["fixed"]["queue_ms"] == {"median": 400.0, "min": 390.0, "max": 410.0}
    assert again["admitted_over_fixed"]["queue_ms"] == pytest.approx(0.5)
    assert again["leave_join"]["reconverge_s"] == 2.4
    assert again["clean"] is True


def test_the_subcommand_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(server_admission, "main", fake_main)
    assert cli.main(["server_admission", "--repeat", "2"]) == 0
    assert seen == [["--repeat", "2"]]
