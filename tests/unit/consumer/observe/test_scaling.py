"""The autoscaling figure (``rowbatch/consumer/observe/scaling.py``) with hand-computed cases:
the rate term, the floor when the backlog is empty, hysteresis inside the tolerance, the hold while
backing off, the rate term alone (with a tenth to spare) while the model server is full, the
partition cap and even split, and both views (a Pub/Sub replica's share, a Kafka replica's view
of the group)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from prometheus_client import CollectorRegistry

from rowbatch.consumer.observe import scaling
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.observe.scaling import (
    SERVER_FULL_HEADROOM,
    Conditions,
    Safeguards,
    ScalingGauges,
    ScalingSignal,
    SignalSettings,
    Window,
    balanced,
    bounded,
    fleet_replicas,
    replicas_needed,
    steady_round,
)
from rowbatch.consumer.service.build_io import scaling_signal
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.scaling_settings import ScalingInputs

# --- the formula -----------------------------------------------------------------------------


def test_replicas_needed_is_backlog_over_t_r_plus_written_over_r() -> None:
    # 60,000 rows / (30 s x 1,000 rows/s) = 2, plus 1,500 rows/s written / 1,000 = 1.5
    assert replicas_needed(60_000, 0, 30, 1000) == 2.0
    assert replicas_needed(60_000, 1500, 30, 1000) == 3.5
    assert replicas_needed(-5, -5, 30, 1000) == 0.0  # never negative
    with pytest.raises(ValueError, match="must be > 0"):
        replicas_needed(1, 1, 0, 1000)


def test_an_empty_backlog_with_nothing_written_asks_for_the_minimum() -> None:
    assert fleet_replicas(0, 0, 20, 24_409, 12) == 1
    assert fleet_replicas(0, 0, 20, 24_409, 12, min_replicas=2) == 2


def test_the_rate_term_keeps_what_is_written_covered_with_no_backlog() -> None:
    # 2,500 rows/s written, 1,000 per replica: 3 replicas, though nothing waits
    assert fleet_replicas(0, 2500, 20, 1000, 12) == 3
    # plus 40,000 rows waiting / (20 s x 1,000) = 2 more
    assert fleet_replicas(40_000, 2500, 20, 1000, 12) == 5


def test_partition_cap_and_even_split() -> None:
    assert fleet_replicas(10**9, 0, 20, 1000, 6, partitions=6) == 6  # capped by partitions
    # 7,000 rows/s / 1,000 = 7 members; on 12 partitions 7..11 drain like 6, so 12
    assert fleet_replicas(0, 7000, 20, 1000, 12, partitions=12) == 12
    assert fleet_replicas(0, 7000, 20, 1000, 12) == 7  # no partitions given: no rounding
    assert fleet_replicas(0, 5000, 20, 1000, 12, partitions=12) == 6  # 12 / 6 = 2 each
    assert fleet_replicas(0, 5000, 20, 1000, 8, partitions=12) == 6
    assert fleet_replicas(0, 7000, 20, 1000, 8, partitions=12) == 8  # the cap still holds


@pytest.mark.parametrize(("n", "want"), [(1, 1), (2, 2), (3, 3), (4, 4), (5, 6), (7, 12), (12, 12)])
def test_balanced_counts(n: int, want: int) -> None:
    assert balanced(n, 12) == want


def test_bounded() -> None:
    assert bounded(0, 1, None) == 1
    assert bounded(50, 1, None) == 50  # no cap
    assert bounded(50, 1, 20) == 20
    assert bounded(7, 1, 12, 12) == 12
    assert bounded(7, 1, 10, 12) == 10


# --- safeguards --------------------------------------------------------------------------------


def test_steady_round_rises_at_once_and_falls_only_clearly_below() -> None:
    assert steady_round(2.01, 2) == 3  # up at once
    assert steady_round(3.0, 4) == 4  # 3.0 > (4 - 1) x 0.9 = 2.7: stays
    assert steady_round(2.98, 4) == 4
    assert steady_round(2.7, 4) == 3  # at the band's edge: falls
    assert steady_round(0.95, 2) == 2
    assert steady_round(0.9, 2) == 1
    assert steady_round(0.0, 2) == 0  # the floor is ``bounded``'s
    assert steady_round(1.5, None) == 2


def test_a_need_hovering_at_a_whole_number_does_not_flap() -> None:
    guard = Safeguards()
    figures = [guard.apply(x, x, Conditions())[1] for x in (2.9, 3.05, 2.95, 3.02, 2.98, 3.01)]
    assert figures == [3, 4, 4, 4, 4, 4]


def test_backing_off_holds_the_figure() -> None:
    guard = Safeguards()
    assert guard.apply(5.5, 1.0, Conditions()) == (5.5, 6)
    held = Conditions(backing_off=True)
    assert guard.apply(0.0, 0.0, held) == (5.5, 6)  # writes stopped: not a reason to shrink
    assert guard.apply(50.0, 1.0, held) == (5.5, 6)  # nor is the backlog growing meanwhile
    assert guard.apply(2.0, 1.0, Conditions()) == (2.0, 2)


def test_backing_off_before_any_figure_computes_one() -> None:
    assert Safeguards().apply(3.5, 1.0, Conditions(backing_off=True)) == (3.5, 4)


def test_a_full_server_counts_the_rate_term_alone_with_a_tenth_to_spare() -> None:
    assert SERVER_FULL_HEADROOM == 0.1
    full = Conditions(server_full=True)
    # a backlog that asks for 10, while the server is full and 2.8 replicas' worth is written:
    # 2.8 x 1.1 = 3.08 -> 4 (the rate term alone would be 3, the backlog 10)
    needed, rounded = Safeguards().apply(10.0, 2.8, full)
    assert needed == pytest.approx(3.08)
    assert rounded == 4
    # never more than the need with the backlog: a backlog of a twentieth of a replica's worth
    assert Safeguards().apply(2.9, 2.8, full) == (2.9, 3)
    assert Safeguards().apply(10.0, 2.8, Conditions()) == (10.0, 10)  # not full: the backlog


# --- the running signal ------------------------------------------------------------------------


_INPUTS = frozenset(ScalingInputs.model_fields)
"""The ``[source]`` fields the signal reads from ``SignalSettings.inputs``."""


def _signal(view: str = "share", **settings: object) -> tuple[ScalingSignal, CollectorRegistry]:
    """A signal with ``target_latency_s`` 10 s and 1,000 rows/s per replica unless ``settings``
    say otherwise (``ScalingInputs`` fields and ``SignalSettings`` fields alike)."""
    registry = CollectorRegistry()
    base: dict[str, object] = {"target_latency_s": 10.0, "rows_per_s_per_replica": 1000.0}
    base.update(settings)
    inputs = ScalingInputs.model_validate({k: v for k, v in base.items() if k in _INPUTS})
    rest = {k: v for k, v in base.items() if k not in _INPUTS}
    signal = ScalingSignal(SignalSettings(view, inputs=inputs, **rest), ScalingGauges(registry))  # type: ignore[arg-type]
    return signal, registry


def _value(registry: CollectorRegistry, name: str) -> float | None:
    return registry.get_sample_value(name)


def _tick(signal: ScalingSignal, now: float, **state: bool) -> None:
    signal.tick(
        now,
        busy=state.get("busy", False),
        backing_off=state.get("backing_off", False),
        slots_full=state.get("slots_full", False),
    )


def test_the_gauges_start_at_the_floor() -> None:
    metrics = Metrics()
    registry = metrics.registry
    assert _value(registry, "rowbatch_desired_replicas") == 1
    assert _value(registry, "rowbatch_replica_load") == 0
    assert _value(registry, "rowbatch_rows_per_s_per_replica") == 0


def test_a_pubsub_replica_reports_its_share_from_receive_age_and_rates() -> None:
    signal, registry = _signal(rate_window_s=10.0)
    _tick(signal, 0.0)
    # 10 s: 10,000 rows received 5 s after publishing, 8,000 written
    signal.received(10_000, 5.0)
    signal.written(8_000)
    _tick(signal, 10.0)
    own = signal.own_rates()
    assert (own.received_rows_per_s, own.written_rows_per_s, own.receive_age_s) == (
        1000.0,
        800.0,
        5.0,
    )
    # backlog 5 s x 1,000 rows/s = 5,000 rows: 5,000 / (10 s x 1,000) + 800 / 1,000 = 1.3
    assert _value(registry, "rowbatch_replica_load") == pytest.approx(1.3)
    assert _value(registry, "rowbatch_desired_replicas") == 2
    # drained: nothing received or written for a whole window -> the floor
    _tick(signal, 20.0)
    assert _value(registry, "rowbatch_replica_load") == 0
    assert _value(registry, "rowbatch_desired_replicas") == 1


def test_a_pubsub_replica_holds_while_backing_off_and_caps_at_max_replicas() -> None:
    signal, registry = _signal(rate_window_s=10.0, max_replicas=3)
    _tick(signal, 0.0)
    signal.received(100_000, 20.0)
    signal.written(5_000)
    _tick(signal, 10.0)
    # 20 s x 10,000 rows/s / (10 s x 1,000) + 0.5 = 20.5: the load says so, the figure is capped
    assert _value(registry, "rowbatch_replica_load") == pytest.approx(20.5)
    assert _value(registry, "rowbatch_desired_replicas") == 3
    _tick(signal, 20.0, backing_off=True)  # nothing flows while backing off
    assert _value(registry, "rowbatch_replica_load") == pytest.approx(20.5)
    assert _value(registry, "rowbatch_desired_replicas") == 3


def test_busy_slots_mean_a_full_server_only_when_the_slots_are_the_servers() -> None:
    # full: the rate term 5,000 / 1,000 = 0.5 plus a tenth; not: 20 + 0.5 with the backlog
    for fills, want in ((True, 0.55), (False, 20.5)):
        signal, registry = _signal(rate_window_s=10.0, slots_fill_server=fills)
        _tick(signal, 0.0, slots_full=True)
        signal.received(100_000, 20.0)
        signal.written(5_000)
        _tick(signal, 10.0, slots_full=True)
        assert signal.conditions.server_full is fills
        assert _value(registry, "rowbatch_replica_load") == pytest.approx(want)


def test_a_dip_in_the_write_rate_while_the_server_is_full_keeps_it_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server takes 4,100 rows/s, 4.1 members' worth: 5 members (6 on 12 partitions, split
    evenly) keep it full, 4 (4,000 rows/s) do not. A rebalance pause dips the write rate by
    12 %, to 3,600 rows/s: the rate term alone, 3.6, is at the hysteresis band's edge
    ((5 - 1) x 0.9), so it asks for 4 and the server stops being full (a flap); with a tenth to
    spare, 3.96, the figure holds."""

    def figures(headroom: float) -> list[int | None]:
        monkeypatch.setattr(scaling, "SERVER_FULL_HEADROOM", headroom)
        signal, _ = _signal("fleet", target_latency_s=20.0)
        out = []
        for t, written in enumerate((4100, 4100, 3600, 3600, 3600, 4100)):
            signal.tick(
                float(t), busy=False, backing_off=False, slots_full=False, server_saturated=True
            )
            assert signal.conditions.server_full
            # 500,000 rows waiting: 25 members' worth, were the server not full
            out.append(signal.fleet(500_000, written, partitions=12, own_backlog_rows=0))
        return out

    assert figures(SERVER_FULL_HEADROOM) == [6] * 6
    assert figures(0.0) == [6, 6, 4, 4, 4, 6]  # without the headroom: 4 x 1,000 < 4,100


