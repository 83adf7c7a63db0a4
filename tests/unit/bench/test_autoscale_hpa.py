"""The simulator's HPA model against hand-computed cases: the per-metric proposals and their
tolerance, the stabilization windows, the rate policies, the replica bounds and the
partition cap that KEDA and rowbatch's figure apply on Kafka."""

from __future__ import annotations

import random

import pytest

from bench.autoscale.hpa import (
    DEFAULT_BEHAVIOR,
    Behavior,
    Hpa,
    Policy,
    Rules,
    external_average_value,
    pods_average_value,
)
from bench.autoscale.scenarios import (
    KEDA_OVERLAY_BEHAVIOR,
    PUBSUB_OVERLAY_BEHAVIOR,
    PUBSUB_SLOW_UP_BEHAVIOR,
)
from bench.autoscale.signals import Delay, Delayed, DesiredFormula, KedaLag, Observation

NO_WINDOWS = Behavior(
    scale_up=Rules(0, (Policy("Percent", 1000, 15),)),
    scale_down=Rules(0, (Policy("Percent", 100, 15),)),
)


def test_external_average_value_is_total_over_target() -> None:
    assert external_average_value(1400, 580, current=2) == 3  # 1400/1160 = 1.21 > 1.1
    assert external_average_value(100, 580, current=3) == 1  # ceil(100/580)
    assert external_average_value(0, 580, current=3) == 0  # the HPA's min replicas lifts it


def test_external_average_value_keeps_current_within_the_tolerance() -> None:
    assert external_average_value(1200, 580, current=2) == 2  # 1200/1160 = 1.034
    assert external_average_value(1275, 580, current=2) == 2  # 1.0991: kept
    assert external_average_value(1277, 580, current=2) == 3  # 1.1009
    assert external_average_value(1045, 580, current=2) == 2  # 0.9009: kept
    assert external_average_value(1043, 580, current=2) == 2  # 0.899: ceil(1.798) = 2 anyway
    assert external_average_value(9, 1, current=10) == 10  # 0.9: kept
    assert external_average_value(8, 1, current=10) == 8


def test_pods_average_value_without_missing_pods() -> None:
    assert pods_average_value([1000, 1000], 0, 800) == 3  # ratio 1.25 x 2 pods = 2.5
    assert pods_average_value([850, 830], 0, 800) == 2  # ratio 1.05: kept
    assert pods_average_value([100, 100, 100], 0, 800) == 1  # ceil(0.375 x 3)
    assert pods_average_value([], 2, 800) is None


def test_pods_average_value_counts_starting_pods_conservatively() -> None:
    # scaling up: missing pods count as 0; 2000 / (800 x 4) = 0.625 flips the direction
    assert pods_average_value([1000, 1000], 2, 800) == 4
    # 3200 / (800 x 3) = 1.33: ceil(1.33 x 3) = 4
    assert pods_average_value([1600, 1600], 1, 800) == 4
    # scaling down: missing pods count as the target; (0 + 800) / (800 x 2) = 0.5 -> 1
    assert pods_average_value([0], 1, 800) == 1


def test_default_scale_up_is_four_pods_or_double_per_15_s() -> None:
    hpa = Hpa(1, 40, DEFAULT_BEHAVIOR)
    assert hpa.sync(0, 1, [30]) == 5  # max(1 + 4, 1 x 2)
    assert hpa.sync(15, 5, [30]) == 10  # the event at 0 is out of (0, 15]: max(5 + 4, 10)
    assert hpa.sync(30, 10, [30]) == 20
    assert hpa.sync(45, 20, [30]) == 30  # desired reached
    assert hpa.sync(60, 30, [30]) == 30
    assert [(e.before, e.after) for e in hpa.events] == [(1, 5), (5, 10), (10, 20), (20, 30)]


def test_scale_up_policy_counts_events_within_its_period() -> None:
    hpa = Hpa(1, 20, PUBSUB_SLOW_UP_BEHAVIOR)  # 100 % per 30 s
    assert hpa.sync(15, 2, [20]) == 4
    assert hpa.sync(30, 4, [20]) == 4  # the +2 at 15 is within (0, 30]: start 2, limit 4
    assert hpa.sync(45, 4, [20]) == 8  # the event at 15 is out of (15, 45]
    assert hpa.sync(60, 8, [20]) == 8
    assert hpa.sync(75, 8, [20]) == 16
    assert hpa.sync(105, 16, [20]) == 20  # maxReplicas


def test_scale_down_waits_for_the_stabilization_window() -> None:
    behavior = Behavior(DEFAULT_BEHAVIOR.scale_up, Rules(300, (Policy("Percent", 100, 15),)))
    hpa = Hpa(1, 20, behavior)
    assert hpa.sync(0, 10, [10]) == 10
    for t in range(15, 300, 15):
        assert hpa.sync(t, 10, [2]) == 10, t  # the 10 recommended at 0 is within 300 s
    assert hpa.sync(300, 10, [2]) == 2  # (0, 300]: only 2s left; 100 % per 15 s allows it


def test_a_new_hpa_counts_the_current_replicas_as_a_recommendation() -> None:
    hpa = Hpa(1, 20, DEFAULT_BEHAVIOR)
    assert hpa.sync(15, 10, [2]) == 10
    assert hpa.sync(300, 10, [2]) == 10  # the 10 at 15 is still within (0, 300]
    assert hpa.sync(315, 10, [2]) == 2


