"""The server-bound comparison's tables (``bench.report``'s :class:`Table`) and JSON: every
run, then each case and broker blind and with the server-saturated safeguard side by side."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from bench.autoscale.consumer_figure import SERVER_STATISTICS
from bench.autoscale.report import setting
from bench.autoscale.scenarios import Params
from bench.autoscale.server_bound import Case, Pair
from bench.report import Table
from rowbatch.consumer.observe.scaling import SERVER_FULL_HEADROOM


def _late(value: float) -> str:
    return f"{value:.1%}" if value else "0"


def runs_table(pairs: Sequence[Pair], p: Params, max_replicas: int) -> Table:
    outcomes = [(pair.server_rows_per_s, o) for pair in pairs for o in (pair.blind, pair.aware)]
    return Table(
        f"Server-bound autoscaling: model servers below the peak, max_replicas {max_replicas}, "
        f"objective {p.latency_objective_s:g} s",
        (
            "trace",
            "servers rows/s",
            "signal",
            "target",
            "p50 s",
            "p99 s",
            "max s",
            "late",
            "repl-min",
            "min",
            "up/down",
            "flaps",
            "peak",
        ),
        tuple(
            (
                o.trace,
                f"{server:,.0f}",
                o.scenario,
                setting(o.setting, o.setting_name),
                f"{o.p50_s:.0f}",
                f"{o.p99_s:.0f}",
                f"{o.max_s:.0f}",
                _late(o.late_rows),
                f"{o.replica_minutes:.0f}",
                f"{o.minimum_replica_minutes:.0f}" + ("" if o.minimum_holds else "!"),
                f"{o.scale_ups}/{o.scale_downs}",
                str(o.reversals),
                str(o.peak_replicas),
            )
            for server, o in outcomes
        ),
        (
            "Columns as in the autoscaling simulation's table; min: a clairvoyant autoscaler's "
            "replica-minutes (! = the servers cannot hold the objective: every signal is late).",
            f"+server-full: the rate term alone, x {1 + SERVER_FULL_HEADROOM:g} "
            "(SERVER_FULL_HEADROOM, never above the figure with the backlog), while "
            "rowbatch_server_saturated holds (the "
            "consumer's Conditions.server_full: at least 90 % of the samples over 10 s, the "
            f"saturation read {SERVER_STATISTICS.delay_min_s:g}-"
            f"{SERVER_STATISTICS.delay_max_s:g} s late from the server's statistics); without "
            f"it, the figure as before, up to max_replicas (Kafka: the {p.partitions} "
            "partitions). Both computed by the consumer's ScalingSignal and Safeguards.",
            f"Per replica {p.pubsub_rows_per_s:,.0f} rows/s (Pub/Sub), {p.kafka_rows_per_s:,.0f} "
            f"(Kafka, {p.partitions} partitions); pods start {p.pod_startup_s:g} s after the "
            f"scale-up; Kafka groups pause {p.rebalance_pause_s:g} s per membership change.",
        ),
    )


def _pct(value: float) -> str:
    return f"{value:.0%}"


def savings_table(pairs: Sequence[Pair]) -> Table:
    return Table(
        "Server-saturated safeguard: without -> with",
        (
            "trace",
            "servers rows/s",
            "broker",
            "repl-min",
            "saved",
            "p50 s",
            "p99 s",
            "late",
            "peak",
            "flaps",
        ),
        tuple(
            (
                pair.blind.trace,
                f"{pair.server_rows_per_s:,.0f}",
                pair.blind.broker,
                f"{pair.blind.replica_minutes:.0f} -> {pair.aware.replica_minutes:.0f}",
                _pct(pair.saved_share),
                f"{pair.blind.p50_s:.0f} -> {pair.aware.p50_s:.0f}",
                f"{pair.blind.p99_s:.0f} -> {pair.aware.p99_s:.0f}",
                f"{_late(pair.blind.late_rows)} -> {_late(pair.aware.late_rows)}",
                f"{pair.blind.peak_replicas} -> {pair.aware.peak_replicas}",
                f"{pair.blind.reversals} -> {pair.aware.reversals}",
            )
            for pair in pairs
        ),
        ("saved: replica-minutes the safeguard saves, as a share of those without it.",),
    )


def to_json(
    run: dict[str, Any], p: Params, max_replicas: int, cases: Sequence[Case], pairs: Sequence[Pair]
) -> dict[str, Any]:
    params = dataclasses.asdict(p)
    del params["server_rows_per_s"]  # each case's own
    return {
        "run": run,
        "params": params,
        "max_replicas": max_replicas,
        "server_statistics": dataclasses.asdict(SERVER_STATISTICS),
        "server_full_headroom": SERVER_FULL_HEADROOM,
        "cases": [
            {
                "trace": c.trace.name,
                "description": c.trace.description,
                "duration_s": c.trace.duration_s,
                "rows": c.trace.total_rows,
                "peak_rows_per_s": c.trace.peak_rows_per_s,
                "server_rows_per_s": c.server_rows_per_s,
            }
            for c in cases
        ],
        "pairs": [
            {
                "server_rows_per_s": pair.server_rows_per_s,
                "without": {**dataclasses.asdict(pair.blind), "cost_ratio": pair.blind.cost_ratio},
                "with": {**dataclasses.asdict(pair.aware), "cost_ratio": pair.aware.cost_ratio},
                "saved_replica_minutes": pair.saved_replica_minutes,
                "saved_share": pair.saved_share,
            }
            for pair in pairs
        ],
        "ok": all(o.conserved for pair in pairs for o in (pair.blind, pair.aware)),
    }


__all__ = ["runs_table", "savings_table", "to_json"]