def test_the_server_counts_as_full_when_nearly_every_sample_says_so_until_half_do_not() -> None:
    signal, _ = _signal()
    for t in range(10):
        _tick(signal, float(t), slots_full=t not in (0, 1))
    assert not signal.conditions.server_full  # never more than 8 of the last 10 samples
    signal, _ = _signal()
    for t in range(10):
        _tick(signal, float(t), slots_full=t != 5)
    assert signal.conditions.server_full  # 9 of 10: 90 %
    for gap in (10.0, 11.0, 12.0):  # a gap (a rebalance pause): 6 of the last 10 still full
        _tick(signal, gap)
    assert signal.conditions.server_full  # full stays full down to half the samples
    _tick(signal, 13.0)
    _tick(signal, 14.0)
    assert not signal.conditions.server_full  # 4 of 10 (older samples forgotten): room again


def test_a_measured_rate_replaces_the_floor_once_known() -> None:
    signal, registry = _signal(rows_per_s_per_replica=None, rate_window_s=10.0)
    _tick(signal, 0.0, busy=True)
    assert signal.rate is None
    assert _value(registry, "rowbatch_desired_replicas") == 1
    signal.received(4_000, 2.0)
    signal.written(4_000)
    _tick(signal, 2.0, busy=True)  # saturated for 2 s: 2,000 rows/s
    assert signal.rate == 2000.0
    assert _value(registry, "rowbatch_rows_per_s_per_replica") == 2000.0
    # 2 s x 2,000 rows/s / (10 s x 2,000) + 2,000 / 2,000 = 1.2
    assert _value(registry, "rowbatch_replica_load") == pytest.approx(1.2)