def test_scale_down_window_takes_the_highest_recent_recommendation() -> None:
    behavior = Behavior(DEFAULT_BEHAVIOR.scale_up, Rules(60, (Policy("Percent", 100, 15),)))
    hpa = Hpa(1, 20, behavior)
    hpa.sync(0, 10, [10])
    hpa.sync(15, 10, [6])
    hpa.sync(30, 10, [4])
    assert hpa.sync(60, 10, [2]) == 6  # (0, 60]: max(6, 4, 2)
    assert hpa.sync(75, 6, [2]) == 4
    assert hpa.sync(90, 4, [2]) == 2


def test_scale_up_window_takes_the_lowest_recent_recommendation() -> None:
    behavior = Behavior(Rules(30, (Policy("Percent", 1000, 15),)), DEFAULT_BEHAVIOR.scale_down)
    hpa = Hpa(1, 20, behavior)
    assert hpa.sync(0, 2, [2]) == 2
    assert hpa.sync(15, 2, [8]) == 2  # min(2 at 0, 8) within 30 s
    assert hpa.sync(30, 2, [9]) == 8  # (0, 30]: min(8, 9)


def test_scale_down_one_pod_per_minute() -> None:
    hpa = Hpa(1, 20, Behavior(DEFAULT_BEHAVIOR.scale_up, Rules(0, (Policy("Pods", 1, 60),))))
    assert hpa.sync(0, 5, [1]) == 4
    for t in (15, 30, 45):
        assert hpa.sync(t, 4, [1]) == 4
    assert hpa.sync(60, 4, [1]) == 3


def test_the_overlays_scale_down_one_pod_per_minute_after_five() -> None:
    for behavior in (PUBSUB_OVERLAY_BEHAVIOR, KEDA_OVERLAY_BEHAVIOR):
        hpa = Hpa(1, 20, behavior)
        hpa.sync(0, 5, [5])
        assert hpa.sync(285, 5, [1]) == 5
        assert hpa.sync(300, 5, [1]) == 4
        assert hpa.sync(345, 4, [1]) == 4
        assert hpa.sync(360, 4, [1]) == 3


def test_select_min_and_disabled() -> None:
    two = (Policy("Pods", 4, 15), Policy("Percent", 100, 15))
    hpa = Hpa(1, 40, Behavior(Rules(0, two, "Min"), DEFAULT_BEHAVIOR.scale_down))
    assert hpa.sync(0, 10, [40]) == 14  # min(10 + 4, 20)
    frozen = Hpa(1, 40, Behavior(Rules(0, two, "Disabled"), NO_WINDOWS.scale_down))
    assert frozen.sync(0, 10, [40]) == 10
    assert frozen.sync(15, 10, [3]) == 3


def test_bounds_apply_even_without_a_metric() -> None:
    hpa = Hpa(2, 12, NO_WINDOWS)
    assert hpa.sync(0, 5, []) == 5
    assert hpa.sync(15, 20, []) == 12
    assert hpa.sync(30, 12, [1]) == 2
    assert hpa.sync(45, 2, [100]) == 12


def _obs(lag_records: float, rows_per_record: float = 500) -> Observation:
    return Observation(
        t=0,
        backlog_messages=lag_records,
        oldest_age_s=0,
        arrival_rows_per_s=0,
        written_rows_per_s=0,
        rows_per_message=rows_per_record,
        ready=1,
    )


def test_keda_caps_the_lag_at_partitions_times_the_threshold() -> None:
    metric = Delayed(Delay("now", 1, 0, 0), random.Random(0))
    keda = KedaLag(730, 12, metric)
    keda.observe(_obs(100_000))
    assert metric.read(0) == 12 * 730
    assert keda.proposals(0, current=3) == [12]
    hpa = Hpa(1, 12, NO_WINDOWS)
    assert hpa.sync(15, 3, keda.proposals(15, 3)) == 12


def test_capped_lag_cannot_take_the_group_from_11_to_12_partitions() -> None:
    # 12 x 730 / (730 x 11) = 1.09: within the HPA's tolerance, so 11 replicas stay 11
    capped = KedaLag(730, 12, Delayed(Delay("now", 1, 0, 0), random.Random(0)))
    capped.observe(_obs(100_000))
    assert capped.proposals(0, current=11) == [11]
    uncapped = KedaLag(730, None, Delayed(Delay("now", 1, 0, 0), random.Random(0)))
    uncapped.observe(_obs(100_000))
    assert Hpa(1, 12, NO_WINDOWS).sync(15, 11, uncapped.proposals(15, 11)) == 12


def test_rowbatch_kafka_figure_is_lag_desired_replicas_capped_at_partitions() -> None:
    formula = DesiredFormula("kafka", 30, 24_409, max_replicas=12)
    assert formula(_obs(0)) == 1
    # 3,000 records x 500 rows = 1.5M rows / (30 s x 24,409) = 2.05 -> 3
    assert formula(_obs(3_000)) == 3
    assert formula(_obs(10_000_000)) == 12


def test_rate_term_and_balanced_partitions() -> None:
    formula = DesiredFormula("kafka", 30, 24_409, 12, with_rate=True, partitions=12)
    obs = Observation(0, 0, 0, 0, written_rows_per_s=150_000, rows_per_message=500, ready=6)
    # 150,000 / 24,409 = 6.15 -> 7, and 7 members on 12 partitions drain like 6: 12
    assert formula(obs) == 12
    plain = DesiredFormula("kafka", 30, 24_409, 12, with_rate=True)
    assert plain(obs) == 7


@pytest.mark.parametrize(("n", "want"), [(1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 12), (12, 12)])
def test_balanced_counts(n: int, want: int) -> None:
    from bench.autoscale.signals import balanced

    assert balanced(n, 12) == want
