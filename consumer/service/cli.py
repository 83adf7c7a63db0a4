"""``python -m consumer`` / ``rowbatch-consumer``: run the subscriber service.

    rowbatch-consumer run --config consumer.toml      consume until SIGTERM/SIGINT
    rowbatch-consumer check --config consumer.toml    validate the config, print the model spec
    rowbatch-consumer admin ensure --config consumer.toml [--dry-run]
        create the topics/subscriptions the config needs, check existing ones (exit codes:
        ``consumer/service/admin.py``; 3 when something exists but differs)

Every config field can come from the environment: ``ROWBATCH_<SECTION>__<FIELD>``.
Exit codes: 0 clean stop; 2 bad configuration or a failed start-up check; 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

from consumer.engine.pipeline import PipelineFailed
from consumer.model.binding import Binding, BindingError, check_binding
from consumer.model.discovery import ModelConfigError, ModelDiscoveryError, target_batch_size
from consumer.service import admin, logs
from consumer.service.config import ConfigError, ConsumerConfig, load_config
from consumer.service.model_wiring import check_endpoints
from consumer.service.runner import run_consumer
from consumer.service.shutdown import (
    CLOSE_MARGIN_S,
    Watchdog,
    exit_past_stuck_threads,
    run_bounded,
    watch_stop,
)
from consumer.service.startup import StartupError
from consumer.sinks.base import SinkError
from consumer.sources.base import SourceConfigError, SourceUnreachable

log = logging.getLogger("consumer")

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


async def _run(config: ConsumerConfig) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
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
    print(f"model {spec.name} version {spec.version or '(server default)'} on {where}")
    for tensor in spec.inputs:
        print(f"  input  {tensor}")
    for tensor in spec.outputs:
        print(f"  output {tensor}")
    print(f"batch size {target_batch_size(spec, config.model.batch_size)}; binding OK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rowbatch-consumer", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["run", "check", "admin"])
    parser.add_argument("action", nargs="?", choices=["ensure"], help="with admin: ensure")
    parser.add_argument("--config", type=Path, help="TOML file (env vars override it)")
    parser.add_argument("--dry-run", action="store_true", help="admin ensure: change nothing")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="admin ensure: seconds to wait for the broker"
    )
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
        run_bounded(_run(config) if args.command == "run" else _check(config))
    except _STARTUP_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_past_stuck_threads(2)
    except PipelineFailed as exc:
        print(f"error: {exc} (unsettled messages were nacked)", file=sys.stderr)
        return exit_past_stuck_threads(1)
    return exit_past_stuck_threads(0)
