"""The entry point (``rowbatch-producer``, ``python -m rowbatch.producer``): parses the command
line, runs the subcommand, prints errors as one line, and returns the exit status."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from typing import IO, TextIO

from rowbatch.producer.cli.brokers import PublisherFactory, make_publisher
from rowbatch.producer.cli.loadgen import run_loadgen
from rowbatch.producer.cli.parser import PROG, build_parser
from rowbatch.producer.cli.publish import run_publish
from rowbatch.producer.cli.report import report, write_manifest
from rowbatch.producer.cli.running import Outcome, RunFailed, UsageError
from rowbatch.producer.publishers.errors import PublisherConfigError, PublishError
from rowbatch.tables.errors import InputError
from rowbatch.timing import Clock, Sleep
from rowbatch.tracing import TracingError, TracingSettings, start_tracing


def _setup_logging(verbose: bool) -> None:
    root = logging.getLogger()
    if root.handlers:
        return  # logging is the host's (an embedding program, pytest)
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:
        # The clients log every failed connection attempt; our error says it once.
        for name in ("aiokafka", "google", "grpc"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


async def _run(
    opts: argparse.Namespace,
    factory: PublisherFactory,
    *,
    stdin: IO[bytes] | None,
    stderr: TextIO,
    clock: Clock,
    sleep: Sleep,
) -> Outcome:
    publisher = factory(opts)
    try:
        if opts.command == "publish":
            return await run_publish(opts, publisher, stdin=stdin, stderr=stderr, clock=clock)
        return await run_loadgen(opts, publisher, stderr=stderr, clock=clock, sleep=sleep)
    finally:
        with contextlib.suppress(Exception):
            await publisher.close()


def main(
    argv: Sequence[str] | None = None,
    *,
    publisher_factory: PublisherFactory | None = None,
    stdin: IO[bytes] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> int:
    """The command line; returns the exit status. The keyword arguments are for tests."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = build_parser()
    opts = parser.parse_args(argv)
    _setup_logging(opts.verbose)
    factory = publisher_factory or make_publisher
    if opts.trace_sample_ratio is not None and not opts.trace:
        parser.error("--trace-sample-ratio goes with --trace")
    tracing = None
    try:
        if opts.trace:
            tracing = start_tracing(
                TracingSettings("rowbatch-producer", sample_ratio=opts.trace_sample_ratio)
            )
        try:
            outcome = asyncio.run(
                _run(opts, factory, stdin=stdin, stderr=stderr, clock=clock, sleep=sleep)
            )
        finally:
            if tracing is not None:
                tracing.shutdown()  # export what is buffered
    except (UsageError, TracingError) as exc:
        print(f"{PROG} {opts.command}: error: {exc}", file=stderr)
        return 2
    except (InputError, PublishError) as exc:
        print(f"{PROG} {opts.command}: error: {exc}", file=stderr)
        return 2 if isinstance(exc, PublisherConfigError) else 1
    except RunFailed as failed:
        print(f"{PROG} {opts.command}: error: {failed.cause}", file=stderr)
        partial = failed.outcome
        partial.error = str(failed.cause)
        if partial.summary.chunks:
            report(partial, stdout)
        if opts.manifest is not None:
            write_manifest(opts.manifest, partial)
        # Set up wrongly (no credentials, say): 2, like a bad command line.
        return 2 if isinstance(failed.cause, PublisherConfigError) else 1
    except KeyboardInterrupt:
        print(f"{PROG} {opts.command}: interrupted", file=stderr)
        return 130
    report(outcome, stdout)
    if opts.manifest is not None:
        write_manifest(opts.manifest, outcome)
    return 0


__all__ = ["main"]
