"""The Kafka lag report feeding the scaling signal: the group's backlog from every partition's
lag, the group's write rate from the committed offsets' progress (every member's commits, so
one replica computes the fleet's figure), this replica's own share from its partitions."""

from __future__ import annotations

import math

import pytest
from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from rowbatch.consumer.observe.scaling import ScalingGauges, ScalingSignal, SignalSettings
from rowbatch.consumer.sources.kafka.lag import LagMonitor, standalone_signal
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.scaling_settings import ScalingInputs

TOPIC = "rows"


class GroupView:
    """What ``refresh`` asks a started aiokafka consumer."""

    def __init__(self, partitions: int, mine: set[int]) -> None:
        self.end = dict.fromkeys(range(partitions), 0)
        self.commits: dict[int, int | None] = dict.fromkeys(range(partitions))
        self.mine = mine

    def partitions_for_topic(self, topic: str) -> set[int]:
        return set(self.end)

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self.end[tp.partition] for tp in tps}

    async def committed(self, tp: TopicPartition) -> int | None:
        return self.commits[tp.partition]

    async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return dict.fromkeys(tps, 0)

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition(TOPIC, p) for p in self.mine}


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def config(**over: object) -> KafkaSettings:
    return KafkaSettings(
        bootstrap_servers="b:9092",
        topic=TOPIC,
        group_id="g",
        **over,  # type: ignore[arg-type]
    )


async def test_the_groups_commits_are_its_write_rate_and_its_lag_the_backlog() -> None:
    registry = CollectorRegistry()
    signal = ScalingSignal(
        SignalSettings(
            "fleet", 20.0, ScalingInputs(rows_per_s_per_replica=1000.0, rate_window_s=10.0)
        ),
        ScalingGauges(registry),
    )
    clock = Clock()
    monitor = LagMonitor(
        config(), registry, rows_per_record=lambda: 100.0, signal=signal, clock=clock
    )
    group = GroupView(12, mine={0, 1})
    group.end = dict.fromkeys(range(12), 1000)
    group.commits = dict.fromkeys(range(12), 900)
    group.commits[11] = None  # never committed: counts from the log start (earliest)
    lags = await monitor.refresh(group)
    assert lags[0] == 100 and lags[11] == 1000
    assert registry.get_sample_value("rowbatch_kafka_lag_total", {"topic": TOPIC}) == 2100
    # no progress seen yet: 210,000 rows / (20 s x 1,000) = 10.5 -> 11 -> 12 (even split)
    assert registry.get_sample_value("rowbatch_desired_replicas") == 12

    clock.now = 10.0
    group.end = dict.fromkeys(range(12), 1000)
    group.commits = dict.fromkeys(range(12), 1000)  # 11 x 100 records committed in 10 s
    await monitor.refresh(group)
    # nothing waits; the group wrote 110 records/s x 100 rows = 11,000 rows/s -> 11 -> 12
    assert registry.get_sample_value("rowbatch_kafka_backlog_rows", {"topic": TOPIC}) == 0
    assert registry.get_sample_value("rowbatch_desired_replicas") == 12

    clock.now = 30.0
    await monitor.refresh(group)  # no commits for a whole window: the floor
    assert registry.get_sample_value("rowbatch_desired_replicas") == 1


async def test_this_replicas_load_counts_its_own_partitions_lag() -> None:
    registry = CollectorRegistry()
    signal = ScalingSignal(
        SignalSettings("fleet", 20.0, ScalingInputs(rows_per_s_per_replica=1000.0)),
        ScalingGauges(registry),
    )
    monitor = LagMonitor(config(), registry, rows_per_record=lambda: 10.0, signal=signal)
    group = GroupView(4, mine={1})
    group.end = {0: 500, 1: 4000, 2: 0, 3: 0}
    group.commits = {0: 0, 1: 0, 2: 0, 3: 0}
    await monitor.refresh(group)
    # the group: 45,000 rows / 20,000 = 2.25 -> 3 -> 4 on 4 partitions; mine: 40,000 -> 2.0
    assert registry.get_sample_value("rowbatch_desired_replicas") == 4
    assert registry.get_sample_value("rowbatch_replica_load") == 2.0


async def test_a_source_without_the_pipeline_keeps_a_signal_of_its_own() -> None:
    registry = CollectorRegistry()
    signal = standalone_signal(config(rows_per_s_per_replica=500.0), registry)
    assert signal.settings.view == "fleet"
    assert signal.settings.target_latency_s == 20.0  # the default
    assert registry.get_sample_value("rowbatch_rows_per_s_per_replica") == 500.0


class Wall:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_failing_lag_read_is_counted_logged_and_blanks_the_figures_when_stale(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    signal = ScalingSignal(
        SignalSettings(
            "fleet", 20.0, ScalingInputs(rows_per_s_per_replica=1000.0, rate_window_s=10.0)
        ),
        ScalingGauges(registry),
    )
    clock, wall = Clock(), Wall()
    monitor = LagMonitor(
        config(lag_interval_s=5.0),
        registry,
        rows_per_record=lambda: 100.0,
        signal=signal,
        clock=clock,
        wall=wall,
    )
    group = GroupView(4, mine={0})
    group.end = dict.fromkeys(range(4), 1000)
    group.commits = dict.fromkeys(range(4), 900)
    assert await monitor.read_once(lambda: monitor.refresh(group))
    # 400 records x 100 rows / (20 s x 1,000 rows/s) = 2
    assert registry.get_sample_value("rowbatch_desired_replicas") == 2
    updated = {"topic": TOPIC}
    assert (
        registry.get_sample_value("rowbatch_kafka_lag_updated_timestamp_seconds", updated)
        == wall.now
    )
    assert monitor.stale_after_s == 30.0

    async def unreachable() -> None:
        raise OSError("broker down")

    for now in (5.0, 10.0, 25.0, 30.0, 40.0, 95.0):
        clock.now = now
        assert not await monitor.read_once(unreachable)
        desired = registry.get_sample_value("rowbatch_desired_replicas")
        assert desired is not None
        # 30 s after the last good read the old figure is withdrawn, not served as current
        assert math.isnan(desired) == (now >= 30.0), now
        assert monitor.stale == (now >= 30.0)
    assert registry.get_sample_value("rowbatch_kafka_lag_read_failures_total", updated) == 6
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 3, warnings  # at once, when withdrawn, then once a minute
    assert "for 5 s (OSError: broker down)" in warnings[0] and "withdrawn after 30 s" in warnings[0]
    assert "for 30 s" in warnings[1] and "NaN" in warnings[1]
    assert "for 95 s" in warnings[2] and "NaN" in warnings[2]

    clock.now, wall.now = 100.0, wall.now + 100
    assert await monitor.read_once(lambda: monitor.refresh(group))
    assert not monitor.stale
    assert registry.get_sample_value("rowbatch_desired_replicas") == 2
    assert (
        registry.get_sample_value("rowbatch_kafka_lag_updated_timestamp_seconds", updated)
        == wall.now
    )
    assert "read again after 95 s" in caplog.records[-1].getMessage()
