"""One simulated run: a trace replayed second by second against one scenario (signal, HPA,
consumers), and what it cost and kept: end-to-end latency percentiles, time and rows over the
objective, replica-minutes against the clairvoyant minimum, and the scale events."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from itertools import pairwise

from bench.autoscale.fleet import Backlog, Replicas
from bench.autoscale.hpa import SYNC_PERIOD_S, Hpa
from bench.autoscale.oracle import minimum
from bench.autoscale.scenarios import Scenario
from bench.autoscale.signals import Observation
from bench.autoscale.traces import Trace

#: After the trace, keep draining (no arrivals) at most this long so every row is counted.
DRAIN_TAIL_S = 1800
#: Rates the signals see (arrivals, writes) are means over this many seconds.
RATE_WINDOW_S = 60


@dataclass(frozen=True)
class Outcome:
    """One trace under one scenario. Replica-minutes count over the trace's duration (pods
    asked for, started or not); latencies count every row, the drain after the trace included."""

    trace: str
    scenario: str
    broker: str
    setting: float
    setting_name: str
    rows: int
    p50_s: float
    p99_s: float
    max_s: float
    late_rows: float
    """Share of rows written later than the objective."""
    above_objective_s: int
    """Seconds in which the oldest waiting row was older than the objective."""
    replica_minutes: float
    minimum_replica_minutes: float
    minimum_holds: bool
    scale_ups: int
    scale_downs: int
    reversals: int
    """Scale events in the opposite direction to the one before (flapping)."""
    peak_replicas: int
    undrained_rows: float
    conserved: bool
    """Rows published == rows written + rows left."""

    @property
    def cost_ratio(self) -> float:
        return self.replica_minutes / max(1e-9, self.minimum_replica_minutes)


def percentile(histogram: dict[int, float], q: float) -> float:
    """The ``q`` quantile (0..1) of a ``{value: weight}`` histogram (0 when empty)."""
    total = sum(histogram.values())
    if total <= 0:
        return 0.0
    need = q * total
    seen = 0.0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= need - 1e-9:
            return float(value)
    return float(max(histogram))


def simulate(trace: Trace, sc: Scenario, objective_s: float, seed: int) -> Outcome:
    rng = random.Random(f"{seed}-{trace.name}-{sc.name}-{sc.setting}")  # noqa: S311 - not crypto
    signal = sc.signal(rng)
    fleet = sc.fleet
    backlog = Backlog()
    replicas = Replicas(fleet)
    first_minute = trace.rows[:RATE_WINDOW_S]
    start = fleet.replicas_for(sum(first_minute) / max(1, len(first_minute)))
    replicas.start(min(sc.max_replicas, max(sc.min_replicas, start)), 0.0, ready=True)
    hpa = Hpa(sc.min_replicas, sc.max_replicas, sc.behavior)
    arrived: deque[float] = deque(maxlen=RATE_WINDOW_S)
    written: deque[float] = deque(maxlen=RATE_WINDOW_S)
    published_rows = published_messages = 0.0
    replica_seconds = 0.0
    above = 0
    peak = replicas.count
    t = 0
    while t < trace.duration_s + DRAIN_TAIL_S:
        rows = float(trace.rows[t]) if t < trace.duration_s else 0.0
        messages = float(trace.messages[t]) if t < trace.duration_s else 0.0
        if t >= trace.duration_s and backlog.rows <= 0:
            break
        backlog.publish(t, rows, messages)
        published_rows += rows
        published_messages += messages
        if t > 0 and t % SYNC_PERIOD_S == 0:
            replicas.scale_to(hpa.sync(t, replicas.count, signal.proposals(t, replicas.count)), t)
        waiting, waiting_rows = backlog.messages, backlog.rows
        capacity = replicas.drain_rate(t)
        ready = replicas.ready(t)
        done = backlog.drain(t, capacity)
        unsettled = (waiting - backlog.messages) * fleet.unsettled_s
        arrived.append(rows)
        written.append(done)
        signal.observe(
            Observation(
                t=t,
                backlog_messages=backlog.messages + unsettled,
                oldest_age_s=backlog.oldest_age_s(t),
                arrival_rows_per_s=sum(arrived) / len(arrived),
                written_rows_per_s=sum(written) / len(written),
                rows_per_message=published_rows / max(1.0, published_messages),
                ready=ready,
                server_saturated=capacity > 0 and fleet.server_saturated(ready, waiting_rows),
            )
        )
        if t < trace.duration_s:
            replica_seconds += replicas.count
            peak = max(peak, replicas.count)
        if backlog.oldest_age_s(t) > objective_s:
            above += 1
        t += 1
    return _outcome(
        trace,
        sc,
        objective_s,
        backlog=backlog,
        hpa=hpa,
        replica_seconds=replica_seconds,
        above=above,
        peak=peak,
    )


def _outcome(
    trace: Trace,
    sc: Scenario,
    objective_s: float,
    *,
    backlog: Backlog,
    hpa: Hpa,
    replica_seconds: float,
    above: int,
    peak: int,
) -> Outcome:
    hist = backlog.latency_rows
    written = sum(hist.values())
    late = sum(rows for latency, rows in hist.items() if latency > objective_s)
    directions = [1 if e.after > e.before else -1 for e in hpa.events]
    reversals = sum(1 for a, b in pairwise(directions) if a != b)
    floor = minimum(trace, sc.fleet, objective_s, sc.min_replicas)
    return Outcome(
        trace=trace.name,
        scenario=sc.name,
        broker=sc.broker,
        setting=sc.setting,
        setting_name=sc.setting_name,
        rows=trace.total_rows,
        p50_s=percentile(hist, 0.50),
        p99_s=percentile(hist, 0.99),
        max_s=float(max(hist, default=0)),
        late_rows=late / written if written else 0.0,
        above_objective_s=above,
        replica_minutes=replica_seconds / 60,
        minimum_replica_minutes=floor.replica_seconds / 60,
        minimum_holds=floor.holds,
        scale_ups=sum(1 for d in directions if d > 0),
        scale_downs=sum(1 for d in directions if d < 0),
        reversals=reversals,
        peak_replicas=peak,
        undrained_rows=backlog.rows,
        conserved=math.isclose(backlog.rows_in, backlog.rows_out + backlog.rows, rel_tol=1e-9),
    )
