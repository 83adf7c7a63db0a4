"""``python -m bench chaos``: a fault campaign against real ``rowbatch-consumer run`` processes
on the real stack (Kafka, the Pub/Sub emulator, Triton, PostgreSQL). Each fault has its own
topic and result table per broker; each prints a table row and goes into the JSON. Exits 1 on
any loss, duplicate, wrong dead letter, consumer exit the fault did not cause, or memory over
the budget. See docs/chaos.md.

    python -m bench chaos                           every fault, both brokers (about 10 min)
    python -m bench chaos --short --broker kafka    the CI-sized variant on one broker
    python -m bench chaos --faults kill-9,poison --seed 7 --out /tmp/chaos.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.chaos_audit import FaultRow
from bench.chaos_faults import FAULTS, FULL, SHARED_FAULTS, SHORT, Campaign, run_local, run_shared
from bench.chaos_poison import REJECT_MARKER
from bench.help_text import description
from bench.report import Table
from bench.stack import BROKERS, Broker
from harness.chaos import ChaosControl
from harness.faults import fault_stack
from harness.service import REPO_ROOT, RunDir


@dataclass(frozen=True)
class ChaosArgs:
    brokers: tuple[Broker, ...]
    short: bool
    out: Path
    seed: int
    faults: tuple[str, ...]


def parse_args(argv: list[str]) -> ChaosArgs:
    parser = argparse.ArgumentParser(prog="python -m bench chaos", description=description(__doc__))
    parser.add_argument("--broker", choices=("pubsub", "kafka", "both"), default="both")
    parser.add_argument("--short", action="store_true", help="CI sizes (about 3 min, both)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument("--seed", type=int, default=0, help="seeds kill times and poison order")
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}"
    )
    args = parser.parse_args(argv)
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    unknown = [f for f in faults if f not in FAULTS]
    if unknown or not faults:
        parser.error(f"unknown fault(s) {unknown}; choose from {', '.join(FAULTS)}")
    brokers: tuple[Broker, ...] = BROKERS if args.broker == "both" else (args.broker,)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or REPO_ROOT / ".stack" / "chaos" / f"chaos-{stamp}.json"
    return ChaosArgs(brokers, args.short, out, args.seed, faults)


def _dlq(counts: dict[str, int]) -> str:
    return str(sum(counts.values()))


def _recovery(row: FaultRow) -> str:
    values = [v for v in row.recovery_s if v is not None]
    if not row.recovery_s:
        return "-"
    text = f"{max(values):.1f} s" if values else "never"
    return text + ("" if len(values) == len(row.recovery_s) else " (!)")


def _exits(row: FaultRow) -> str:
    expected = sum(1 for e in row.exits if e["expected"])
    codes = ",".join(str(e["code"]) for e in row.exits if not e["expected"])
    return f"{expected}" + (f" +{row.unexpected_exits} [{codes}]" if codes else "")


COLUMNS = (
    "fault",
    "broker",
    "rows",
    "written",
    "dup",
    "missing",
    "DLQ exp/got",
    "wrong DLQ",
    "redeliv",
    "recovery",
    "exits",
    "peak RSS",
    "result",
)


def table(rows: list[FaultRow], short: bool) -> Table:
    return Table(
        f"Chaos campaign{' (--short)' if short else ''}: every row once, or dead-lettered "
        "with its reason",
        COLUMNS,
        tuple(
            (
                r.fault,
                r.broker,
                f"{r.rows_published:,}",
                f"{r.rows_written:,}",
                str(r.duplicated),
                str(r.missing),
                f"{_dlq(r.dead_letters_expected)}/{_dlq(r.dead_letters_actual)}",
                str(r.wrongly_dead_lettered + r.wrong_reason + r.poison_written),
                str(r.redeliveries),
                _recovery(r),
                _exits(r),
                f"{r.peak_rss_mib:.0f}/{r.rss_limit_mib:.0f}",
                "ok" if r.ok else "FAIL",
            )
            for r in rows
        ),
        (
            "rows: published; written: rows in the table; dup: rows written twice, repeated or "
            "also dead-lettered; missing: neither written nor dead-lettered; DLQ: dead-letter "
            "records expected/read back; wrong DLQ: good rows dead-lettered + poison with the "
            "wrong reason/code + poison written; redeliv: messages received minus published; "
            "recovery: longest fault end -> next row written; exits: kill -9 exits "
            "+ others [codes]; peak RSS: MiB, limit budget + 150 MB.",
        ),
    )


def _failures(rows: list[FaultRow]) -> str:
    return "\n".join(f"  {r.fault}/{r.broker}: {'; '.join(r.failures)}" for r in rows if r.failures)


def write(out: Path, payload: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    run = RunDir(REPO_ROOT / ".stack" / "chaos" / time.strftime("%Y%m%d-%H%M%S"))
    run.root.mkdir(parents=True, exist_ok=True)
    rows: list[FaultRow] = []
    errors: dict[str, str] = {}
    elapsed: dict[str, float] = {}
    payload: dict[str, Any] = {
        "run": {
            "command": shlex.join([Path(sys.executable).name, "-m", "bench", "chaos", *argv]),
            "started_at": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "short": args.short,
            "seed": args.seed,
            "brokers": list(args.brokers),
            "faults": list(args.faults),
            "run_dir": str(run.root),
            "cpu_count": os.cpu_count() or 1,
        },
    }

    def save() -> None:
        payload.update(
            elapsed_s=elapsed,
            faults=[r.to_json() for r in rows],
            errors=errors,
            ok=not errors and all(r.ok for r in rows),
        )
        write(args.out, payload)

    print(f"Starting the local stack (logs under {run.root / 'logs'}) ...", flush=True)
    with fault_stack(run) as fs:
        os.environ.update(fs.endpoints.pubsub.env())
        ChaosControl(reject_marker=REJECT_MARKER).write(fs.endpoints.triton.chaos_control)
        elapsed["stack"] = round(time.monotonic() - started, 1)
        print(f"  stack ready in {elapsed['stack']:.0f} s", flush=True)
        campaign = Campaign(fs, run.data("lanes"), SHORT if args.short else FULL, args.seed)
        steps: list[tuple[str, Any]] = [("local faults", lambda: run_local(
            campaign, args.faults, args.brokers))]  # fmt: skip
        steps += [
            (f, lambda f=f: run_shared(campaign, f, args.brokers))
            for f in SHARED_FAULTS
            if f in args.faults
        ]
        for name, step in steps:
            if name == "local faults" and not set(args.faults) - set(SHARED_FAULTS):
                continue
            t0 = time.monotonic()
            print(f"\n[{name}] running ...", flush=True)
            try:
                got = step()
            except Exception as exc:  # noqa: BLE001 - report it and go on
                traceback.print_exc()
                errors[name] = f"{type(exc).__name__}: {exc}"
                got = []
            rows += got
            elapsed[name] = round(time.monotonic() - t0, 1)
            print(table(got, args.short).render() if got else "", flush=True)
            print(f"  ({name}: {elapsed[name]:.0f} s)", flush=True)
            save()
    elapsed["total"] = round(time.monotonic() - started, 1)
    save()
    print(table(rows, args.short).render())
    if not payload["ok"]:
        print("\nFAILED:\n" + _failures(rows))
        for name, error in errors.items():
            print(f"  {name}: {error}")
    print(f"\nTotal {elapsed['total']:.0f} s; results in {args.out}")
    return 0 if payload["ok"] else 1