def test_idle_windows_do_not_measure_the_rate() -> None:
    signal, _ = _signal(rows_per_s_per_replica=None)
    _tick(signal, 0.0)
    signal.written(500)
    _tick(signal, 2.0)  # work arrived and was done, but intake never waited for room
    assert signal.rate is None


def test_a_kafka_replica_reports_the_groups_figure_and_its_own_share() -> None:
    signal, registry = _signal("fleet", target_latency_s=20.0, rate_window_s=10.0)
    _tick(signal, 0.0)
    signal.written(20_000)
    _tick(signal, 10.0)
    # the group: 100,000 rows / (20 s x 1,000) + 3,000 rows/s / 1,000 = 8 -> 12 partitions
    # split evenly among 12 (8..11 drain like 6)
    assert signal.fleet(100_000, 3000, partitions=12, own_backlog_rows=10_000) == 12
    assert _value(registry, "rowbatch_desired_replicas") == 12
    # this replica: 10,000 / 20,000 + 2,000 rows/s own writes / 1,000 = 2.5
    assert _value(registry, "rowbatch_replica_load") == pytest.approx(2.5)
    # capped at the partitions
    assert signal.fleet(10**9, 0, partitions=6, own_backlog_rows=0) == 6


def test_kafka_source_settings_cap_the_groups_figure_at_max_replicas() -> None:
    settings = KafkaSettings(
        bootstrap_servers="127.0.0.1:9092",
        topic="rows",
        group_id="g",
        dead_letter_topic="rows-dlq",
        rows_per_s_per_replica=1000.0,
        max_replicas=4,
    )
    signal = scaling_signal(settings, Metrics(CollectorRegistry()))
    _tick(signal, 0.0)
    # far more than 12 partitions' worth of backlog, capped at 4 (an even split of 12)
    assert signal.fleet(10**9, 0, partitions=12, own_backlog_rows=0) == 4


