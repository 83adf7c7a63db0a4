"""``python -m bench autoscale``: the HPA/KEDA loop simulated for each scaling signal.

Replays arrival traces, prints a table per run and the target sweep, writes JSON. Runs in
seconds; no services needed. See docs/autoscaling.md.

    python -m bench autoscale                          the manifests' targets, then the sweep
    python -m bench autoscale --no-sweep --seed 3 --out /tmp/autoscale.json
    python -m bench autoscale --pod-startup-s 90 --server-rows-per-s 400000
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path

from bench.autoscale import traces
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
    args = parser.parse_args(argv)
    params = Params(**{f.name: getattr(args, f.name) for f in fields(Params)})
    if args.seeds < 1:
        parser.error("--seeds must be at least 1")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO_ROOT / ".stack" / "bench" / f"autoscale-{stamp}.json"
    return AutoscaleArgs(params, args.seed, args.seeds, not args.no_sweep, out)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
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
    run = {
        "command": shlex.join([Path(sys.executable).name, "-m", "bench", "autoscale", *argv]),
        "started_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "seed": args.seed,
        "seeds": args.seeds,
        "elapsed_s": round(time.monotonic() - started, 1),
    }
    payload = to_json(run, p, standard, outcomes, rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nTotal {time.monotonic() - started:.1f} s; results in {args.out}")
    if not payload["ok"]:
        print("FAILED: rows not conserved in some run (a simulator bug)")
    return 0 if payload["ok"] else 1
