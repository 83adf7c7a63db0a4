"""The rowbatch-consumer command (also python -m rowbatch.consumer): run the subscriber service,
check its configuration, or create what it needs on the broker. The help text (DESCRIPTION, EPILOG;
each command's own, ``rowbatch-consumer table --help``, in COMMANDS) says how; the exit codes of
admin ensure are rowbatch/consumer/service/admin.py's."""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import signal
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rowbatch.consumer.engine.pipeline import PipelineFailed
from rowbatch.consumer.model.binding import Binding, BindingError, check_binding
from rowbatch.consumer.model.discovery import ModelDiscoveryError
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.spec import ModelConfigError
from rowbatch.consumer.model.spec_match import same_spec
from rowbatch.consumer.observe.memory import dump_traced, return_freed_memory
from rowbatch.consumer.observe.tracing_settings import start_consumer_tracing
from rowbatch.consumer.service import admin, logs
from rowbatch.consumer.service.build_io import check_source_credentials
from rowbatch.consumer.service.build_model import (
    check_endpoints,
    describe_batching,
    describe_origin,
)
from rowbatch.consumer.service.build_rollout import check_candidate
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig, load_config
from rowbatch.consumer.service.runner import Running, run_consumer
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
from rowbatch.consumer.sources.table.settings import JOB_INDEX_VARIABLE, TableSettings
from rowbatch.tracing import TracingError

log = logging.getLogger("rowbatch.consumer")

DESCRIPTION = """\
Run the rowbatch consumer: read row chunks from Pub/Sub or Kafka (or a stored table), run them
through a model on an inference server, and write the results to a table."""
ENVIRONMENT = """\
Every configuration field can also come from the environment, ROWBATCH_<SECTION>__<FIELD>
(e.g. ROWBATCH_SOURCE__SUBSCRIPTION), which overrides the file. Pub/Sub needs Google
credentials (GOOGLE_APPLICATION_CREDENTIALS, or gcloud auth application-default login) unless
PUBSUB_EMULATOR_HOST=host:port names an emulator."""
EXIT_CODES = {
    "run": """\
  run, check    0 clean stop; 1 failed while running; 2 bad configuration or a failed
                start-up check""",
    "table": """\
  table         0 every row of the shard written or dead-lettered; 1 failed while running;
                2 bad configuration or a failed start-up check; 3 stopped (SIGTERM) before
                the shard was done: run it again to resume; 4 the end was reached but a part
                of the input could not be read (named in the summary): mend the file, then
                run it again""",
    "admin": """\
  admin ensure  0 everything exists as configured (or was created); 1 the broker refused a
                call; 2 bad configuration; 3 something exists but differs; 4 the broker did
                not answer""",
}
EPILOG = f"""\
commands:
  run --config FILE           consume until SIGTERM or SIGINT
  table --config FILE [--input PATH_OR_URL] [--shard K/N] [--new-run] [--summary FILE]
                              run the model over a stored table (Parquet, CSV, JSON Lines;
                              a file, a directory or an object-store URL) once, resuming
                              what an earlier run of the same shard left; the config's
                              [source] is kind = "table", or --input replaces it
  check --config FILE         validate the configuration, reach the model server and print
                              the model's inputs, outputs and batch size
  admin ensure --config FILE  create the topics and subscriptions the configuration needs
                              and check the existing ones (--dry-run: change nothing)
  dlq stats|show|replay --config FILE [filters]
                              count, inspect or replay the dead letters (dlq --help)
  openai-batch --config FILE --input FILE --output FILE [--state DIR]
                              run an OpenAI Batch API file through the [model]'s
                              OpenAI-compatible server (openai-batch --help)
  compare --config FILE [--table NAME] [--tolerance COLUMN=ATOL[:RTOL]]... [--json PATH]
                              report how a shadow candidate's answers agree with the
                              production model's, from its comparison table (compare --help)

rowbatch-consumer COMMAND --help shows one command's usage, options and exit codes.

{ENVIRONMENT}

exit codes:
{EXIT_CODES["run"]}
{EXIT_CODES["table"]}
{EXIT_CODES["admin"]}
"""

_OPTIONS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # flag: (the command it belongs to, "" for every one; its help; argparse's keywords)
    "--config": (
        "",
        "the TOML configuration file (ROWBATCH_* environment variables override it)",
        {"type": Path, "metavar": "FILE"},
    ),
    "--input": (
        "table",
        "the table to read ([source] input; replaces a broker [source])",
        {"metavar": "PATH_OR_URL"},
    ),
    "--shard": (
        "table",
        "this worker's shard K of N ([source] shard and shards)",
        {"metavar": "K/N"},
    ),
    "--new-run": (
        "table",
        "forget this shard's progress and start over ([source] new_run)",
        {"action": "store_true"},
    ),
    "--summary": (
        "table",
        "also write the final summary as JSON to FILE",
        {"type": Path, "metavar": "FILE"},
    ),
    "--dry-run": (
        "admin ensure",
        "show what would be created, change nothing",
        {"action": "store_true"},
    ),
    "--timeout": (
        "admin ensure",
        "how long to wait for the broker to answer (default 30)",
        {"type": float, "default": 30.0, "metavar": "SECONDS"},
    ),
}

