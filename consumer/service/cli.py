"""``python -m consumer`` / ``rowbatch-consumer``: run the subscriber service.

    rowbatch-consumer run --config consumer.toml      consume until SIGTERM/SIGINT
    rowbatch-consumer check --config consumer.toml    validate the config, print the model spec

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
from consumer.model.inference import InferenceClient
from consumer.service import logs
from consumer.service.config import ConfigError, ConsumerConfig, load_config
from consumer.service.runner import StartupError, run_consumer
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
    await run_consumer(config, stop)


async def _check(config: ConsumerConfig) -> None:
    async with InferenceClient(
        config.model.url, config.model.name, config.model.version, tls=config.model.tls_options()
    ) as c:
        spec = await c.discover()
    binding = Binding(
        config.binding.inputs, config.binding.outputs, tuple(config.binding.passthrough)
    )
    check_binding(spec, binding)
    print(f"model {spec.name} version {spec.version or '(server default)'} on {config.model.url}")
    for tensor in spec.inputs:
        print(f"  input  {tensor}")
    for tensor in spec.outputs:
        print(f"  output {tensor}")
    print(f"batch size {target_batch_size(spec, config.model.batch_size)}; binding OK")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rowbatch-consumer", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["run", "check"])
    parser.add_argument("--config", type=Path, help="TOML file (env vars override it)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_format, config.log_level)
    try:
        asyncio.run(_run(config) if args.command == "run" else _check(config))
    except _STARTUP_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PipelineFailed as exc:
        print(f"error: {exc} (unsettled messages were nacked)", file=sys.stderr)
        return 1
    return 0
