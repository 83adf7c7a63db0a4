"""The ``queued`` bench section (issue 24's memory target): its table, its target, and that a
run without ``--only`` leaves it out (publishing a million messages takes minutes)."""

from __future__ import annotations

from bench import cli
from bench.memory import SmallMessagesResult
from bench.queued import QueuedResult
from bench.targets import check_targets


def result(peak_mib: float) -> QueuedResult:
    return QueuedResult(
        SmallMessagesResult("kafka", 1_000_000, 64.0, 120.0, peak_mib, 40.5, 10_329.0, 96.8)
    )


def test_the_table_shows_the_peak_against_budget_plus_150_mb() -> None:
    rendered = result(191.0).table().render()
    assert "1,000,000" in rendered
    assert "207" in rendered  # 64 MiB + 150 MB = 207 MiB
    assert "10,329" in rendered


def test_the_target_is_met_within_the_limit_and_missed_past_it() -> None:
    (met,) = [t for t in check_targets({"queued": result(206.0)}) if "queued" in t.name]
    (missed,) = [t for t in check_targets({"queued": result(208.0)}) if "queued" in t.name]
    assert met.met and not missed.met
    assert missed.got == "208 MiB"


def test_it_runs_only_when_asked_for() -> None:
    assert "queued" not in cli.parse_args([]).only
    assert cli.parse_args(["--only", "queued"]).only == ("queued",)
