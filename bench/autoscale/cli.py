"""``python -m bench autoscale``: the HPA/KEDA loop simulated for each scaling signal.

Replays arrival traces, prints a table per run and the target sweep, writes JSON. Runs in
seconds; no services needed. See docs/autoscaling.md.

    python -m bench autoscale                          the manifests' targets, then the sweep
    python -m bench autoscale --no-sweep --seed 3 --out /tmp/autoscale.json
    python -m bench autoscale --pod-startup-s 90 --server-rows-per-s 400000
    python -m bench autoscale --only server-bound      servers below the peak, with and
                                                       without the server-saturated safeguard
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from bench.autoscale import server_bound, server_bound_report, traces
from bench.autoscale.report import runs_table, sweep_table, to_json, trace_table
from bench.autoscale.run import Outcome, simulate
from bench.autoscale.scenarios import FAMILIES, Params, scenario
from bench.autoscale.sweep import SweepRow, sweep
from bench.help_text import description
from harness.service import REPO_ROOT


@dataclass(frozen=True)
class AutoscaleArgs:
    params: Params
    seed: int
    seeds: int
    sweep: bool
    out: Path
    only: str | None = None
    """``server-bound``: only the server-bound comparison."""
    max_replicas: int = server_bound.MAX_REPLICAS
    """The server-bound comparison's configured ``max_replicas``."""


def parse_args(argv: list[str]) -> AutoscaleArgs:
    parser = argparse.ArgumentParser(
        prog="python -m bench autoscale", description=description(__doc__)
    )
    defaults = Params()
    for f in fields(Params):
        value = getattr(defaults, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
        else:
            parser.add_argument(flag, type=type(value), default=value, help=f"default {value:g}")
    parser.add_argument("--seed", type=int, default=0, help="seeds the traces and metric delays")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per sweep point (default 5)")
    parser.add_argument("--no-sweep", action="store_true", help="only the manifests' targets")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument(
        "--only",
        choices=("server-bound",),
        default=None,
        help="server-bound: only model servers slower than the peak (step-x5 on 100,000 "
        "rows/s, steady on 40,000), rowbatch's figure with and without the server-saturated "
        "safeguard",
    )
    parser.add_argument(
        "--max-replicas",
        type=int,
        default=server_bound.MAX_REPLICAS,
        help=f"server-bound: max_replicas as configured (default {server_bound.MAX_REPLICAS})",
    )
    args = parser.parse_args(argv)
    params = Params(**{f.name: getattr(args, f.name) for f in fields(Params)})
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    if args.max_replicas < 1:
        parser.error("--max-replicas must be at least 1")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO_ROOT / ".stack" / "bench" / f"autoscale-{stamp}.json"
    return AutoscaleArgs(
        params, args.seed, args.seeds, not args.no_sweep, out, args.only, args.max_replicas
    )


def _run(argv: list[str], args: AutoscaleArgs, started: float) -> dict[str, Any]:
    return {
        "command": shlex.join([Path(sys.executable).name, "-m", "bench", "autoscale", *argv]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "seed": args.seed,
        "seeds": args.seeds,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def _finish(payload: dict[str, Any], out: Path, started: float) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nTotal {time.monotonic() - started:.1f} s; results in {out}")
    if not payload["ok"]:
        print("FAILED: rows not conserved in some run (a simulator bug)")
    return 0 if payload["ok"] else 1


def _server_bound(argv: list[str], args: AutoscaleArgs, started: float) -> int:
    p = args.params
    cases, pairs = server_bound.compare(p, args.seed, args.max_replicas)
    print(trace_table([c.trace for c in cases]).render())
    print(server_bound_report.runs_table(pairs, p, args.max_replicas).render())
    print(server_bound_report.savings_table(pairs).render())
    run = _run(argv, args, started)
    del run["seeds"]  # one seed: no sweep
    payload = server_bound_report.to_json(run, p, args.max_replicas, cases, pairs)
    return _finish(payload, args.out, started)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if args.only == "server-bound":
        return _server_bound(argv, args, started)
    p = args.params
    standard = traces.standard(args.seed)
    print(trace_table(standard).render())
    outcomes: list[Outcome] = [
        simulate(trace, scenario(family, p), p.latency_objective_s, args.seed)
        for trace in standard
        for family in FAMILIES
    ]
    print(runs_table(outcomes, p).render())
    rows: list[SweepRow] = []
    if args.sweep:
        by_seed = [(s, traces.standard(s)) for s in range(args.seed, args.seed + args.seeds)]
        rows = sweep(by_seed, p)
        print(sweep_table(rows, p, args.seeds).render())
    payload = to_json(_run(argv, args, started), p, standard, outcomes, rows)
    return _finish(payload, args.out, started)
