"""The server-saturated safeguard in the simulator: the model server is saturated when the
ready replicas would send it more than it serves; the consumer's figure (its own
``ScalingSignal`` and ``Safeguards``) then counts the rate term alone, with a tenth to spare,
once the saturation has held over its window, and holds there instead of growing to
``max_replicas``, which the same figure without it does. ``python -m bench autoscale --only
server-bound`` compares the two."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench.autoscale.consumer_figure import ConsumerFigure
from bench.autoscale.fleet import FleetParams
from bench.autoscale.run import simulate
from bench.autoscale.scenarios import Params
from bench.autoscale.server_bound import FAMILIES, SERVER_FULL, cases, server_bound_scenario
from bench.autoscale.signals import Delay, Delayed, DesiredFormula, Observation
from bench.autoscale.traces import Trace
from rowbatch.consumer.observe.scaling import SERVER_FULL_HEADROOM, fleet_replicas

R = 1000.0  # rows/s per replica
T = 10.0
SERVER = 5000.0  # rows/s: 5 replicas' worth
KAFKA = DesiredFormula("kafka", T, R, 30, with_rate=True, partitions=12)
PUBSUB = DesiredFormula("pubsub", T, R, 30, with_rate=True)
STATISTICS = Delay("statistics", 1, 2, 2)


def _obs(t: int, *, saturated: bool, backlog_rows: float = 2_000_000.0) -> Observation:
    """The servers write ``SERVER`` rows/s while a large backlog waits (as records of 100 rows
    on Kafka, as a receive age on Pub/Sub)."""
    return Observation(
        t=t,
        backlog_messages=backlog_rows / 100,
        oldest_age_s=backlog_rows / SERVER,
        arrival_rows_per_s=2 * SERVER,
        written_rows_per_s=SERVER,
        rows_per_message=100,
        ready=6,
        server_saturated=saturated,
    )


def _figure(formula: DesiredFormula, aware: bool) -> ConsumerFigure:
    return ConsumerFigure(formula, Delayed(STATISTICS, random.Random(0)) if aware else None)


def test_the_server_is_saturated_when_the_replicas_could_send_it_more_than_it_serves() -> None:
    pubsub = FleetParams(R, SERVER)
    assert pubsub.consumer_rate(9) == 9000
    assert pubsub.drain_rate(9) == SERVER
    assert pubsub.server_saturated(6, 1e6)
    assert not pubsub.server_saturated(5, 1e6)  # exactly its capacity: nothing queues there
    assert not pubsub.server_saturated(9, 4000)  # too few rows waiting to fill it
    kafka = FleetParams(R, SERVER, partitions=12)
    assert kafka.consumer_rate(5) == 4000  # someone has 3 of the 12 partitions
    assert not kafka.server_saturated(5, 1e6)
    assert kafka.server_saturated(6, 1e6)
    assert kafka.server_saturated(30, 1e6) and kafka.consumer_rate(30) == 12_000


@pytest.mark.parametrize("formula", [KAFKA, PUBSUB], ids=["kafka", "pubsub"])
def test_with_the_server_saturated_the_figure_holds_at_the_rate_term(
    formula: DesiredFormula,
) -> None:
    aware, blind = _figure(formula, True), _figure(formula, False)
    for t in range(120):
        obs = _obs(t, saturated=True)
        figures = (aware(obs), aware.needed(obs), blind(obs), blind.needed(obs))
    assert aware.server_full and not blind.server_full
    aware_figure, aware_need, blind_figure, blind_need = figures
    # written / r with a tenth to spare, no backlog term: 5.5
    assert aware_need == pytest.approx(SERVER / R * (1 + SERVER_FULL_HEADROOM))
    assert aware_need == pytest.approx(5.5)
    assert aware_figure == 6  # Kafka: 6 also splits the 12 partitions evenly
    assert blind_need == 30  # backlog 2M / (10 s x 1000) + 5: capped at max_replicas
    assert blind_figure == (12 if formula.partitions else 30)  # Kafka: the partitions


def test_a_blind_figure_is_the_stateless_one_the_other_signals_use() -> None:
    """Without saturation and without history, the consumer's figure is ``fleet_replicas``."""
    for formula in (KAFKA, PUBSUB):
        for backlog in (0.0, 5_000.0, 49_999.0, 50_001.0, 400_000.0, 5e6):
            obs = _obs(0, saturated=False, backlog_rows=backlog)
            want = fleet_replicas(
                formula.backlog_rows(obs),
                obs.written_rows_per_s,
                T,
                R,
                formula.max_replicas,
                partitions=formula.partitions,
            )
            assert _figure(formula, True)(obs) == want
            assert _figure(formula, False).needed(obs) == pytest.approx(min(30, backlog / 1e4 + 5))


