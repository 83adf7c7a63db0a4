"""The simulator (``bench/autoscale``) replaying the arrivals of a real run, in HPA time, and
the table that puts the two side by side."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from bench.autoscale.fleet import FleetParams
from bench.autoscale.run import Outcome, simulate
from bench.autoscale.scenarios import Scenario
from bench.autoscale.signals import (
    Delay,
    Delayed,
    DesiredFormula,
    DesiredReplicas,
    ReplicaLoad,
    Signal,
)
from bench.autoscale.traces import Trace
from bench.autoscale_real.run import RealRun, Setup
from bench.autoscale_real.stack import KAFKA_PARTITIONS, VARIANT, server_rows_per_s
from bench.report import Table

REPLICA_SECONDS_MARGIN = 0.15
"""The real run's replica-seconds are within this share of the simulator's..."""
PEAK_MARGIN = 1
"""...its peak within this many replicas, and it reverses direction no more often."""


def simulate_same(run: RealRun, seed: int = 0) -> Outcome:
    """``bench/autoscale``'s fleet and HPA on the arrivals ``run`` published, in HPA time
    (``time_scale`` x real): the measured per-replica rate, median start-up and longest
    pause in writing (as the Kafka group's pause per membership change), the model
    server's capacity, the consumers' formula (target, configured rate, the partitions on
    Kafka) read fresh at each sync as the controller reads it (Kafka: the External maximum;
    Pub/Sub: each replica's load, a Pods metric), the controller's behaviour and bounds. The
    outcome's times are HPA seconds (divide by ``time_scale`` for real ones)."""
    setup = run.setup
    k = setup.controller.time_scale
    n = max(1, math.ceil(run.plan.duration_s * k))
    rows, messages = [0] * n, [0] * n
    for at, count in run.sent:
        i = min(n - 1, int(at * k))
        rows[i] += count
        messages[i] += 1
    trace = Trace(f"real-{run.broker}", run.plan.describe(), tuple(rows), tuple(messages))
    partitions = KAFKA_PARTITIONS if run.broker == "kafka" else None
    fleet = FleetParams(
        rows_per_s_per_replica=run.rows_per_s_per_replica / k,
        server_rows_per_s=server_rows_per_s() / k,
        partitions=partitions,
        pod_startup_s=(statistics.median(run.startup_s) if run.startup_s else 3.0) * k,
        rebalance_pause_s=run.write_pause_s * k,
        unsettled_s=0.5 * k,
    )
    formula = DesiredFormula(
        run.broker,
        setup.target_latency_s * k,
        setup.rows_per_s_per_replica / k,
        partitions or setup.controller.max_replicas,
        with_rate=setup.with_rate,
        partitions=partitions,
    )
    delay = Delay("the consumers' gauge", max(1, round(setup.gauge_interval_s * k)), 0, 0)

    def make(delayed: Callable[[Delay], Delayed]) -> Signal:
        if run.broker == "pubsub":  # each replica's share, a Pods metric, as the controller
            return ReplicaLoad(formula, delayed(delay), delayed(delay))
        return DesiredReplicas(formula, delayed(delay))

    scenario = Scenario(
        "rowbatch-desired",
        run.broker,
        setup.target_latency_s,
        "target_latency_s",
        fleet,
        setup.controller.behavior,
        setup.controller.max_replicas,
        make,
        setup.controller.min_replicas,
    )
    return simulate(trace, scenario, setup.target_latency_s * k, seed)


def agreement(real: RealRun, sim: Outcome) -> dict[str, bool]:
    """Where the real run and the simulator must agree (latency spreads wider on the real
    stack, where partitions and pulls are not drained strictly oldest first: reported, not
    held to a margin)."""
    simulated = sim.replica_minutes * 60 / real.setup.controller.time_scale
    return {
        f"replica-seconds within {REPLICA_SECONDS_MARGIN:.0%} of the simulator's": abs(
            real.replica_seconds - simulated
        )
        <= REPLICA_SECONDS_MARGIN * simulated,
        f"peak within {PEAK_MARGIN} of the simulator's": abs(real.peak - sim.peak_replicas)
        <= PEAK_MARGIN,
        "no more reversals than simulated": real.reversals <= sim.reversals,
    }


def comparison_table(pairs: Sequence[tuple[RealRun, Outcome]]) -> Table:
    rows: list[tuple[str, ...]] = []
    for real, sim in pairs:
        k = real.setup.controller.time_scale
        ups = sum(1 for e in real.events if e.direction > 0)
        rows.append(
            (
                real.broker,
                "real",
                f"{real.published:,}",
                f"{real.p50_s:.1f}",
                f"{real.p99_s:.1f}",
                f"{real.max_s:.1f}",
                f"{real.late:.1%}",
                f"{real.replica_seconds:.0f}",
                str(real.peak),
                f"{ups}/{len(real.events) - ups}",
                str(real.reversals),
            )
        )
        rows.append(
            (
                real.broker,
                "simulated",
                f"{sim.rows:,}",
                f"{sim.p50_s / k:.1f}",
                f"{sim.p99_s / k:.1f}",
                f"{sim.max_s / k:.1f}",
                f"{sim.late_rows:.1%}",
                f"{sim.replica_minutes * 60 / k:.0f}",
                str(sim.peak_replicas),
                f"{sim.scale_ups}/{sim.scale_downs}",
                str(sim.reversals),
            )
        )
    first = pairs[0][0].setup if pairs else Setup()
    c = first.controller
    notes = (
        "Latency: publish to inference answered, per row (simulated: 1 HPA-second resolution); "
        f"late: rows over target_latency_s = {first.target_latency_s:g} s; replica-s: replicas "
        "asked for over the plan.",
        f"Controller: the HPA rule at {c.time_scale:g}x (sync {c.sync_period_s:g} s, "
        f"replicas {c.min_replicas}..{c.max_replicas}); model {VARIANT.base_ms:g} ms per "
        f"execution of up to {VARIANT.max_batch_size} rows, 1 request in flight per consumer, "
        f"server {server_rows_per_s():,.0f} rows/s.",
        *(
            f"{r.broker}: measured {r.rows_per_s_per_replica:,.0f} rows/s per replica, start-up "
            f"{_median(r.startup_s):.1f} s (median), longest pause in writing "
            f"{r.write_pause_s:.2f} s; checks: "
            + ", ".join(
                f"{name} {'ok' if ok else 'FAILED'}"
                for name, ok in (r.checks() | agreement(r, sim)).items()
            )
            for r, sim in pairs
        ),
    )
    return Table(
        "Autoscaling on the real stack vs the simulator, same arrivals "
        f"({first.controller.time_scale:g}x HPA time)",
        (
            "broker",
            "run",
            "rows",
            "p50 s",
            "p99 s",
            "max s",
            "late",
            "replica-s",
            "peak",
            "up/down",
            "flaps",
        ),
        tuple(rows),
        notes,
    )


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def to_json(run: RealRun, sim: Outcome) -> dict[str, Any]:
    real = dataclasses.asdict(run)
    real["checks"] = run.checks()
    real["drained_at_s"] = run.drained_at_s()
    real["back_to_min_at_s"] = run.back_to_min_at_s()
    return {"real": real, "simulated": dataclasses.asdict(sim), "agreement": agreement(run, sim)}


def timeline(run: RealRun, every_s: float = 3.0) -> str:
    """The controller's view, one line per ``every_s``: the figure it read, the replicas asked
    for and ready, the rows waiting (published and not yet in the table)."""
    lines = [f"  {run.broker}: t s  figure  replicas  ready  waiting rows"]
    next_at = -math.inf
    for s in run.samples:
        if s.at_s < next_at:
            continue
        next_at = s.at_s + every_s
        figure = "-" if s.figure is None else f"{s.figure:g}"
        lines.append(
            f"  {s.at_s:10.1f}  {figure:>6}  {s.replicas:>8}  {s.ready:>5}  "
            f"{s.published - s.written:>12,}"
        )
    events = ", ".join(f"{e.at_s:.1f} s {e.before}->{e.after}" for e in run.events)
    lines.append(f"  scale events: {events or 'none'}")
    return "\n".join(lines)