_TABLE_FIELDS = ", ".join(
    field.alias or name for name, field in TableSettings.model_fields.items() if name != "kind"
)


def _paragraphs(*texts: str) -> str:
    """``texts`` wrapped as the general help is (the formatter keeps line breaks as they are)."""
    return "\n\n".join(textwrap.fill(text, 95) for text in texts)


def _exits(lines: str) -> str:
    return f"{ENVIRONMENT}\n\nexit codes:\n{lines}\n"


COMMANDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    # command: (its description, its options, its epilog)
    "run": (
        _paragraphs(
            "Consume the configuration's [source] (Pub/Sub or Kafka): read row chunks, run "
            "them through the model and write the results to [sink], until SIGTERM or SIGINT "
            '(which finish the work in flight). A [source] of kind = "table" runs as the table '
            "command does."
        ),
        ("--config",),
        _exits(
            "  run           0 clean stop; 1 failed while running; 2 bad configuration or a "
            "failed\n                start-up check"
        ),
    ),
    "table": (
        _paragraphs(
            "Run the model over a stored table once (Parquet, CSV or JSON Lines: a file, a "
            "directory, a hive-partitioned dataset or an object-store URL such as "
            "s3://bucket/prefix/) and write the results to [sink]. Progress and dead letters "
            "are kept under [source] state, one folder per shard, so a rerun of the same shard "
            "resumes what an earlier run left.",
            'The configuration\'s [source] is kind = "table" (its fields: '
            f"{_TABLE_FIELDS}), or --input replaces a broker [source]; the options override "
            "the file.",
        ),
        ("--config", "--input", "--shard", "--new-run", "--summary"),
        "examples:\n"
        "  rowbatch-consumer table --config consumer.toml --input data/events/\n"
        "  rowbatch-consumer table --config consumer.toml --input s3://lake/events/ "
        "--shard 2/8\n\n"
        + _paragraphs(
            "Without --shard, a [source] with shards = N takes this worker's shard from "
            f"${JOB_INDEX_VARIABLE} (a Kubernetes Indexed Job)."
        )
        + "\n\n"
        + _exits(EXIT_CODES["table"]),
    ),
    "check": (
        _paragraphs(
            "Validate the configuration, reach every model server it names and print the "
            "model's inputs, outputs and batch size, and whether the binding fits them."
        ),
        ("--config",),
        _exits(
            "  check         0 the model was reached and the binding fits; 2 bad "
            "configuration,\n                a server that does not answer, or a binding that "
            "does not fit"
        ),
    ),
    "admin": (
        _paragraphs(
            "admin ensure: create on the broker what the configuration needs when it is "
            "absent, and check it when it is present, naming every difference (nothing that "
            "exists is changed). Pub/Sub: the topic, the dead-letter topic, a subscription on "
            "it that keeps the dead letters, and the subscription with its ack deadline, retry "
            "policy and dead-letter policy. Kafka: the topic and its dead-letter topic."
        ),
        ("--config", "--dry-run", "--timeout"),
        _exits(EXIT_CODES["admin"]),
    ),
}


def _add_options(parser: argparse.ArgumentParser, flags: tuple[str, ...], *, scoped: bool) -> None:
    """``flags`` from ``_OPTIONS``; ``scoped``: each help says its command (``table: ...``)."""
    for flag in flags:
        command, text, keywords = _OPTIONS[flag]
        say = f"{command}: {text}" if scoped and command else text
        parser.add_argument(flag, help=say, **keywords)


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
        choices=[*COMMANDS, "dlq"],
        help="run: consume; table: run over a stored table; check: validate and print the "
        "model spec; admin: see ACTION; dlq: the dead-letter tools (dlq --help)",
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["ensure"],
        help="with admin only: ensure (create or check the broker's topics and subscriptions)",
    )
    _add_options(parser, tuple(_OPTIONS), scoped=True)
    return parser


