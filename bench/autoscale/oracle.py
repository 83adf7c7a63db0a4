"""The fewest replica-seconds that would have held the latency objective on a trace: a
clairvoyant autoscaler with no metric delay, no start-up time and a free choice of replicas
every second. It writes every row by its deadline (publish second + objective), buying
replicas only for rows due now (and earlier where the drain cap would otherwise miss a later
deadline), and uses the replicas it has to write ahead. The reference the report compares
each signal's replica-minutes with."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from bench.autoscale.fleet import FleetParams
from bench.autoscale.traces import Trace


@dataclass(frozen=True)
class Minimum:
    replica_seconds: float
    holds: bool
    """False when even this autoscaler misses a deadline (the trace needs more than the
    model server or the partitions allow)."""


def minimum(trace: Trace, fleet: FleetParams, objective_s: float, min_replicas: int = 1) -> Minimum:
    """Replica-seconds over the trace's duration (rows due after its end are not charged)."""
    duration = trace.duration_s
    published = list(accumulate(trace.rows))
    window = max(1, int(objective_s))  # a row published in second s is due by s + window - 1
    top = fleet.drain_rate(fleet.useful_replicas())
    need = [0.0] * duration
    later = 0.0
    for t in range(duration - 1, -1, -1):
        due = published[t - window + 1] if t - window + 1 >= 0 else 0.0
        later = max(due, later - top)
        need[t] = later
    done = 0.0
    cost = 0.0
    holds = True
    for t in range(duration):
        short = need[t] - done
        n = max(min_replicas, fleet.replicas_for(short) if short > 0 else min_replicas)
        done = min(float(published[t]), done + fleet.drain_rate(n))
        holds = holds and done >= need[t] - 1e-6
        cost += n
    return Minimum(cost, holds)
