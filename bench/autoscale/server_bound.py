"""The server-bound comparison (``python -m bench autoscale --only server-bound``): model
servers slower than the trace's peak, and rowbatch's figure with ``max_replicas`` well above
what they can feed, computed as the consumers compute it (:mod:`bench.autoscale.consumer_figure`)
twice: blind to the server, and with the server-saturated safeguard (the rate term alone, with
a tenth to spare, while ``rowbatch_server_saturated`` holds). Both brokers, same HPA, same
traces, same seeds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from bench.autoscale import traces
from bench.autoscale.consumer_figure import SERVER_STATISTICS, ConsumerFigure
from bench.autoscale.run import Outcome, simulate
from bench.autoscale.scenarios import Params, Scenario, scenario
from bench.autoscale.signals import (
    PROMETHEUS,
    Delay,
    Delayed,
    DesiredFormula,
    DesiredReplicas,
    ReplicaLoad,
    Signal,
)
from bench.autoscale.traces import Trace

#: The figures compared: rowbatch's with the rate term, one per broker.
FAMILIES = ("rowbatch-age+rate", "rowbatch-lag+rate")
#: Suffix of the figure with the server-saturated safeguard.
SERVER_FULL = "+server-full"
#: ``max_replicas`` as configured: well above what the model servers can feed.
MAX_REPLICAS = 30


@dataclass(frozen=True)
class Case:
    """A trace, and model servers that serve less than its peak."""

    trace: Trace
    server_rows_per_s: float


def cases(seed: int) -> tuple[Case, ...]:
    """step-x5 (150,000 rows/s at its peak) on 100,000 rows/s of servers; steady 50,000 rows/s
    on 40,000."""
    return (Case(traces.step(seed), 100_000), Case(traces.steady(seed), 40_000))


def server_bound_scenario(family: str, p: Params, max_replicas: int, aware: bool) -> Scenario:
    """``family`` (one of :data:`FAMILIES`) at the manifests' target and HPA behaviour, with
    ``max_replicas`` configured and no cap at what the servers can feed; ``aware``: with the
    server-saturated safeguard."""
    if family not in FAMILIES:
        raise ValueError(f"unknown signal {family!r}; choose from {', '.join(FAMILIES)}")
    base = scenario(family, p)
    fleet = base.fleet
    formula = DesiredFormula(
        base.broker,
        base.setting,
        fleet.rows_per_s_per_replica,
        max_replicas,
        with_rate=True,
        partitions=fleet.partitions,
    )

    def make(delayed: Callable[[Delay], Delayed]) -> Signal:
        figure = ConsumerFigure(formula, delayed(SERVER_STATISTICS) if aware else None)
        if base.broker == "pubsub":
            return ReplicaLoad(figure, delayed(PROMETHEUS), delayed(PROMETHEUS))
        return DesiredReplicas(figure, delayed(PROMETHEUS))

    top = max_replicas if fleet.partitions is None else min(max_replicas, fleet.partitions)
    return replace(
        base,
        family=family + (SERVER_FULL if aware else ""),
        max_replicas=top,
        make_signal=make,
    )


@dataclass(frozen=True)
class Pair:
    """One case and broker, blind and with the safeguard."""

    server_rows_per_s: float
    blind: Outcome
    aware: Outcome

    @property
    def saved_replica_minutes(self) -> float:
        return self.blind.replica_minutes - self.aware.replica_minutes

    @property
    def saved_share(self) -> float:
        return self.saved_replica_minutes / max(1e-9, self.blind.replica_minutes)


def compare(
    p: Params, seed: int, max_replicas: int = MAX_REPLICAS
) -> tuple[tuple[Case, ...], list[Pair]]:
    """Every case under every family, blind and aware; the cases' traces seeded ``seed``."""
    runs = cases(seed)
    pairs = []
    for case in runs:
        params = replace(p, server_rows_per_s=case.server_rows_per_s)
        for family in FAMILIES:
            blind, aware = (
                simulate(
                    case.trace,
                    server_bound_scenario(family, params, max_replicas, aware),
                    p.latency_objective_s,
                    seed,
                )
                for aware in (False, True)
            )
            pairs.append(Pair(case.server_rows_per_s, blind, aware))
    return runs, pairs


__all__ = [
    "FAMILIES",
    "MAX_REPLICAS",
    "SERVER_FULL",
    "Case",
    "Pair",
    "cases",
    "compare",
    "server_bound_scenario",
]
