"""``python -m bench rollout``'s record: the middle span of a drain (rate, fit, CPU, machine
busy), the rotation of the modes, each mode's median and range, its ratios to ``off`` (of the
medians and round by round), the verdict on the 95 % target, the totals, the tables and the
JSON. No services: samples and rounds are made up here."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from bench import cli, rollout
from bench.rollout_report import (
    MODES,
    Failed,
    Mode,
    Params,
    Rollout,
    Round,
    Sample,
    order,
    over_off,
    slope,
    span_of,
    spreads,
    totals,
    verdict,
)

CEILING = 5_120.0
ROWS = 61_440
PARAMS = Params(
    model="rollout_prod",
    candidate="rollout_cand",
    base_ms=50.0,
    max_batch_size=256,
    instances=1,
    ceiling_rows_per_s=CEILING,
    rows_per_round=ROWS,
    rows_per_message=512,
    backlog_rows=8192,
    canary_share=0.1,
    span_low=0.2,
    span_high=0.9,
    sample_s=0.1,
    repeat=3,
)


def round_(mode: Mode, index: int, rows_per_s: float, cpu: float, **kw: Any) -> Round:
    shadow = mode.startswith("shadow")
    values: dict[str, Any] = {
        "mode": mode,
        "index": index,
        "position": order(index).index(mode) + 1,
        "rows_per_s": rows_per_s,
        "fit_rows_per_s": rows_per_s + 5.0,
        "of_ceiling": rows_per_s / CEILING,
        "span_s": 8.6,
        "span_rows": 43_008,
        "cpu_s_per_1k_rows": cpu,
        "machine_busy": 0.3,
        "prod_busy": 1.0,
        "prod_queue_ms": 49.0,
        "cand_busy": 1.0 if mode in ("shadow", "canary-10") else 0.0,
        "cand_queue_ms": 48.0 if mode in ("shadow", "canary-10") else 0.0,
        "prod_requests": 168,
        "cand_requests": 168 if mode in ("shadow", "canary-10") else 0,
        "drain_s": 12.5,
        "shadow_lag_s": 0.1 if shadow else None,
        "production_rows": 0 if mode == "off" else ROWS,
        "candidate_answered": {"shadow": ROWS, "canary-10": 6_100}.get(mode, 0),
        "candidate_skipped": ROWS if mode == "shadow-down" else 0,
        "candidate_failed": 0,
        "candidate_unwritten": 0,
        "candidate_dropped": 0,
        "compared_rows": (ROWS if mode == "shadow" else 0) if shadow else None,
        "candidate_rows": 6_100 if mode == "canary-10" else 0,
        "arm_mismatches": 0,
        "rows_expected": ROWS,
        "rows_distinct": ROWS,
        "rows_lost": 0,
        "duplicate_rows": 0,
        "dead_letters": 0,
    }
    values.update(kw)
    return Round(**values)


# off, shadow, shadow-down, canary-10 in rounds 1-3: shadow at 0.99, 1.01, 0.96 of off.
RATES: dict[Mode, tuple[float, float, float]] = {
    "off": (5_000.0, 4_900.0, 5_000.0),
    "shadow": (4_950.0, 4_949.0, 4_800.0),
    "shadow-down": (4_990.0, 4_890.0, 4_980.0),
    "canary-10": (4_980.0, 4_900.0, 4_990.0),
}
CPU: dict[Mode, tuple[float, float, float]] = {
    "off": (0.020, 0.022, 0.024),
    "shadow": (0.034, 0.036, 0.035),
    "shadow-down": (0.021, 0.022, 0.023),
    "canary-10": (0.033, 0.034, 0.036),
}
ROUNDS = tuple(
    round_(mode, i, RATES[mode][i - 1], CPU[mode][i - 1]) for i in (1, 2, 3) for mode in order(i)
)


def sample(at: float, written: float, cpu_s: float = 0.0, busy: int = 0, ticks: int = 0) -> Sample:
    return Sample(at, cpu_s, written, busy, ticks)


def test_each_round_rotates_the_modes_so_none_always_goes_first() -> None:
    assert order(1) == ("off", "shadow", "shadow-down", "canary-10")
    assert order(2) == ("shadow", "shadow-down", "canary-10", "off")
    assert order(4) == ("canary-10", "off", "shadow", "shadow-down")
    assert order(5) == order(1)
    assert {order(i)[0] for i in range(1, 5)} == set(MODES)


def test_the_span_runs_from_the_first_sample_at_20_to_the_first_at_90_percent() -> None:
    # 1,000 rows; 100 rows and 0.01 CPU s per 0.1 s; the machine 50 % busy.
    samples = [
        sample(0.1 * i, 100.0 * i, cpu_s=0.01 * i, busy=5 * i, ticks=10 * i) for i in range(11)
    ]
    span = span_of(samples, 1_000, 0.2, 0.9)
    assert span.seconds == pytest.approx(0.7)  # samples 2 (200 rows) to 9 (900 rows)
    assert span.rows == 700.0
    assert span.rows_per_s == pytest.approx(1_000.0)
    assert span.fit_rows_per_s == pytest.approx(1_000.0)
    assert span.cpu_s == pytest.approx(0.07)
    assert span.cpu_s_per_1k_rows == pytest.approx(0.1)
    assert span.machine_busy == pytest.approx(0.5)


def test_the_span_takes_the_samples_past_each_mark_and_the_fit_evens_out_steps() -> None:
    # Writes of 300 rows every 0.3 s, sampled every 0.1 s: the ends land on steps.
    samples = [sample(0.1 * i, 300.0 * (i // 3)) for i in range(40)]
    span = span_of(samples, 3_000, 0.2, 0.9)
    assert span.rows == 2_100.0  # 600 rows at 0.6 s to 2,700 at 2.7 s
    assert span.seconds == pytest.approx(2.1)
    assert span.fit_rows_per_s == pytest.approx(1_000.0, rel=0.05)
    assert span.machine_busy == 0.0  # no ticks read


def test_a_drain_too_short_for_its_samples_has_no_span() -> None:
    with pytest.raises(ValueError, match="no span from 20% to 90%"):
        span_of([sample(0.0, 0.0), sample(0.1, 1_000.0)], 1_000, 0.2, 0.9)
    with pytest.raises(ValueError, match="more --rows"):
        span_of([sample(0.0, 0.0), sample(0.1, 500.0)], 1_000, 0.2, 0.9)


def test_the_slope_is_least_squares_and_zero_without_two_instants() -> None:
    assert slope([(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]) == pytest.approx(2.0)
    assert slope([(0.0, 0.0), (1.0, 1.0), (2.0, 1.0), (3.0, 3.0)]) == pytest.approx(0.9)
    assert slope([(1.0, 1.0)]) == 0.0
    assert slope([(1.0, 1.0), (1.0, 2.0)]) == 0.0


def test_each_mode_gets_the_median_and_range_of_its_own_rounds() -> None:
    by_mode = spreads(ROUNDS)
    s = by_mode["shadow"]["rows_per_s"]
    assert (s.median, s.low, s.high) == (4_949.0, 4_800.0, 4_950.0)
    assert by_mode["off"]["cpu_s_per_1k_rows"].median == 0.022
    assert by_mode["shadow"]["of_ceiling"].median == pytest.approx(4_949.0 / CEILING)


def test_the_ratios_to_off_are_of_the_medians_and_of_each_round() -> None:
    got = over_off(ROUNDS)
    assert got["off"].rows_per_s == 1.0
    shadow = got["shadow"]
    assert shadow.rows_per_s == pytest.approx(4_949.0 / 5_000.0)
    assert shadow.rows_per_s_rounds is not None
    assert shadow.rows_per_s_rounds.values == pytest.approx((0.99, 4_949 / 4_900, 0.96))
    assert shadow.cpu == pytest.approx(0.035 / 0.022)
    assert shadow.cpu_rounds is not None
    assert shadow.cpu_rounds.low == pytest.approx(0.035 / 0.024)


def test_without_off_there_is_no_ratio_and_no_verdict() -> None:
    no_off = tuple(r for r in ROUNDS if r.mode != "off")
    got = over_off(no_off)
    assert "off" not in got
    assert got["shadow"].rows_per_s is None and got["shadow"].rows_per_s_rounds is None
    v = verdict(no_off)
    assert v.met is None
    assert v.line().endswith("not measured")


def test_a_round_whose_off_is_missing_is_left_out_of_the_per_round_ratios() -> None:
    partial = tuple(r for r in ROUNDS if not (r.mode == "off" and r.index == 3))
    each = over_off(partial)["shadow"].rows_per_s_rounds
    assert each is not None
    assert each.values == pytest.approx((0.99, 4_949 / 4_900))


def test_the_verdict_is_the_ratio_of_medians_against_95_percent() -> None:
    v = verdict(ROUNDS)
    assert v.ratio == pytest.approx(4_949.0 / 5_000.0)
    assert v.met is True
    assert v.rounds_met == 3  # 0.99, 1.01 and 0.96
    assert v.line() == (
        "target: shadow rows/s >= 95% of off: 99.0% (ratio of medians); per round "
        "96.0%..101.0%, met in 3 of 3: MET"
    )


def test_the_verdict_misses_below_95_percent_and_counts_the_rounds_that_met() -> None:
    slow = tuple(
        round_(r.mode, r.index, r.rows_per_s * 0.9, r.cpu_s_per_1k_rows)
        if r.mode == "shadow" and r.index != 2
        else r
        for r in ROUNDS
    )
    v = verdict(slow)
    assert v.ratio == pytest.approx(4_455.0 / 5_000.0)
    assert v.met is False
    assert v.rounds_met == 1
    assert v.line().endswith("met in 1 of 3: MISSED")


def test_totals_sum_the_counters_per_mode_and_compared_rows_for_shadows() -> None:
    count = totals(ROUNDS)
    assert count["shadow"]["candidate_answered"] == 3 * ROWS
    assert count["shadow"]["compared_rows"] == 3 * ROWS
    assert count["shadow-down"]["candidate_skipped"] == 3 * ROWS
    assert count["shadow-down"]["compared_rows"] == 0
    assert "compared_rows" not in count["off"]
    assert "compared_rows" not in count["canary-10"]
    assert count["canary-10"]["candidate_rows"] == 3 * 6_100


def test_a_loss_a_duplicate_a_wrong_arm_or_a_failed_round_makes_the_run_unclean() -> None:
    assert Rollout(PARAMS, ROUNDS).clean
    for bad in (
        {"rows_lost": 1},
        {"duplicate_rows": 2},
        {"dead_letters": 1},
        {"arm_mismatches": 3},
    ):
        spoiled = (*ROUNDS[:-1], round_("canary-10", 4, 4_900.0, 0.03, **bad))
        assert not Rollout(PARAMS, spoiled).clean
    failed = Rollout(PARAMS, ROUNDS[:-1], (Failed("shadow", 3, "TimeoutError: rows"),))
    assert not failed.clean
    assert "FAILED shadow round 3: TimeoutError: rows" in failed.render()


def test_the_summary_table_shows_each_mode_against_off() -> None:
    rendered = Rollout(PARAMS, ROUNDS).summary_table().render()
    (line,) = [ln for ln in rendered.splitlines() if ln.startswith("  shadow ")]
    cells = line.split()
    assert cells[1:6] == ["4,949", "4,800..4,950", "96.7%", "0.99", "0.96..1.01"]
    assert cells[6:9] == ["0.035", "0.034..0.036", "1.59"]
    assert cells[9:] == ["184,320/0/0", "184,320", "0/0/0/0"]
    (down,) = [ln for ln in rendered.splitlines() if ln.startswith("  shadow-down")]
    assert "0/184,320/0" in down
    assert "ceiling 5,120 rows/s each" in rendered
    assert "(off 3, shadow 3, shadow-down 3, canary-10 3)" in rendered
    assert "target: shadow rows/s >= 95% of off: 99.0% (ratio of medians)" in rendered


def test_the_rounds_table_lists_each_round_in_the_order_run() -> None:
    rendered = Rollout(PARAMS, ROUNDS).rounds_table().render()
    names = [" ".join(ln.split()[:2]) for ln in rendered.splitlines() if re.match(r"  \d\.\d ", ln)]
    assert names[:5] == ["1.1 off", "1.2 shadow", "1.3 shadow-down", "1.4 canary-10", "2.1 shadow"]
    assert names[-1] == "3.4 shadow"
    assert len(names) == 12
    assert "9.93%" in rendered  # 6,100 of 61,440 by the candidate


def test_the_json_holds_header_params_rounds_summary_ratios_and_target() -> None:
    head = {"command": "python -m bench rollout", "git_commit": "abc"}
    record = json.loads(json.dumps(Rollout(PARAMS, ROUNDS).to_json(head)))
    assert record["git_commit"] == "abc"
    assert record["params"]["ceiling_rows_per_s"] == CEILING
    assert len(record["rounds"]) == 12
    assert record["rounds"][3]["mode"] == "canary-10"
    assert record["rounds"][3]["candidate_share"] == pytest.approx(6_100 / ROWS)
    assert record["summary"]["off"]["rows_per_s"] == {
        "median": 5_000.0,
        "min": 4_900.0,
        "max": 5_000.0,
    }
    assert record["over_off"]["shadow"]["rows_per_s"] == pytest.approx(0.9898)
    assert record["over_off"]["shadow"]["rows_per_s_per_round"]["min"] == pytest.approx(0.96)
    assert record["target"]["met"] is True
    assert record["totals"]["shadow"]["compared_rows"] == 3 * ROWS
    assert record["clean"] is True


def test_each_mode_has_its_candidate() -> None:
    assert rollout.candidate("off", "127.0.0.1:1") is None
    assert rollout.candidate("shadow", "x") == {
        "mode": "shadow",
        "name": "rollout_cand",
        "backlog_rows": 8192,
    }
    assert rollout.candidate("shadow-down", "127.0.0.1:9") == {
        "mode": "shadow",
        "url": "127.0.0.1:9",
    }
    assert rollout.candidate("canary-10", "x") == {
        "mode": "canary",
        "share": 0.1,
        "name": "rollout_cand",
    }


def test_rows_must_be_whole_messages() -> None:
    with pytest.raises(SystemExit):
        rollout.parse_args(["--rows", "1000"])
    with pytest.raises(SystemExit):
        rollout.parse_args(["--repeat", "0"])
    assert rollout.parse_args([]).rows == 61_440


def test_the_subcommand_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(list(argv))
        return 0

    monkeypatch.setattr(rollout, "main", fake_main)
    assert cli.main(["rollout", "--repeat", "2"]) == 0
    assert seen == [["--repeat", "2"]]
