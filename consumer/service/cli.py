"""The rowbatch-consumer command (also python -m rowbatch.consumer): run the subscriber service,
check its configuration, or create what it needs on the broker. The help text (DESCRIPTION, EPILOG)
says how; the exit codes of admin ensure are consumer/service/admin.py's."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import tracemalloc
from pathlib import Path

from rowbatch.consumer.engine.pipeline import PipelineFailed
from rowbatch.consumer.model.binding import Binding, BindingError, check_binding
from rowbatch.consumer.model.discovery import ModelDiscoveryError
from rowbatch.consumer.model.spec import ModelConfigError
from rowbatch.consumer.observe.memory import dump_traced, return_freed_memory
from rowbatch.consumer.service import admin, logs
from rowbatch.consumer.service.build_io import check_source_credentials
from rowbatch.consumer.service.build_model import (
    check_endpoints,
    describe_batching,
    describe_origin,
)
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig, load_config
from rowbatch.consumer.service.runner import run_consumer
from rowbatch.consumer.service.shutdown import (
    CLOSE_MARGIN_S,
    Watchdog,
    exit_past_stuck_threads,
    run_bounded,
    watch_stop,
)
from rowbatch.consumer.service.startup import StartupError
from rowbatch.consumer.sinks.base import SinkError
from rowbatch.consumer.sources.base import SourceConfigError, SourceUnreachable

log = logging.getLogger("rowbatch.consumer")

DESCRIPTION = """\
Run the rowbatch consumer: read row chunks from Pub/Sub or Kafka, run them through a model
on an inference server, and write the results to a table."""
EPILOG = """\
commands:
  run --config FILE           consume until SIGTERM or SIGINT
  check --config FILE         validate the configuration, reach the model server and print
                              the model's inputs, outputs and batch size
  admin ensure --config FILE  create the topics and subscriptions the configuration needs
                              and check the existing ones (--dry-run: change nothing)

Every configuration field can also come from the environment, ROWBATCH_<SECTION>__<FIELD>
(e.g. ROWBATCH_SOURCE__SUBSCRIPTION), which overrides the file. Pub/Sub needs Google
credentials (GOOGLE_APPLICATION_CREDENTIALS, or gcloud auth application-default login) unless
PUBSUB_EMULATOR_HOST=host:port names an emulator.

exit codes:
  run, check    0 clean stop; 1 failed while running; 2 bad configuration or a failed
                start-up check
  admin ensure  0 everything exists as configured (or was created); 1 the broker refused a
                call; 2 bad configuration; 3 something exists but differs; 4 the broker did
                not answer
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line: one positional command (and admin's action) and the options."""
    parser = argparse.ArgumentParser(
        prog="rowbatch-consumer",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "command",
        choices=["run", "check", "admin"],
        help="run: consume; check: validate and print the model spec; admin: see ACTION",
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["ensure"],
        help="with admin only: ensure (create or check the broker's topics and subscriptions)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="the TOML configuration file (ROWBATCH_* environment variables override it)",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="admin ensure: show what would be created, change nothing",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="admin ensure: how long to wait for the broker to answer (default 30)",
    )
    return parser


_STARTUP_ERRORS = (
    ConfigError,
    StartupError,
    BindingError,
    ModelDiscoveryError,
    ModelConfigError,
    SinkError,
    SourceConfigError,
    SourceUnreachable,
)


def _dump_traced_later() -> None:
    """SIGUSR1 while tracing: write the traced allocation sites (off the event loop)."""

    async def dump() -> None:
        path = await asyncio.to_thread(dump_traced)
        log.warning("tracemalloc: allocation sites written to %s", path)

    task = asyncio.get_running_loop().create_task(dump(), name="tracemalloc-dump")
    _DUMPS.add(task)
    task.add_done_callback(_DUMPS.discard)


_DUMPS: set[asyncio.Task[None]] = set()


async def _run(config: ConsumerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if tracemalloc.is_tracing():  # PYTHONTRACEMALLOC=N: diagnosis of memory (docs/memory.md)
        loop.add_signal_handler(signal.SIGUSR1, _dump_traced_later)
    watchdog = Watchdog(config.shutdown_grace_s + CLOSE_MARGIN_S)
    arming = asyncio.create_task(watch_stop(stop, watchdog), name="shutdown-watchdog")
    try:
        await run_consumer(config, stop)
    finally:
        arming.cancel()


async def _check(config: ConsumerConfig) -> None:
    specs = await check_endpoints(config.model)  # every endpoint, the same model config
    spec = next(iter(specs.values()))
    binding = Binding(
        config.binding.inputs, config.binding.outputs, tuple(config.binding.passthrough)
    )
    check_binding(spec, binding)
    where = ", ".join(specs)
    version = spec.version or "(server default; rows carry each answer's version)"
    print(f"model {spec.name} version {version} on {where}")
    print(f"  {describe_origin(spec)}")
    for tensor in spec.inputs:
        print(f"  input  {tensor}")
    for tensor in spec.outputs:
        print(f"  output {tensor}")
    print(f"{describe_batching(spec, config.model)}; binding OK")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.command == "admin") != (args.action is not None) or (
        args.dry_run and args.command != "admin"
    ):
        parser.error("admin takes the action ensure (and --dry-run); run and check take neither")
    if args.command == "admin":
        return admin.ensure_broker(args.config, dry_run=args.dry_run, timeout_s=args.timeout)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_format, config.log_level)
    try:
        check_source_credentials(config.source)  # at once, before waiting for anything
        if args.command == "run":
            return_freed_memory()  # before the threads start: RSS follows the budget
        run_bounded(_run(config) if args.command == "run" else _check(config))
    except _STARTUP_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_past_stuck_threads(2)
    except PipelineFailed as exc:
        print(f"error: {exc} (unsettled messages were nacked)", file=sys.stderr)
        return exit_past_stuck_threads(1)
    return exit_past_stuck_threads(0)
