"""The simulator end to end: a run conserves rows and reports what it kept, the clairvoyant
minimum, delayed metrics, the sweep's choice, ``python -m bench autoscale`` writing its JSON,
and the defaults matching the deploy manifests and the benchmark they came from."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest
import yaml

from bench.autoscale.fleet import FleetParams
from bench.autoscale.oracle import minimum
from bench.autoscale.run import percentile, simulate
from bench.autoscale.scenarios import (
    FAMILIES,
    KEDA_OVERLAY_BEHAVIOR,
    PUBSUB_OVERLAY_BEHAVIOR,
    Params,
    scenario,
)
from bench.autoscale.signals import Delay, Delayed
from bench.autoscale.sweep import SweepRow, choose, sweep
from bench.autoscale.traces import Trace

ROOT = Path(__file__).resolve().parents[3]


def _flat(name: str, rows_per_s: int, seconds: int, rows_per_message: int = 500) -> Trace:
    return Trace(name, "flat", (rows_per_s,) * seconds, (rows_per_s // rows_per_message,) * seconds)


def test_percentile_of_a_weighted_histogram() -> None:
    hist = {1: 90.0, 5: 9.0, 40: 1.0}
    assert percentile(hist, 0.5) == 1
    assert percentile(hist, 0.95) == 5
    assert percentile(hist, 0.99) == 5
    assert percentile(hist, 1.0) == 40
    assert percentile({}, 0.99) == 0


def test_delayed_metric_is_sampled_and_read_late() -> None:
    metric = Delayed(Delay("d", 60, 120, 120), random.Random(0))
    for t in range(0, 400):
        metric.offer(t, float(t))
    assert metric.read(119) is None
    assert metric.read(120) == 0  # the sample taken at 0
    assert metric.read(179) == 0
    assert metric.read(180) == 60
    assert metric.read(400) == 240  # sampled at 240, readable from 360


def test_a_steady_load_within_reach_is_held_without_flapping() -> None:
    p = Params()
    trace = _flat("steady", 50_000, 1200)
    for family in ("rowbatch-age+rate", "rowbatch-lag+rate"):
        out = simulate(trace, scenario(family, p), 30, seed=0)
        assert out.conserved
        assert out.rows == 60_000_000
        assert out.late_rows == 0
        assert out.p99_s <= 2
        assert out.scale_ups + out.scale_downs <= 1
        assert out.undrained_rows == 0
        assert out.replica_minutes >= out.minimum_replica_minutes


@pytest.mark.parametrize("family", FAMILIES)
def test_every_signal_runs_and_conserves_rows(family: str) -> None:
    trace = Trace("step", "up", (20_000,) * 300 + (100_000,) * 300, (40,) * 300 + (200,) * 300)
    out = simulate(trace, scenario(family, Params()), 30, seed=1)
    assert out.conserved
    assert out.undrained_rows == 0
    assert out.scale_ups >= 1
    assert out.peak_replicas > 1
    assert 0 < out.late_rows < 1


def test_backlog_only_figure_flaps_on_a_steady_load() -> None:
    out = simulate(_flat("steady", 50_000, 1800), scenario("rowbatch-age", Params(), 30), 30, 0)
    assert out.reversals >= 3
    assert out.late_rows > 0


def test_minimum_replicas_for_a_flat_load() -> None:
    fleet = FleetParams(1000, 100_000)
    floor = minimum(_flat("f", 2500, 600), fleet, 30)
    assert floor.holds
    # rows published in the last 29 s are due after the trace: not charged
    assert 2.5 * (600 - 29) <= floor.replica_seconds <= 3 * 600
    idle = minimum(Trace("idle", "", (0,) * 100, (0,) * 100), fleet, 30, min_replicas=2)
    assert idle.replica_seconds == 200


def test_minimum_knows_when_the_server_cannot_hold_the_objective() -> None:
    fleet = FleetParams(1000, 3000)
    assert not minimum(_flat("f", 4000, 300), fleet, 30).holds
    # a burst the server can absorb within the objective, if it starts draining early enough
    burst = Trace(
        "b", "", (0,) * 30 + (5000,) * 20 + (0,) * 100, (0,) * 30 + (10,) * 20 + (0,) * 100
    )
    assert minimum(burst, fleet, 30).holds


def _row(setting: float, late: float, cost: float) -> SweepRow:
    return SweepRow("s", setting, "x", late, 0, 0, cost, 1, 0)


def test_choose_takes_the_cheapest_near_the_best() -> None:
    rows = [_row(10, 0.020, 900), _row(20, 0.021, 800), _row(30, 0.030, 700)]
    assert choose(rows).setting == 20
    assert choose([_row(10, 0.0, 900), _row(20, 0.0005, 800)]).setting == 20  # slack


def test_sweep_marks_one_choice_per_signal() -> None:
    traces = [(0, [_flat("steady", 50_000, 600)]), (1, [_flat("steady", 52_000, 600)])]
    rows = sweep(traces, Params(), families=("keda-lag", "rowbatch-lag+rate"))
    assert sum(r.chosen for r in rows) == 2
    assert {r.scenario for r in rows} == {"kafka/keda-lag", "kafka/rowbatch-lag+rate"}


def test_cli_writes_tables_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.cli import main

    out = tmp_path / "autoscale.json"
    assert main(["autoscale", "--no-sweep", "--seed", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Autoscaling simulation" in printed
    assert "kafka/keda-lag" in printed
    data = json.loads(out.read_text())
    assert data["ok"]
    assert len(data["runs"]) == 4 * len(FAMILIES)
    assert {"p50_s", "p99_s", "max_s", "late_rows", "replica_minutes", "reversals"} <= set(
        data["runs"][0]
    )
    assert data["params"]["kafka_rows_per_s"] == 24_409


def _overlay(path: str) -> dict[str, object]:
    doc = yaml.safe_load((ROOT / "deploy" / "k8s" / "overlays" / path).read_text())
    assert isinstance(doc, dict)
    return doc


def _rules(raw: dict[str, object]) -> tuple[int, tuple[tuple[str, int, int], ...]]:
    policies = raw["policies"]
    assert isinstance(policies, list)
    window = raw["stabilizationWindowSeconds"]
    assert isinstance(window, int)
    return window, tuple((q["type"], q["value"], q["periodSeconds"]) for q in policies)


def test_defaults_are_the_manifests() -> None:
    p = Params()
    hpa = _overlay("gke-pubsub/hpa.yaml")["spec"]
    assert isinstance(hpa, dict)
    assert hpa["maxReplicas"] == p.pubsub_max_replicas
    targets = [float(m[m["type"].lower()]["target"]["averageValue"]) for m in hpa["metrics"]]
    assert targets == [p.hpa_messages_per_pod, p.load_per_pod]
    directions = {"scaleUp": PUBSUB_OVERLAY_BEHAVIOR.scale_up}
    directions["scaleDown"] = PUBSUB_OVERLAY_BEHAVIOR.scale_down
    for direction, rules in directions.items():
        window, policies = _rules(hpa["behavior"][direction])
        assert window == rules.stabilization_s
        assert policies == tuple((q.kind, q.value, q.period_s) for q in rules.policies)
    keda = _overlay("kafka-keda/scaledobject.yaml")["spec"]
    assert isinstance(keda, dict)
    assert keda["maxReplicaCount"] == p.partitions
    assert keda["pollingInterval"] == p.keda_polling_s
    trigger = keda["triggers"][0]["metadata"]
    assert float(trigger["lagThreshold"]) == p.keda_lag_threshold
    assert trigger["allowIdleConsumers"] == str(p.keda_allow_idle_consumers).lower()
    down = keda["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    window, policies = _rules(down)
    assert window == KEDA_OVERLAY_BEHAVIOR.scale_down.stabilization_s
    assert policies == tuple(
        (q.kind, q.value, q.period_s) for q in KEDA_OVERLAY_BEHAVIOR.scale_down.policies
    )


def test_per_replica_rates_are_the_recorded_simulation_inputs() -> None:
    """The simulator's per-replica rates (an end-to-end run of 2026-12-01, kept as constants so
    the simulation repeats) are the ones its recorded output states, which docs/autoscaling.md
    cites."""
    text = (ROOT / "bench" / "results" / "autoscale-sim-2026-12-02.txt").read_text()
    p = Params()
    line = re.search(r"Per replica ([\d,]+) rows/s \(Pub/Sub\), ([\d,]+) \(Kafka", text)
    assert line, "the recorded simulation does not state its per-replica rates"
    rates = tuple(float(x.replace(",", "")) for x in line.groups())
    assert rates == (p.pubsub_rows_per_s, p.kafka_rows_per_s)
