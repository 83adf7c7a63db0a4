"""The ``loadgen`` subcommand: a generated table (with a fraction of malformed messages) published
at ``--rate`` rows/s or as fast as possible, and the manifest of what was sent."""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import TextIO

from rowbatch.producer.cli.parser import ENCODINGS
from rowbatch.producer.cli.running import Outcome, Submit, Tally, UsageError, run_to_outcome
from rowbatch.producer.loadgen.manifest import Manifest
from rowbatch.producer.loadgen.rate import RateLimiter
from rowbatch.producer.loadgen.run import publish_load
from rowbatch.producer.loadgen.spec import LoadSpec
from rowbatch.producer.publishers.base import Publisher
from rowbatch.progress import Progress
from rowbatch.timing import Clock, Sleep
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import check_table


async def run_loadgen(
    opts: argparse.Namespace,
    publisher: Publisher,
    *,
    stderr: TextIO,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> Outcome:
    """``loadgen``: the generated table, paced to ``--rate``."""
    prefix = opts.id_prefix or f"lg-{uuid.uuid4().hex[:12]}"
    try:
        spec = LoadSpec(
            rows=opts.rows,
            chunk_rows=opts.chunk_rows,
            kind=opts.kind,
            width=opts.width,
            encoding=ENCODINGS[opts.encoding],
            table=check_table(opts.table),
            seed=opts.seed,
            malformed=opts.malformed,
            malformed_kinds=opts.malformed_kinds,
            reject_marker=opts.reject_marker,
            id_prefix=prefix,
        )
    except (ValueError, WireError) as exc:
        raise UsageError(str(exc)) from None
    progress = Progress(stderr, mode=opts.progress, total_rows=spec.rows, clock=clock)
    tally = Tally(progress, clock())
    limiter = RateLimiter(opts.rate, clock=clock, sleep=sleep)
    manifest = Manifest(spec)

    async def feed(submit: Submit) -> None:
        nonlocal manifest
        manifest = await publish_load(publisher, spec, submit, limiter)

    return await run_to_outcome(
        publisher, tally, feed, opts, prefix, clock=clock, manifest=lambda: manifest
    )


__all__ = ["run_loadgen"]
