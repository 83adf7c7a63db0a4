"""The autoscaling loop on real consumers, beside the simulator's prediction.

``python -m bench autoscale_real``: start the services, run the plan on each broker, print
the real run beside the simulated one, write JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from bench.autoscale.run import Outcome
from bench.autoscale_real.compare import agreement, comparison_table, simulate_same, to_json
from bench.autoscale_real.controller import ControllerSettings
from bench.autoscale_real.run import LONG_PLAN, SHORT_PLAN, RealRun, Setup, run_burst
from bench.autoscale_real.stack import Broker, Services, model_repository
from bench.help_text import description
from harness.service import REPO_ROOT, RunDir


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench autoscale_real", description=description(__doc__)
    )
    parser.add_argument("--broker", choices=("kafka", "pubsub", "both"), default="both")
    parser.add_argument("--short", action="store_true", help="the integration test's plan")
    parser.add_argument("--time-scale", type=float, default=None, help="default 10 short, 5 long")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    scale = args.time_scale or (10.0 if args.short else 5.0)
    setup = Setup(ControllerSettings(time_scale=scale))
    plan = SHORT_PLAN if args.short else LONG_PLAN
    brokers = cast(
        tuple[Broker, ...], ("kafka", "pubsub") if args.broker == "both" else (args.broker,)
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = RunDir(REPO_ROOT / ".stack" / "autoscale-real" / stamp)
    out = args.out or run_dir.root / "autoscale-real.json"
    print(f"Starting the services (logs under {run_dir.root}) ...", flush=True)
    pairs: list[tuple[RealRun, Outcome]] = []
    with contextlib.ExitStack() as stack:
        services = _start_services(stack, run_dir, brokers)
        for broker in brokers:
            print(f"[{broker}] {plan.describe()} ...", flush=True)
            real = run_burst(broker, services, plan, setup, run_dir.data(f"consumers-{broker}"))
            pairs.append((real, simulate_same(real)))
    print(comparison_table(pairs).render())
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": shlex.join(
            [Path(sys.executable).name, "-m", "bench", "autoscale_real", *list(argv or [])]
        ),
        "started_at": stamp,
        "runs": [to_json(real, sim) for real, sim in pairs],
    }
    out.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    print(f"\nresults in {out}")
    ok = all(all((r.checks() | agreement(r, sim)).values()) for r, sim in pairs)
    return 0 if ok else 1


def _start_services(
    stack: contextlib.ExitStack, run_dir: RunDir, brokers: Sequence[Broker]
) -> Services:
    from harness.kafka import KafkaService  # noqa: PLC0415 - only the services asked for
    from harness.postgres import PostgresService  # noqa: PLC0415
    from harness.pubsub import PubSubService  # noqa: PLC0415
    from harness.triton import TritonService  # noqa: PLC0415

    repo = model_repository(run_dir.data("models"))
    triton = stack.enter_context(TritonService(run_dir, repo, name="triton-autoscale"))
    postgres = stack.enter_context(PostgresService(run_dir))
    kafka = stack.enter_context(KafkaService(run_dir)) if "kafka" in brokers else None
    pubsub = stack.enter_context(PubSubService(run_dir)) if "pubsub" in brokers else None
    return Services(triton, postgres, kafka, pubsub)
