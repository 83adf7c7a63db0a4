"""The recommendation: every signal at a range of targets, over several seeds of the traces
an autoscaler can follow (steady, step, daily), and per signal the cheapest target whose late
rows are within 10 % of that signal's best. Bursts from idle are left out of the choice: no
reactive signal holds them (a pod cannot start within the objective), the table shows them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from bench.autoscale.run import Outcome, simulate
from bench.autoscale.scenarios import FAMILIES, Params, scenario, sweep_settings
from bench.autoscale.traces import Trace

#: The traces the choice is made on.
CHOICE_TRACES = ("steady", "step-x5", "daily-sine")
#: A setting counts as good as the best when its late-row share is within this factor of the
#: best's (plus :data:`SLACK_POINTS`): differences that small are the traces' noise.
NEAR_BEST = 1.10
SLACK_POINTS = 0.001


@dataclass(frozen=True)
class SweepRow:
    """One signal at one setting, summed over the choice traces and the seeds."""

    scenario: str
    setting: float
    setting_name: str
    late_rows: float
    """Rows later than the objective / rows, over the choice traces."""
    worst_p99_s: float
    """The highest p99 of any choice trace and seed."""
    step_p99_s: float
    """The step trace's p99 (the worst seed)."""
    replica_minutes: float
    """Mean per seed, over the choice traces."""
    minimum_replica_minutes: float
    steady_reversals: int
    """Scale-direction reversals on the steady trace (the most over the seeds): flapping."""
    chosen: bool = False

    @property
    def cost_ratio(self) -> float:
        return self.replica_minutes / max(1e-9, self.minimum_replica_minutes)


def _row(outcomes: Sequence[Outcome], seeds: int) -> SweepRow:
    rows = sum(o.rows for o in outcomes)
    first = outcomes[0]
    return SweepRow(
        scenario=first.scenario,
        setting=first.setting,
        setting_name=first.setting_name,
        late_rows=sum(o.late_rows * o.rows for o in outcomes) / max(1, rows),
        worst_p99_s=max(o.p99_s for o in outcomes),
        step_p99_s=max((o.p99_s for o in outcomes if o.trace.startswith("step")), default=0.0),
        replica_minutes=sum(o.replica_minutes for o in outcomes) / seeds,
        minimum_replica_minutes=sum(o.minimum_replica_minutes for o in outcomes) / seeds,
        steady_reversals=max((o.reversals for o in outcomes if o.trace == "steady"), default=0),
    )


def choose(rows: Sequence[SweepRow]) -> SweepRow:
    """The cheapest row whose late share is within :data:`NEAR_BEST` of the lowest."""
    best = min(r.late_rows for r in rows)
    near = [r for r in rows if r.late_rows <= best * NEAR_BEST + SLACK_POINTS]
    return min(near, key=lambda r: (r.replica_minutes, r.late_rows))


def sweep(
    traces_by_seed: Sequence[tuple[int, Sequence[Trace]]],
    params: Params,
    families: Sequence[str] = FAMILIES,
) -> list[SweepRow]:
    """Every family at each of its sweep settings; the chosen one per family marked."""
    out: list[SweepRow] = []
    for family in families:
        rows = []
        for setting in sweep_settings(family, params):
            sc = scenario(family, params, setting)
            outcomes = [
                simulate(trace, sc, params.latency_objective_s, seed)
                for seed, traces in traces_by_seed
                for trace in traces
                if trace.name in CHOICE_TRACES
            ]
            rows.append(_row(outcomes, len(traces_by_seed)))
        pick = choose(rows)
        out += [replace(r, chosen=r is pick) for r in rows]
    return out
