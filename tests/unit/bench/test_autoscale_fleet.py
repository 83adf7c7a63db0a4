"""The simulator's consumer and broker model: rows are conserved (in = out + backlog), written
oldest first with their latency, and the group's drain rate honours start-up, partitions,
rebalances and the model server's cap."""

from __future__ import annotations

import random

import pytest

from bench.autoscale.fleet import Backlog, FleetParams, Replicas

PUBSUB = FleetParams(rows_per_s_per_replica=1000, server_rows_per_s=5000, pod_startup_s=30)
KAFKA = FleetParams(1000, 100_000, partitions=12, pod_startup_s=30, rebalance_pause_s=3)


def test_rows_in_equal_rows_out_plus_backlog_at_every_step() -> None:
    rng = random.Random(7)
    backlog = Backlog()
    for t in range(2000):
        rows = rng.choice((0, rng.uniform(0, 5000)))
        backlog.publish(t, rows, max(1.0, rows / 500))
        backlog.drain(t, rng.uniform(0, 4000))
        assert backlog.rows_in == pytest.approx(backlog.rows_out + backlog.rows)
        assert sum(backlog.latency_rows.values()) == pytest.approx(backlog.rows_out)
        assert backlog.rows >= -1e-6
        assert backlog.messages >= -1e-6


def test_oldest_rows_go_first_with_their_latency() -> None:
    backlog = Backlog()
    backlog.publish(0, 100, 1)
    backlog.publish(1, 100, 1)
    assert backlog.oldest_age_s(1) == 2
    assert backlog.drain(1, 150) == 150
    assert backlog.latency_rows == {2: 100, 1: 50}
    assert backlog.rows == 50
    assert backlog.messages == pytest.approx(0.5)
    assert backlog.oldest_age_s(3) == 3
    assert backlog.drain(3, 1000) == 50
    assert backlog.latency_rows == {2: 100, 1: 50, 3: 50}
    assert backlog.rows == backlog.messages == 0
    assert backlog.oldest_age_s(4) == 0


def test_pubsub_drain_is_replicas_times_rate_up_to_the_server() -> None:
    assert PUBSUB.drain_rate(0) == 0
    assert PUBSUB.drain_rate(3) == 3000
    assert PUBSUB.drain_rate(5) == 5000
    assert PUBSUB.drain_rate(9) == 5000  # consumers beyond the server's capacity do not help
    assert PUBSUB.useful_replicas() == 5
    assert PUBSUB.replicas_for(3500) == 4
    assert PUBSUB.replicas_for(99_999) == 5


def test_kafka_drain_follows_the_busiest_members_partitions() -> None:
    assert KAFKA.drain_rate(1) == 1000
    assert KAFKA.drain_rate(5) == 4000  # someone has 3 of the 12 partitions
    assert KAFKA.drain_rate(6) == 6000
    assert KAFKA.drain_rate(11) == 6000  # someone still has 2
    assert KAFKA.drain_rate(12) == 12_000
    assert KAFKA.drain_rate(20) == 12_000  # at most one busy member per partition
    assert KAFKA.useful_replicas() == 12
    capped = FleetParams(1000, 5500, partitions=12)
    assert capped.drain_rate(12) == 5500
    assert capped.useful_replicas() == 6  # 6 members already reach the server's cap


def test_new_replicas_drain_only_once_started() -> None:
    replicas = Replicas(PUBSUB)
    replicas.start(1, 0, ready=True)
    replicas.scale_to(3, 10)
    assert replicas.count == 3
    assert replicas.ready(39) == 1
    assert replicas.drain_rate(39) == 1000
    assert replicas.ready(40) == 3
    assert replicas.drain_rate(40) == 3000


def test_scaling_down_removes_pods_not_started_first() -> None:
    replicas = Replicas(PUBSUB)
    replicas.start(2, 0, ready=True)
    replicas.scale_to(4, 100)
    replicas.scale_to(3, 110)
    assert replicas.ready(110) == 2
    assert replicas.ready(130) == 3
    replicas.scale_to(1, 200)
    assert replicas.ready(200) == 1


def test_kafka_group_pauses_on_membership_changes() -> None:
    replicas = Replicas(KAFKA)
    replicas.start(2, 0, ready=True)
    assert replicas.drain_rate(0) == 2000
    replicas.scale_to(3, 1)
    assert replicas.drain_rate(30) == 2000
    assert [replicas.drain_rate(t) for t in (31, 32, 33, 34)] == [0, 0, 0, 3000]
    pubsub = Replicas(PUBSUB)
    pubsub.start(1, 0, ready=True)
    pubsub.scale_to(2, 0)
    assert pubsub.drain_rate(30) == 2000  # no rebalance on Pub/Sub
