"""``python -m producer``: publish a file of rows to Pub/Sub or Kafka, or generate load.

    python -m producer publish --broker kafka --bootstrap localhost:9092 --topic rows \\
        --file orders.csv --chunk-rows 1000 --encoding arrow --table orders
    python -m producer publish --broker pubsub --project my-proj --topic rows \\
        --file - --format jsonl --table orders < orders.jsonl
    python -m producer loadgen --broker kafka --bootstrap localhost:9092 --topic rows \\
        --rows 100000 --rate max --kind text --malformed 0.02 --manifest sent.json

Progress goes to stderr (a bar on a terminal: rows, rows/s, ETA); the summary line (rows,
chunks, bytes, seconds, rows/s) to stdout. Errors are one line on stderr naming the file/row/
column/topic; the exit status is 1 (2 for a bad command line).

Chunk ids are ``<id prefix>:<chunk number>`` (``.<part>`` appended when a chunk is split). For
a file the default prefix is derived from the file (path, size, modification time) and the
settings that decide the cut, so publishing the same file again with the same settings re-sends
the same ids and the consumer writes each row once; ``--id-prefix`` sets it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, TextIO

import pyarrow as pa

from producer.loadgen import (
    DECODE_KINDS,
    LoadSpec,
    MalformedKind,
    Manifest,
    RateLimiter,
    publish_load,
)
from producer.progress import Progress, Summary
from producer.publish import (
    KafkaPublisher,
    Message,
    PublishedChunk,
    Publisher,
    PublishError,
    PublishWindow,
    PubSubPublisher,
    RetryPolicy,
    split_for,
)
from producer.readers import (
    STDIN,
    InputError,
    InputFormat,
    TableSource,
    open_source,
    parse_schema,
    rechunk,
    wire_columns,
)
from wire.chunks import EncodedChunk
from wire.columns import ColumnType
from wire.errors import RowTooLarge, WireError
from wire.headers import MAX_TABLE_LEN, Encoding, check_table, derive_chunk_id

PROG: Final = "rowbatch-producer"
_ENCODINGS: Final = {"json": Encoding.JSON, "arrow": Encoding.ARROW}
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]+")

PublisherFactory = Callable[[argparse.Namespace], Publisher]
Submit = Callable[[Message, int | None], Awaitable[None]]
Sleep = Callable[[float], Awaitable[None]]


class UsageError(Exception):
    """A bad combination of options (exit status 2)."""


class RunFailed(Exception):
    """A run stopped by ``cause`` (an InputError or PublishError) after it had started
    publishing; ``outcome`` is what it did until then."""

    def __init__(self, cause: InputError | PublishError, outcome: Outcome) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.outcome = outcome


# --- the command line -------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, not {value}")
    return value


def _rate(text: str) -> float | None:
    if text.strip().lower() in ("max", "inf", "unlimited"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected rows/s or 'max', not {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"the rate must be > 0 rows/s, not {text!r}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], not {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], not {text!r}")
    return value


def _kinds(text: str) -> tuple[MalformedKind, ...]:
    kinds = []
    for part in text.split(","):
        name = part.strip()
        if not name:
            continue
        try:
            kinds.append(MalformedKind(name))
        except ValueError:
            known = ", ".join(k.value for k in MalformedKind)
            raise argparse.ArgumentTypeError(
                f"unknown malformed kind {name!r}; known: {known}"
            ) from None
    if not kinds:
        raise argparse.ArgumentTypeError("give at least one malformed kind")
    return tuple(dict.fromkeys(kinds))


def _broker_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker")
    group.add_argument("--broker", choices=("pubsub", "kafka"), required=True)
    group.add_argument(
        "--topic", required=True, help="topic name (Pub/Sub: also projects/P/topics/T)"
    )
    group.add_argument(
        "--project", help="Pub/Sub project (default $PUBSUB_PROJECT_ID / $GOOGLE_CLOUD_PROJECT)"
    )
    group.add_argument(
        "--emulator-host",
        help="Pub/Sub emulator HOST:PORT (default $PUBSUB_EMULATOR_HOST, else Google Cloud)",
    )
    group.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        help="Kafka bootstrap servers HOST:PORT[,...] (default $KAFKA_BOOTSTRAP_SERVERS)",
    )
    group.add_argument(
        "--max-message-bytes",
        type=_positive_int,
        help="largest message: Pub/Sub 10000000 (its limit); Kafka the topic's "
        "max.message.bytes, 1048576 by default. Bigger chunks are split",
    )
    group.add_argument(
        "--compression",
        choices=("zstd", "lz4", "gzip", "snappy", "none"),
        default="none",
        help="Kafka record-batch compression (zstd/lz4/snappy need aiokafka[zstd] etc.)",
    )
    group.add_argument(
        "--ordering-key", help="Pub/Sub ordering key / Kafka record key for every chunk"
    )
    group.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the broker at start (default 10)",
    )
    group.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=64,
        help="messages published but not yet acknowledged (default 64)",
    )
    group.add_argument(
        "--retries", type=_positive_int, default=5, help="attempts per message (default 5)"
    )
    out = parser.add_argument_group("chunks and output")
    out.add_argument("--encoding", choices=sorted(_ENCODINGS), default="arrow")
    out.add_argument(
        "--arrow-compression",
        choices=("lz4", "zstd"),
        help="Arrow IPC buffer compression (the Arrow encoding only)",
    )
    out.add_argument("--id-prefix", help="chunk ids are PREFIX:N (see the description)")
    out.add_argument(
        "--progress",
        choices=("auto", "bar", "log", "none"),
        default="auto",
        help="progress on stderr: a bar on a terminal (auto), a line every 10 s (log), none",
    )
    out.add_argument("--manifest", type=Path, help="write the summary (and more) as JSON here")
    out.add_argument("-v", "--verbose", action="store_true", help="log retries and client logs")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Publish rows to Pub/Sub or Kafka in the rowbatch wire format.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    pub = sub.add_parser(
        "publish",
        help="publish a CSV, JSON Lines or Parquet file (or stdin)",
        description="Publish a CSV, JSON Lines or Parquet file (or stdin: --file -) as chunks "
        "of --chunk-rows rows.",
    )
    pub.add_argument("--file", required=True, help="the input file, or - for stdin")
    pub.add_argument(
        "--format",
        choices=[f.value for f in InputFormat],
        help="input format (default: from the file name; required for stdin)",
    )
    pub.add_argument("--chunk-rows", type=_positive_int, default=1000)
    pub.add_argument("--table", help="logical table name (default: the file's name)")
    pub.add_argument(
        "--schema",
        help="column types, e.g. id:int64,text:string,features:vector[float32,16] "
        "(other columns: inferred)",
    )
    _broker_options(pub)

    gen = sub.add_parser(
        "loadgen",
        help="publish a generated table (benchmarks, dead-letter tests)",
        description="Publish a deterministic generated table: text (id, text) or numeric "
        "(id, features, count), with a fraction of malformed messages.",
    )
    gen.add_argument("--rows", type=int, default=100_000, help="rows to generate (default 100000)")
    gen.add_argument("--chunk-rows", type=_positive_int, default=1000)
    gen.add_argument(
        "--rate", type=_rate, default=None, help="rows/s, or 'max' (default: as fast as possible)"
    )
    gen.add_argument("--kind", choices=("text", "numeric"), default="text")
    gen.add_argument(
        "--width",
        type=_positive_int,
        help="text: characters per row (default 64); numeric: features dimension (default 16)",
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--table", default="loadgen")
    gen.add_argument(
        "--malformed", type=_fraction, default=0.0, help="fraction of malformed chunks (0..1)"
    )
    gen.add_argument(
        "--malformed-kinds",
        type=_kinds,
        default=DECODE_KINDS,
        help="comma-separated: bad-encoding, wrong-type, missing-header, row-count, "
        "reject-marker (default: all but reject-marker)",
    )
    gen.add_argument(
        "--reject-marker",
        help="text the chaos model rejects (reject-marker chunks carry it in one row)",
    )
    _broker_options(gen)
    return parser


# --- publishers -------------------------------------------------------------------------------


def make_publisher(opts: argparse.Namespace) -> Publisher:
    """The publisher the options describe (not started)."""
    retry = RetryPolicy(attempts=opts.retries)
    if opts.broker == "pubsub":
        if opts.compression != "none":
            raise UsageError("--compression is for Kafka; Pub/Sub compresses on the wire itself")
        kwargs: dict[str, Any] = {}
        if opts.max_message_bytes is not None:
            kwargs["max_message_bytes"] = opts.max_message_bytes
        try:
            return PubSubPublisher(
                opts.topic,
                project=opts.project,
                emulator_host=opts.emulator_host,
                ordering=opts.ordering_key is not None,
                retry=retry,
                connect_timeout_s=opts.connect_timeout,
                **kwargs,
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not opts.bootstrap:
        raise UsageError("--broker kafka needs --bootstrap HOST:PORT (or $KAFKA_BOOTSTRAP_SERVERS)")
    kwargs = {}
    if opts.max_message_bytes is not None:
        kwargs["max_message_bytes"] = opts.max_message_bytes
    try:
        return KafkaPublisher(
            opts.bootstrap,
            opts.topic,
            compression=None if opts.compression == "none" else opts.compression,
            connect_timeout_s=opts.connect_timeout,
            retry=retry,
            **kwargs,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


# --- running ----------------------------------------------------------------------------------


@dataclass
class _Tally:
    """Acknowledged messages, for the progress bar and the summary. The summary's seconds run
    from ``started`` (before the input is opened) to ``ended``, less ``connect_s`` (the
    publisher's start: connecting, checking the topic)."""

    progress: Progress
    started: float
    rows: int = 0
    chunks: int = 0
    bytes: int = 0
    connect_s: float = 0.0
    ended: float | None = None

    @property
    def seconds(self) -> float:
        ended = self.ended if self.ended is not None else self.started
        return max(ended - self.started - self.connect_s, 0.0)

    def done(self, published: PublishedChunk) -> None:
        self.rows += published.rows
        self.chunks += 1
        self.bytes += published.bytes
        self.progress.add(rows=published.rows, nbytes=published.bytes)


@dataclass
class Outcome:
    """What a run did: the summary, and the load generator's manifest."""

    summary: Summary
    manifest: Manifest | None = None
    error: str | None = None


def _sanitize(text: str, limit: int = 40) -> str:
    return _UNSAFE.sub("_", text).strip("._-")[:limit] or "rows"


def default_id_prefix(opts: argparse.Namespace, max_chunk_bytes: int) -> str:
    """``<file stem>-<12 hex>``: the same file (path, size, mtime) published with the same
    settings gets the same prefix, hence the same chunk ids."""
    if opts.file == STDIN:
        return f"stdin-{uuid.uuid4().hex[:12]}"
    path = Path(opts.file).resolve()
    stat = path.stat()
    key = json.dumps(
        [
            str(path),
            stat.st_size,
            stat.st_mtime_ns,
            opts.chunk_rows,
            opts.encoding,
            opts.arrow_compression,
            opts.schema,
            opts.table,
            opts.ordering_key,
            max_chunk_bytes,
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    stem = path.name.split(".")[0]
    return f"{_sanitize(stem)}-{digest}"


def _table_name(opts: argparse.Namespace) -> str:
    if opts.table:
        name = str(opts.table)
    elif opts.file == STDIN:
        raise UsageError("reading stdin: give the table name with --table NAME")
    else:
        name = _sanitize(Path(opts.file).name.split(".")[0], MAX_TABLE_LEN)
    try:
        return check_table(name)
    except WireError as exc:
        raise UsageError(f"--table: {exc}") from None


@dataclass
class _ChunkReader:
    """Reads, converts and splits the input chunk by chunk (runs in a worker thread)."""

    source: TableSource
    tables: Iterator[pa.Table]
    publisher: Publisher
    table: str
    encoding: Encoding
    schema: dict[str, ColumnType] | None
    id_prefix: str
    ordering_key: str | None
    compression: Any
    seq: int = 0
    next_row: int = 0

    def next_chunks(self) -> list[EncodedChunk] | None:
        table = next(self.tables, None)
        if table is None:
            return None
        first_row = self.next_row
        self.next_row += table.num_rows
        columns, types = wire_columns(
            table, self.schema, source=self.source.name, first_row=first_row
        )
        chunk_id = derive_chunk_id(self.id_prefix, self.seq)
        self.seq += 1
        try:
            return split_for(
                self.publisher,
                self.table,
                columns,
                self.encoding,
                chunk_id,
                schema=types,
                ordering_key=self.ordering_key,
                compression=self.compression,
            )
        except RowTooLarge as exc:
            row = "a row" if exc.row_index is None else f"data row {first_row + exc.row_index + 1}"
            raise InputError(
                f"{self.source.name}: {row} alone encodes to {exc.size:,} bytes with its "
                f"headers, over the {exc.max_bytes:,}-byte limit of one message on "
                f"{self.publisher.broker} topic {self.publisher.topic!r}; it cannot be "
                "published (shorten the row; or, if the broker allows more, raise "
                "--max-message-bytes)"
            ) from None
        except WireError as exc:
            raise InputError(
                f"{self.source.name} (data rows {first_row + 1}..{self.next_row}): {exc}"
            ) from None


async def _publish_all(
    publisher: Publisher,
    tally: _Tally,
    feed: Callable[[Submit], Awaitable[None]],
    *,
    clock: Callable[[], float],
    max_in_flight: int,
    ordering_key: str | None,
) -> None:
    """Starts the publisher, runs ``feed(submit)`` and waits for every acknowledgement."""
    before = clock()
    await publisher.start()
    tally.connect_s = clock() - before
    window = PublishWindow(publisher, max_in_flight=max_in_flight, on_done=tally.done)

    async def submit(message: Message, rows: int | None = None) -> None:
        await window.submit(message, key=ordering_key, rows=rows)

    try:
        await feed(submit)
        await window.drain()
        await publisher.flush()
    except BaseException:
        await window.cancel()
        raise
    finally:
        tally.ended = clock()
        tally.progress.finish()


def _summary(
    tally: _Tally, publisher: Publisher, opts: argparse.Namespace, prefix: str, complete: bool
) -> Summary:
    return Summary(
        broker=publisher.broker,
        topic=publisher.topic,
        encoding=opts.encoding,
        rows=tally.rows,
        chunks=tally.chunks,
        bytes=tally.bytes,
        seconds=tally.seconds,
        id_prefix=prefix,
        complete=complete,
    )


async def run_publish(
    opts: argparse.Namespace,
    publisher: Publisher,
    *,
    stdin: IO[bytes] | None = None,
    stderr: TextIO,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """``publish``: the file, chunk by chunk. Raises InputError/PublishError (the partial
    summary is in the exception's ``outcome`` attribute)."""
    table = _table_name(opts)
    schema = parse_schema(opts.schema) if opts.schema else None
    fmt = InputFormat(opts.format) if opts.format else None
    encoding = _ENCODINGS[opts.encoding]
    if opts.arrow_compression and encoding is not Encoding.ARROW:
        raise UsageError("--arrow-compression needs --encoding arrow")
    if opts.id_prefix is not None:
        try:
            derive_chunk_id(opts.id_prefix, 0)
        except WireError as exc:
            raise UsageError(f"--id-prefix: {exc}") from None
    started = clock()
    source = await asyncio.to_thread(
        open_source,
        opts.file,
        fmt,
        schema=schema,
        batch_rows=max(opts.chunk_rows, 1024),
        stdin=stdin,
    )
    with source:
        prefix = opts.id_prefix or default_id_prefix(opts, publisher.max_chunk_bytes)
        progress = Progress(
            stderr,
            mode=opts.progress,
            total_rows=source.total_rows,
            estimate_rows=source.estimated_rows,
            clock=clock,
        )
        tally = _Tally(progress, started)
        reader = _ChunkReader(
            source,
            rechunk(source.batches, opts.chunk_rows),
            publisher,
            table,
            encoding,
            schema,
            prefix,
            opts.ordering_key,
            opts.arrow_compression,
        )

        async def feed(submit: Submit) -> None:
            while (chunks := await asyncio.to_thread(reader.next_chunks)) is not None:
                for chunk in chunks:
                    await submit(chunk, chunk.headers.row_count)

        try:
            await _publish_all(
                publisher,
                tally,
                feed,
                clock=clock,
                max_in_flight=opts.max_in_flight,
                ordering_key=opts.ordering_key,
            )
        except (InputError, PublishError) as exc:
            partial = Outcome(_summary(tally, publisher, opts, prefix, complete=False))
            raise RunFailed(exc, partial) from exc
    return Outcome(_summary(tally, publisher, opts, prefix, complete=True))


async def run_loadgen(
    opts: argparse.Namespace,
    publisher: Publisher,
    *,
    stderr: TextIO,
    clock: Callable[[], float] = time.monotonic,
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
            encoding=_ENCODINGS[opts.encoding],
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
    tally = _Tally(progress, clock())
    limiter = RateLimiter(opts.rate, clock=clock, sleep=sleep)
    manifest = Manifest(spec)

    async def feed(submit: Submit) -> None:
        nonlocal manifest
        manifest = await publish_load(publisher, spec, submit, limiter)

    try:
        await _publish_all(
            publisher,
            tally,
            feed,
            clock=clock,
            max_in_flight=opts.max_in_flight,
            ordering_key=opts.ordering_key,
        )
    except PublishError as exc:
        partial = Outcome(_summary(tally, publisher, opts, prefix, complete=False), manifest)
        raise RunFailed(exc, partial) from exc
    return Outcome(_summary(tally, publisher, opts, prefix, complete=True), manifest)


def _write_manifest(path: Path, outcome: Outcome) -> None:
    data: dict[str, Any]
    if outcome.manifest is not None:
        data = outcome.manifest.to_json(outcome.summary.to_json())
    else:
        data = {"summary": outcome.summary.to_json()}
    if outcome.error is not None:
        data["error"] = outcome.error
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _report(outcome: Outcome, stdout: TextIO) -> None:
    print(outcome.summary.line(), file=stdout)
    manifest = outcome.manifest
    if manifest is not None and manifest.spec.malformed > 0:
        items = ", ".join(f"{cid} ({m['kind']})" for cid, m in sorted(manifest.malformed.items()))
        print(
            f"malformed: {len(manifest.malformed)} of {manifest.messages} messages: {items}; "
            f"valid rows: {manifest.valid_rows:,}",
            file=stdout,
        )


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
    clock: Callable[[], float],
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
    clock: Callable[[], float] = time.monotonic,
    sleep: Sleep = asyncio.sleep,
) -> int:
    """The command line; returns the exit status. The keyword arguments are for tests."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    parser = build_parser()
    opts = parser.parse_args(argv)
    _setup_logging(opts.verbose)
    factory = publisher_factory or make_publisher
    try:
        outcome = asyncio.run(
            _run(opts, factory, stdin=stdin, stderr=stderr, clock=clock, sleep=sleep)
        )
    except UsageError as exc:
        print(f"{PROG} {opts.command}: error: {exc}", file=stderr)
        return 2
    except (InputError, PublishError) as exc:
        print(f"{PROG} {opts.command}: error: {exc}", file=stderr)
        return 1
    except RunFailed as failed:
        print(f"{PROG} {opts.command}: error: {failed.cause}", file=stderr)
        partial = failed.outcome
        partial.error = str(failed.cause)
        if partial.summary.chunks:
            _report(partial, stdout)
        if opts.manifest is not None:
            _write_manifest(opts.manifest, partial)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {opts.command}: interrupted", file=stderr)
        return 130
    _report(outcome, stdout)
    if opts.manifest is not None:
        _write_manifest(opts.manifest, outcome)
    return 0


__all__ = [
    "Outcome",
    "UsageError",
    "build_parser",
    "default_id_prefix",
    "main",
    "make_publisher",
    "run_loadgen",
    "run_publish",
]
