"""``python -m bench``: start the local stack, run the chosen sections, print a table per
section and write everything to JSON.

    python -m bench                               everything (about an hour on 2 cores)
    python -m bench --only naive,saturation --repeat 3 --record NAME
                                                  three runs in one stack, kept in the repo as
                                                  bench/results/NAME.json (the figures, their
                                                  spread, the machine) and NAME.txt (the tables)
    python -m bench --only ceiling,e2e --rows 300000
    python -m bench --quick --only ceiling,overhead --out /tmp/bench.json
    python -m bench chaos [--short] [--broker pubsub|kafka|both]   the fault campaign
    python -m bench multi_endpoint [--rows N]     one consumer, one model server vs two
    python -m bench oip_servers [--servers ...]   rows/s per OIP server with 2, 4, 8 in flight
    python -m bench oip_e2e [--rows N]            the same through the consumer, end to end
    python -m bench server_admission [--repeat N] three consumers on a slow server: fixed vs
                                                  admitted windows (issue 48)
    python -m bench rollout [--repeat N] [--rows N]
                                                  one consumer with no candidate, a shadow, a
                                                  shadow whose candidate is down, a 10 % canary:
                                                  rows/s and CPU (docs/rollout.md)
    python -m bench share [--repeat N] [--rows N]  a Kafka share group with 1, 2, 4 consumer
                                                  processes on one partition against the classic
                                                  group with 1 and 4 (docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import (
    bad_rows,
    baseline,
    ceiling,
    e2e,
    generative,
    latency,
    machine,
    memory,
    overhead,
    per_message,
    queued,
    saturation,
    scaling,
    sinks,
    table_mode,
    versions,
)
from bench.help_text import description
from bench.report import Report, RunInfo
from bench.run_start import stop_cleanly_on_signals
from bench.stack import Bench, bench_stack, drop_pubsub_feeds
from bench.targets import check_targets
from harness.service import REPO_ROOT

SECTIONS = (
    "ceiling",
    "e2e",
    "naive",
    "overhead",
    "per_message",
    "latency",
    "memory",
    "scaling",
    "saturation",
    "table",
    "sinks",
    "queued",
    "bad_rows",
    "generative",
)
DEFAULT_SECTIONS = tuple(
    name for name in SECTIONS if name not in ("queued", "bad_rows", "generative")
)
"""What a run without ``--only`` runs (``queued`` publishes a million messages first;
``bad_rows``, issue 46's cost of isolating rows, and ``generative``, issue 47's window on the
fixed-step server, run on their own)."""
DEFAULT_ROWS = 200_000
QUICK_ROWS = 10_000


RESULTS_DIR = REPO_ROOT / "bench" / "results"
"""Recorded runs (``--record``), kept in the repository: the README and docs cite only these."""


@dataclass(frozen=True)
class BenchArgs:
    only: tuple[str, ...]
    rows: int
    quick: bool
    out: Path
    profile: bool
    repeat: int = 1
    record: str | None = None


def parse_args(argv: list[str] | None = None) -> BenchArgs:
    parser = argparse.ArgumentParser(prog="python -m bench", description=description(__doc__))
    parser.add_argument(
        "--only",
        default=",".join(DEFAULT_SECTIONS),
        help=(
            f"comma-separated sections to run (default: {','.join(DEFAULT_SECTIONS)}; also: queued)"
        ),
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help=f"backlog rows for e2e (default {DEFAULT_ROWS:,}; {QUICK_ROWS:,} with --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    parser.add_argument(
        "--no-profile",
        action="store_true",
        help="skip the py-spy runs of the overhead and per_message sections",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the selected sections this many times in one stack; the JSON gets every "
        "run and each figure's median, least and greatest value (default 1)",
    )
    parser.add_argument(
        "--record",
        metavar="NAME",
        default=None,
        help="keep this run in the repository: the JSON as bench/results/NAME.json (with the "
        "machine: cores, CPU model, load before and after, a CPU calibration) and the printed "
        "tables as bench/results/NAME.txt (instead of --out)",
    )
    args = parser.parse_args(argv)
    only = tuple(s.strip() for s in args.only.split(",") if s.strip())
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.record is not None:
        if args.out is not None:
            parser.error("--record and --out both name the JSON file: give one")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.record):
            parser.error(
                f"--record {args.record!r}: a file name of letters, digits, '.', '_' and '-'"
            )
    out = (
        RESULTS_DIR / f"{args.record}.json"
        if args.record is not None
        else args.out or REPO_ROOT / ".stack" / "bench" / f"results-{stamp}.json"
    )
    rows = args.rows if args.rows is not None else (QUICK_ROWS if args.quick else DEFAULT_ROWS)
    if rows < 1:
        parser.error("--rows must be at least 1")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    return BenchArgs(only, rows, args.quick, out, not args.no_profile, args.repeat, args.record)


def _sections(args: BenchArgs, done: dict[str, Any]) -> dict[str, Callable[[Bench], Any]]:
    return {
        "ceiling": ceiling.run,
        "e2e": lambda b: e2e.run(b, args.rows, done.get("ceiling")),
        "naive": baseline.run,
        "overhead": lambda b: overhead.run(b, args.profile),
        "per_message": lambda b: per_message.run(b, args.profile),
        "latency": lambda b: latency.run(b, done.get("e2e")),
        "memory": memory.run,
        "scaling": scaling.run,
        "saturation": saturation.run,
        "table": table_mode.run,
        "sinks": sinks.run,
        "queued": queued.run,
        "bad_rows": bad_rows.run,
        "generative": generative.run,
    }


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911, PLR0912 - one per subcommand
    given = sys.argv[1:] if argv is None else argv
    if given[:1] == ["chaos"]:  # a subcommand of its own: the fault campaign (docs/chaos.md)
        from bench import chaos  # noqa: PLC0415 - only when asked for

        return chaos.main(given[1:])
    if given[:1] == ["autoscale"]:  # the HPA/KEDA simulator, no services (docs/autoscaling.md)
        from bench import autoscale  # noqa: PLC0415 - only when asked for

        return autoscale.main(given[1:])
    if given[:1] == ["autoscale_real"]:  # its own stack: the HPA rule on real consumers
        from bench import autoscale_real  # noqa: PLC0415 - only when asked for

        return autoscale_real.main(given[1:])
    if given[:1] == ["multi_endpoint"]:  # its own stack: two tritonservers (docs/model-servers.md)
        from bench import multi_endpoint  # noqa: PLC0415 - only when asked for

        return multi_endpoint.main(given[1:])
    if given[:1] == ["oip_servers"]:  # its own servers: in-flight per OIP server (docs)
        from bench import oip_servers  # noqa: PLC0415 - only when asked for

        return oip_servers.main(given[1:])
    if given[:1] == ["oip_e2e"]:  # its own stack: consumer end to end per OIP server, in flight
        from bench import oip_e2e  # noqa: PLC0415 - only when asked for

        return oip_e2e.main(given[1:])
    if given[:1] == ["server_admission"]:  # its own stack: fixed vs admitted windows (issue 48)
        from bench import server_admission  # noqa: PLC0415 - only when asked for

        return server_admission.main(given[1:])
    if given[:1] == ["rollout"]:  # its own stack: shadow and canary against none
        from bench import rollout  # noqa: PLC0415 - only when asked for

        return rollout.main(given[1:])
    if given[:1] == ["share"]:  # its own stack: a share group past the partition count
        from bench import share  # noqa: PLC0415 - only when asked for

        return share.main(given[1:])
    args = parse_args(argv)
    stop_cleanly_on_signals()
    command = shlex.join([Path(sys.executable).name, "-m", "bench", *(argv or sys.argv[1:])])
    started = time.monotonic()
    here = machine.describe()
    print(f"Starting the local stack (logs under {REPO_ROOT / '.stack' / 'bench'}) ...", flush=True)
    with bench_stack(REPO_ROOT / ".stack" / "bench", args.quick) as bench:
        os.environ.update(bench.stack.pubsub.env())
        info = RunInfo(
            command=command,
            started_at=time.strftime("%Y-%m-%d %H:%M:%S %z"),
            versions=versions.collect(bench.stack),
            cpu_count=os.cpu_count() or 1,
            quick=args.quick,
            run_dir=str(bench.workdir.parent),
        )
        report = Report(info, args.out, here)
        print(info.header())
        print(f"  host      {here.header()}")
        print(f"  stack     ready in {time.monotonic() - started:.0f} s", flush=True)
        for repetition in range(1, args.repeat + 1):
            if repetition > 1:
                report.next_run()
            if args.repeat > 1:
                print(f"\n=== run {repetition} of {args.repeat} ===", flush=True)
            _run_sections(args, report, bench)
            report.targets = check_targets(report.sections)
        report.elapsed_s["total"] = round(time.monotonic() - started, 1)
        report.machine = machine.finish(here)
        if any(report.targets_by_run):
            print(report.targets_table().render())
        report.write()
    if args.record is not None:
        _write_tables(report, args.out.with_suffix(".txt"))
    print(f"\nTotal {time.monotonic() - started:.0f} s; results in {args.out}")
    return 1 if report.errors else 0


def _run_sections(args: BenchArgs, report: Report, bench: Bench) -> None:
    runners = _sections(args, report.sections)
    for name in SECTIONS:
        if name not in args.only:
            continue
        t0 = time.monotonic()
        print(f"\n[{name}] running ...", flush=True)
        try:
            result = runners[name](bench)
        except Exception as exc:  # noqa: BLE001 - one failed section must not lose the rest
            traceback.print_exc()
            report.fail(name, f"{type(exc).__name__}: {exc}", time.monotonic() - t0)
        else:
            report.add(name, result, time.monotonic() - t0)
        finally:
            _after_section(args, report, bench)


def _after_section(args: BenchArgs, report: Report, bench: Bench) -> None:
    """Free the emulator's heap for the next section and keep the recorded tables current, so
    a run that dies later still leaves what it measured."""
    try:
        drop_pubsub_feeds(bench.stack.pubsub)
    except Exception as exc:  # noqa: BLE001 - a failed clean-up is reported, not fatal
        print(f"  (could not drop the section's Pub/Sub topics: {exc})", flush=True)
    if args.record is not None:
        _write_tables(report, args.out.with_suffix(".txt"))


def _write_tables(report: Report, path: Path) -> None:
    """The printed tables of a recorded run, as docs cite them (``bench/cite.py``)."""
    parts = [report.info.header()]
    if report.machine is not None:
        parts.append(f"  host      {report.machine.header()}")
    for i, tables in enumerate(report.tables, 1):
        if len(report.tables) > 1:
            parts.append(f"\n=== run {i} of {len(report.tables)} ===")
        parts += list(tables.values())
    if any(report.targets_by_run):
        parts.append(report.targets_table().render())
    path.write_text("\n".join(parts) + "\n")
