"""The autoscaling simulator's tables (in ``bench.report``'s :class:`Table` format) and its
JSON: every run at the manifests' targets, the sweep, and the targets it recommends."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from bench.autoscale.run import Outcome
from bench.autoscale.scenarios import Params
from bench.autoscale.sweep import CHOICE_TRACES, SweepRow
from bench.autoscale.traces import Trace
from bench.report import Table


def setting(value: float, name: str) -> str:
    if name == "messages/pod":
        return f"{value:g} msg/pod"
    if name == "lagThreshold":
        return f"lag {value:g}/pod"
    return f"T {value:g} s"


def _pct(value: float) -> str:
    return f"{value:.1%}" if value else "0"


def runs_table(outcomes: Sequence[Outcome], p: Params) -> Table:
    targets = ", ".join(dict.fromkeys(setting(o.setting, o.setting_name) for o in outcomes))
    return Table(
        f"Autoscaling simulation: latency objective {p.latency_objective_s:g} s; targets {targets}",
        (
            "trace",
            "signal",
            "target",
            "p50 s",
            "p99 s",
            "max s",
            "late",
            "over s",
            "repl-min",
            "min",
            "x min",
            "up/down",
            "flaps",
            "peak",
        ),
        tuple(
            (
                o.trace,
                o.scenario,
                setting(o.setting, o.setting_name),
                f"{o.p50_s:.0f}",
                f"{o.p99_s:.0f}",
                f"{o.max_s:.0f}",
                _pct(o.late_rows),
                str(o.above_objective_s),
                f"{o.replica_minutes:.0f}",
                f"{o.minimum_replica_minutes:.0f}" + ("" if o.minimum_holds else "!"),
                f"{o.cost_ratio:.2f}",
                f"{o.scale_ups}/{o.scale_downs}",
                str(o.reversals),
                str(o.peak_replicas),
            )
            for o in outcomes
        ),
        (
            "Latency: publish to written, 1 s resolution (a row written in the second it was "
            "published counts 1 s); late: rows over the objective; over s: seconds in which the "
            "oldest waiting row was older than the objective; repl-min: replica-minutes over the "
            "trace (pods asked for, started or not); min: a clairvoyant autoscaler's (no delays, "
            "any count every second; ! = even it misses the objective); up/down: scale events; "
            "flaps: events reversing the previous one's direction; peak: most replicas.",
            f"Per replica {p.pubsub_rows_per_s:,.0f} rows/s (Pub/Sub), {p.kafka_rows_per_s:,.0f} "
            f"(Kafka, {p.partitions} partitions); model servers {p.server_rows_per_s:,.0f} rows/s "
            f"in all; pods start {p.pod_startup_s:g} s after the scale-up; Kafka groups pause "
            f"{p.rebalance_pause_s:g} s per membership change.",
        ),
    )


def sweep_table(rows: Sequence[SweepRow], p: Params, seeds: int) -> Table:
    return Table(
        f"Targets swept: {', '.join(CHOICE_TRACES)} x {seeds} seeds, objective "
        f"{p.latency_objective_s:g} s ('<-': chosen)",
        ("signal", "target", "late", "worst p99 s", "step p99 s", "repl-min", "x min", "flaps", ""),
        tuple(
            (
                r.scenario,
                setting(r.setting, r.setting_name),
                _pct(r.late_rows),
                f"{r.worst_p99_s:.0f}",
                f"{r.step_p99_s:.0f}",
                f"{r.replica_minutes:.0f}",
                f"{r.cost_ratio:.2f}",
                str(r.steady_reversals),
                "<-" if r.chosen else "",
            )
            for r in rows
        ),
        (
            "late: rows over the objective on these traces; repl-min: mean per seed; flaps: "
            "direction reversals on the steady trace (the worst seed). Chosen: the cheapest "
            "target whose late rows are within 10 % of the signal's best.",
        ),
    )


def trace_table(traces: Sequence[Trace]) -> Table:
    return Table(
        "Traces",
        ("trace", "duration", "rows", "rows/msg", "peak rows/s", "shape"),
        tuple(
            (
                t.name,
                f"{t.duration_s // 60} min",
                f"{t.total_rows:,}",
                f"{t.mean_rows_per_message:.0f}",
                f"{t.peak_rows_per_s:,}",
                t.description,
            )
            for t in traces
        ),
    )


def to_json(
    run: dict[str, Any],
    p: Params,
    traces: Sequence[Trace],
    outcomes: Sequence[Outcome],
    rows: Sequence[SweepRow],
) -> dict[str, Any]:
    return {
        "run": run,
        "params": dataclasses.asdict(p),
        "traces": [
            {
                "name": t.name,
                "description": t.description,
                "duration_s": t.duration_s,
                "rows": t.total_rows,
                "messages": t.total_messages,
                "peak_rows_per_s": t.peak_rows_per_s,
            }
            for t in traces
        ],
        "runs": [{**dataclasses.asdict(o), "cost_ratio": o.cost_ratio} for o in outcomes],
        "sweep": [{**dataclasses.asdict(r), "cost_ratio": r.cost_ratio} for r in rows],
        "recommended": {
            r.scenario: {r.setting_name: r.setting, "late_rows": r.late_rows}
            for r in rows
            if r.chosen
        },
        "ok": all(o.conserved for o in outcomes),
    }