def test_the_shared_source_fields_are_declared_once_and_read_from_the_section() -> None:
    """``rows_per_s_per_replica``, ``rate_window_s`` and ``max_replicas`` have no field, and so
    no default, of their own in ``SignalSettings``: it reads them from the ``[source]``
    section it is built from, whichever broker's."""
    assert {"rows_per_s_per_replica", "rate_window_s", "max_replicas"} == _INPUTS
    assert not _INPUTS & {f.name for f in fields(SignalSettings)}
    sections: tuple[PubSubSettings | KafkaSettings, ...] = (
        PubSubSettings(subscription="projects/p/subscriptions/rows", rate_window_s=7.0),
        KafkaSettings(bootstrap_servers="k:9092", topic="t", group_id="g", max_replicas=5),
    )
    for section in sections:
        settings = scaling_signal(section, Metrics(CollectorRegistry())).settings
        assert settings.inputs is section
        assert settings.target_latency_s == section.target_latency_s
        for name in _INPUTS:
            assert getattr(settings, name) == getattr(section, name), name


def test_a_kafka_replica_without_a_rate_keeps_the_floor() -> None:
    signal, registry = _signal("fleet", rows_per_s_per_replica=None)
    assert signal.fleet(10**6, 1000, partitions=6, own_backlog_rows=0) is None
    assert _value(registry, "rowbatch_desired_replicas") == 1


def test_window_change_over_spans() -> None:
    window = Window(60.0)
    for t in range(0, 100, 10):
        window.add(float(t), (float(t) * 2,))
    assert window.change() == (60.0, (120.0,))
    assert window.change(20.0) == (20.0, (40.0,))
    assert window.change(5.0) == (10.0, (20.0,))  # the newest sample before the span
    assert Window(10.0).change() == (0.0, ())
