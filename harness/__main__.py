"""``python -m harness``: the local stack on 127.0.0.1.

python -m harness up      start Kafka, Pub/Sub, Triton, PostgreSQL, Prometheus; print where;
                          wait for Ctrl-C
python -m harness demo    start the stack, run the demo job end to end, stop everything
python -m harness server-venvs
                          make the model servers' own venvs (once per machine, cached under
                          ~/.cache/rowbatch/venvs) and print where they are; --prune
                          first removes the cached ones no server uses any more
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from harness.demo import DemoSettings, run_demo
from harness.errors import PrerequisiteMissing, ServiceFailed
from harness.jaeger import build_jaeger
from harness.server_venv import SERVER_VENVS, ensure_all, prune_stale
from harness.service import REPO_ROOT, RunDir
from harness.stack import StackEndpoints, local_stack

log = logging.getLogger("harness")

_EPILOG = """\
commands:
  up            start Kafka, Pub/Sub, Triton, PostgreSQL and Prometheus (and Jaeger with
                --jaeger), print where they listen, and wait for Ctrl-C
  demo          start the stack, run the demo job end to end, stop everything
  server-venvs  make the model servers' own venvs (once per machine, cached under
                ~/.cache/rowbatch/venvs) and print where they are
  jaeger-build  build Jaeger from the Go module proxy (once per machine, cached under
                ~/.cache/rowbatch) and print where it is
"""


def _print_stack(stack: StackEndpoints, env_file: Path) -> None:
    print("rowbatch local stack (all on 127.0.0.1):")
    print(stack.describe())
    env_file.write_text("".join(f"export {k}={v}\n" for k, v in stack.env().items()))
    print(f"Environment for other shells: source {env_file}")
    if stack.prometheus is not None:
        print(
            "Prometheus scrapes a consumer on the default metrics port (server.port) and "
            f"those listed in {env_file.parent / 'prometheus' / 'targets'}/*.json"
        )


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print("Stack is up; Ctrl-C (or SIGTERM) stops it.")
    stop.wait()


def _server_venvs(names: list[str], prune: bool) -> int:
    """Make the named server venvs (all when none are named); print each one's directory.
    ``prune``: first remove the cached venvs no server uses any more."""
    unknown = sorted(set(names) - set(SERVER_VENVS))
    if unknown:
        print(
            f"error: unknown server venvs {unknown}; known: {sorted(SERVER_VENVS)}", file=sys.stderr
        )
        return 2
    try:
        if prune:
            for path in prune_stale():
                print(f"removed stale {path}", file=sys.stderr)
        made = ensure_all(names or None)
    except PrerequisiteMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, path in made.items():
        print(f"{name}: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness",
        description="The rowbatch local stack on 127.0.0.1 (run from a checkout; not installed):\n"
        "Kafka, the Pub/Sub emulator, Triton, PostgreSQL and Prometheus.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        choices=["up", "demo", "server-venvs", "jaeger-build"],
        help="up: start the stack and wait; demo: run the demo job end to end; "
        "server-venvs: make the model servers' venvs; jaeger-build: build the trace backend "
        "the tracing tests use (minutes, once per machine)",
    )
    parser.add_argument(
        "names",
        nargs="*",
        help=f"server-venvs: which ones (default: all of {', '.join(SERVER_VENVS)})",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=REPO_ROOT / ".stack" / "local",
        metavar="DIR",
        help="where service data and logs go (default: .stack/local)",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="server-venvs: first remove cached venvs of older pins or interpreters",
    )
    parser.add_argument("--hold", action="store_true", help="demo: keep the stack up afterwards")
    parser.add_argument(
        "--jaeger",
        action="store_true",
        help="also start Jaeger, a trace backend (built with Go the first time: minutes); "
        "its OTLP endpoint goes into the printed environment (docs/tracing.md)",
    )
    parser.add_argument(
        "--rows", type=int, default=50_000, help="demo: rows to publish (default 50000)"
    )
    parser.add_argument(
        "--sink", choices=["sqlite", "postgres"], default="sqlite", help="demo: result table"
    )
    parser.add_argument(
        "--broker",
        choices=["pubsub", "kafka"],
        default="pubsub",
        help="demo: publish to and consume from the Pub/Sub emulator or Kafka",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.command == "server-venvs":
        return _server_venvs(args.names, args.prune)
    if args.command == "jaeger-build":
        print(build_jaeger())
        return 0
    if args.names:
        parser.error(f"{args.command} takes no names (only server-venvs does)")

    run = RunDir(args.run_dir)
    run.root.mkdir(parents=True, exist_ok=True)
    try:
        with local_stack(run, prometheus=True, jaeger=args.jaeger) as stack:
            _print_stack(stack, run.root / "stack.env")
            if args.command == "demo":
                run_demo(
                    stack,
                    DemoSettings(
                        rows=args.rows, sink=args.sink, broker=args.broker, sqlite_dir=run.root
                    ),
                )
            if args.command == "up" or args.hold:
                _wait_for_signal()
    except (PrerequisiteMissing, ServiceFailed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        print(f"Service logs: {run.root / 'logs'}", file=sys.stderr)
        return 2
    print("Stack stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