def test_server_full_waits_for_nine_in_ten_samples_read_late() -> None:
    """Saturated from second 0, read 2 s late: at least 9 of the 10 samples (seconds t-9..t)
    are saturated from second 10; it stops at second 20, read from 22, and full ends once
    fewer than half the samples are saturated (second 27: six unsaturated)."""
    figure = _figure(KAFKA, True)
    full = []
    for t in range(40):
        obs = _obs(t, saturated=t < 20)
        figure(obs)
        figure(obs)  # asked twice in a second: one sample
        full.append(figure.server_full)
    assert full.index(True) == 10
    assert full[10:27] == [True] * 17
    assert not any(full[27:])


def test_the_figure_returns_to_the_backlog_once_the_server_has_room() -> None:
    figure = _figure(KAFKA, True)
    for t in range(60):
        figure(_obs(t, saturated=True))
    assert figure(_obs(60, saturated=True)) == 6
    for t in range(61, 80):
        last = figure(_obs(t, saturated=False))
    assert not figure.server_full
    assert last == 12


def _flat(rows_per_s: int, seconds: int) -> Trace:
    return Trace("flat", "flat", (rows_per_s,) * seconds, (rows_per_s // 500,) * seconds)


@pytest.mark.parametrize("family", FAMILIES)
def test_servers_below_the_load_the_safeguard_saves_replicas_at_the_same_latency(
    family: str,
) -> None:
    """50,000 rows/s on 40,000 rows/s of servers: the backlog grows whatever the replicas.
    Blind, the figure climbs to its cap; with the safeguard it stays at what the servers
    take (3 Pub/Sub replicas, 2 Kafka members), and the rows are as late."""
    p = Params(server_rows_per_s=40_000)
    trace = _flat(50_000, 900)
    blind, aware = (
        simulate(trace, server_bound_scenario(family, p, 30, aware), 30, seed=0)
        for aware in (False, True)
    )
    assert blind.conserved and aware.conserved
    assert aware.scenario.endswith(SERVER_FULL)
    pubsub = "age" in family
    assert blind.peak_replicas == (30 if pubsub else 12)
    rate = p.pubsub_rows_per_s if pubsub else p.kafka_rows_per_s
    assert aware.peak_replicas == math.ceil(40_000 / rate)
    assert aware.scale_ups == 0
    assert aware.replica_minutes < blind.replica_minutes / 3
    assert aware.p99_s <= blind.p99_s


def test_server_bound_scenarios_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown signal"):
        server_bound_scenario("keda-lag", Params(), 30, aware=True)


def test_cli_only_server_bound(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    out = tmp_path / "server-bound.json"
    assert main(["autoscale", "--only", "server-bound", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Server-saturated safeguard: without -> with" in printed
    assert "kafka/rowbatch-lag+rate+server-full" in printed
    data = json.loads(out.read_text())
    assert data["ok"]
    assert data["max_replicas"] == 30
    assert [c["server_rows_per_s"] for c in data["cases"]] == [100_000, 40_000]
    assert len(data["pairs"]) == 2 * len(FAMILIES)
    for pair in data["pairs"]:
        assert pair["with"]["replica_minutes"] < pair["without"]["replica_minutes"]
        assert pair["with"]["peak_replicas"] <= pair["without"]["peak_replicas"]


def test_a_kafka_membership_change_does_not_bring_the_backlog_term_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """step-x5 on servers at 100,000 rows/s, Kafka, with the safeguard: each scale-down pauses
    the group 3 s, the servers idle 3 of the last 10 samples; full stays full down to half
    the samples (SERVER_FREE_SHARE), so once the figure first held at the rate term it does
    not jump back to the partitions' 12 (with one threshold it did, ~10 s after each of 7
    membership changes)."""
    figures: dict[int, int] = {}
    call = ConsumerFigure.__call__

    def recorded(self: ConsumerFigure, obs: Observation) -> int:
        figures[obs.t] = call(self, obs)
        return figures[obs.t]

    monkeypatch.setattr(ConsumerFigure, "__call__", recorded)
    case = cases(0)[0]
    params = replace(Params(), server_rows_per_s=case.server_rows_per_s)
    simulate(case.trace, server_bound_scenario("rowbatch-lag+rate", params, 30, True), 30.0, 0)
    # The step at 10 min: the backlog asks for all 12 until the servers' saturation is read,
    # then the figure is held at the rate term.
    asked = min(t for t, n in figures.items() if t > 600 and n == 12)
    held = min(t for t, n in figures.items() if t > asked and n < 12)
    assert not [t for t, n in figures.items() if t > held and n == 12]