def command_parser(command: str) -> argparse.ArgumentParser:
    """The help of one command (``rowbatch-consumer table --help``): its usage, what it does,
    the options it accepts and its exit codes. The command line itself is read by
    :func:`build_parser`'s parser, which holds the same options."""
    description, flags, epilog = COMMANDS[command]
    parser = argparse.ArgumentParser(
        prog=f"rowbatch-consumer {command}",
        description=description,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    if command == "admin":
        parser.add_argument(
            "action",
            choices=["ensure"],
            help="ensure: create or check the broker's topics and subscriptions",
        )
    _add_options(parser, flags, scoped=False)
    return parser


_HELP = ("-h", "--help")


def help_command(argv: list[str]) -> str | None:
    """The command whose own help ``argv`` asks for (``table --help``, ``--help table``), or
    None (no --help, or no command: the general help)."""
    if not any(arg in _HELP for arg in argv):
        return None
    takes_value = {flag for flag, (_, _, kw) in _OPTIONS.items() if "action" not in kw}
    args = iter(argv)
    for arg in args:
        if arg in takes_value:
            next(args, None)  # its value
        elif not arg.startswith("-"):
            return arg if arg in COMMANDS else None
    return None


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


async def _run(config: ConsumerConfig, on_running: Callable[[Running], None] | None = None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if tracemalloc.is_tracing():  # PYTHONTRACEMALLOC=N: diagnosis of memory (docs/memory.md)
        loop.add_signal_handler(signal.SIGUSR1, _dump_traced_later)
    watchdog = Watchdog(config.shutdown_grace_s + CLOSE_MARGIN_S)
    arming = asyncio.create_task(watch_stop(stop, watchdog), name="shutdown-watchdog")
    try:
        await run_consumer(config, stop, on_running=on_running)
    finally:
        arming.cancel()


EXIT_INCOMPLETE = 3
"""``table``: stopped before every row of the shard was settled (a rerun resumes)."""
EXIT_UNREADABLE = 4
"""``table``: the run went through the shard, but a part of the input could not be read (a
corrupt file, named in the summary): rerunning cannot help until the file is mended."""


def table_config(config: ConsumerConfig, args: argparse.Namespace) -> ConsumerConfig:
    """``config`` with its ``[source]`` made a table source by the command line: ``--input``
    replaces a broker source, ``--shard K/N`` and ``--new-run`` override the file."""
    source = config.source
    if not isinstance(source, TableSettings) and not args.input:
        raise ConfigError(
            f"table: [source] is kind = {source.kind!r}; give --input PATH_OR_URL, or a "
            '[source] with kind = "table" and input'
        )
    fields: dict[str, object] = (
        source.model_dump(by_alias=True, exclude_unset=True)
        if isinstance(source, TableSettings)
        else {}
    )
    fields["kind"] = "table"
    if args.input:
        fields["input"] = args.input
    if args.shard:
        match = re.fullmatch(r"([0-9]+)/([0-9]+)", str(args.shard))
        if match is None:
            raise ConfigError(f"--shard {args.shard!r}: give K/N, e.g. --shard 0/4")
        fields["shard"], fields["shards"] = int(match[1]), int(match[2])
    if args.new_run:
        fields["new_run"] = True
    try:
        table = TableSettings.model_validate(fields)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'source'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"table: invalid [source]: {problems}") from None
    return config.model_copy(update={"source": table})


def _run_table(config: ConsumerConfig, summary_path: Path | None) -> int:
    """Runs the table source to its end (or a stop), prints the summary; the exit code."""
    # Table mode's modules (its readers, pyarrow.compute/csv/json: ~9 MiB of RSS) only here.
    from rowbatch.consumer.service.table_run import (  # noqa: PLC0415
        report_progress,
        summarize,
        write_summary,
    )
    from rowbatch.consumer.sources.table.source import TableSource  # noqa: PLC0415

    seen: list[Running] = []
    reporting: list[asyncio.Task[None]] = []
    assert isinstance(config.source, TableSettings)
    interval = config.source.progress_interval_s

    slots: list[int] = []

    def on_running(running: Running) -> None:
        seen.append(running)
        slots.append(running.balancer.capacity if running.balancer is not None else 0)
        if isinstance(running.source, TableSource):
            reporting.append(
                asyncio.create_task(
                    report_progress(running.source, sys.stderr, interval), name="table-progress"
                )
            )

    async def run() -> None:
        try:
            await _run(config, on_running)
        finally:
            for task in reporting:
                task.cancel()
            await asyncio.gather(*reporting, return_exceptions=True)

    started = time.monotonic()
    run_bounded(run())
    if not seen or not isinstance(seen[0].source, TableSource):
        return EXIT_INCOMPLETE  # stopped during start-up
    running = seen[0]
    assert isinstance(running.source, TableSource)
    summary = summarize(
        running.source,
        metrics=running.metrics,
        target_batch_size=running.target_batch_size,
        in_flight=slots[0],
        wall_s=time.monotonic() - started,
        model_work_at_risk=running.model_work_at_risk,
    )
    write_summary(summary, summary_path, sys.stderr)
    if summary.complete:
        return 0
    return EXIT_UNREADABLE if summary.unreadable else EXIT_INCOMPLETE


async def _check_openai(config: ConsumerConfig, settings: OpenAISettings) -> None:
    from rowbatch.consumer.model.openai.client import EndpointPool  # noqa: PLC0415
    from rowbatch.consumer.model.openai.startup import discover_once  # noqa: PLC0415
    from rowbatch.consumer.service.build_openai import (  # noqa: PLC0415
        openai_binding,
        template_columns,
    )

    pool = EndpointPool(settings)
    try:
        found = await discover_once(pool, settings, template_columns(settings))
    finally:
        await pool.close()
    openai_binding(settings, config.binding, found.spec)
    print(f"model {settings.name} on {', '.join(settings.url)} ({found.spec.server})")
    print(f"  api {settings.api}: prompt columns {list(template_columns(settings))}")
    for tensor in found.spec.outputs:
        print(f"  output {tensor}")
    print(
        f"{settings.requests_rows} row(s) per request, window {settings.max_in_flight} "
        f"(up to {settings.window_ceiling}) per endpoint; binding OK"
    )


async def _check(config: ConsumerConfig) -> None:
    if isinstance(config.model, OpenAISettings):
        await _check_openai(config, config.model)
        return
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
    candidate = config.model.candidate_model()
    if candidate is not None and config.model.candidate is not None:
        theirs = same_spec(await check_endpoints(candidate))
        check_binding(theirs, binding)
        check_candidate(spec, theirs, config.binding.outputs)
        print(
            f"candidate ({config.model.candidate.mode}) {theirs.name} version "
            f"{theirs.version or '(server default)'} on {candidate.url}: answers the bound "
            "outputs as the production model does"
        )


def entry() -> int:
    """The ``rowbatch-consumer`` command (and ``python -m rowbatch.consumer``): :func:`main`
    on the process's arguments, then the exit past threads a stuck client (a broker or cloud
    library's) would hold the interpreter open with, for every subcommand alike."""
    return exit_past_stuck_threads(main())


def main(argv: list[str] | None = None) -> int:
    """The command's exit code (``argv``: the arguments after the program name; the process's
    when None). Returns in every case: a caller in the same process (a test) goes on."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dlq"]:  # its own options and help: dlq_cli.py
        from rowbatch.consumer.service.dlq_cli import main as dlq_main  # noqa: PLC0415

        return dlq_main(argv[1:])
    if argv[:1] == ["openai-batch"]:  # its own options and help: openai_batch.py
        from rowbatch.consumer.service.openai_batch import main as batch_main  # noqa: PLC0415

        return batch_main(argv[1:])
    if argv[:1] == ["compare"]:  # its own options and help: rollout/compare_cli.py
        from rowbatch.consumer.rollout.compare_cli import main as compare_main  # noqa: PLC0415

        return compare_main(argv[1:], load_config)
    return _command(argv)


def _command(argv: list[str]) -> int:
    command = help_command(argv)
    if command is not None:  # prints the command's own help and exits 0
        command_parser(command).parse_args(["--help"])
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.command == "admin") != (args.action is not None) or (
        args.dry_run and args.command != "admin"
    ):
        parser.error("admin takes the action ensure (and --dry-run); run and check take neither")
    table_only = (args.input, args.shard, args.new_run, args.summary)
    if args.command != "table" and any(table_only):
        parser.error("--input, --shard, --new-run and --summary go with the table command")
    if args.command == "admin":
        return admin.ensure_broker(args.config, dry_run=args.dry_run, timeout_s=args.timeout)
    try:
        config = load_config(args.config)
        if args.command == "table":
            config = table_config(config, args)
        elif isinstance(config.source, TableSettings) and args.command == "run":
            config = table_config(config, args)
            args.command = "table"
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logs.configure(config.log_format, config.log_level)
    tracing = None
    if args.command in ("run", "table"):
        try:
            tracing = start_consumer_tracing(config.tracing)
        except TracingError as exc:
            print(f"error: tracing: {exc}", file=sys.stderr)
            return 2
    try:
        code = _execute(config, args)
    finally:
        if tracing is not None:
            tracing.shutdown()  # export what is buffered
    return code


def _execute(config: ConsumerConfig, args: argparse.Namespace) -> int:
    """Run ``args.command``; the exit code."""
    try:
        check_source_credentials(config.source)  # at once, before waiting for anything
        if args.command in ("run", "table"):
            return_freed_memory()  # before the threads start: RSS follows the budget
        if args.command == "table":
            return _run_table(config, args.summary)
        run_bounded(_run(config) if args.command == "run" else _check(config))
    except _STARTUP_ERRORS as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except PipelineFailed as exc:
        print(f"error: {exc} (unsettled messages were nacked)", file=sys.stderr)
        return 1
    return 0
