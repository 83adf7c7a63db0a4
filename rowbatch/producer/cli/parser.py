"""The command line: the ``publish`` and ``loadgen`` subcommands and their options, each checked
as it is parsed."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Final

from rowbatch.producer.loadgen.spec import DECODE_KINDS, MalformedKind
from rowbatch.tables.formats import InputFormat
from rowbatch.wire.headers.fields import Encoding

PROG: Final = "rowbatch-producer"
ENCODINGS: Final = {"json": Encoding.JSON, "arrow": Encoding.ARROW}

DESCRIPTION: Final = "Publish rows to Pub/Sub or Kafka in the rowbatch wire format."
EPILOG: Final = """\
examples:
  rowbatch-producer publish --broker kafka --bootstrap localhost:9092 --topic rows \\
      --file orders.csv --chunk-rows 1000 --encoding arrow --table orders
  rowbatch-producer publish --broker pubsub --project my-proj --topic rows \\
      --file - --format jsonl --table orders < orders.jsonl
  rowbatch-producer loadgen --broker kafka --bootstrap localhost:9092 --topic rows \\
      --rows 100000 --rate max --kind text --malformed 0.02 --manifest sent.json

Progress goes to stderr, the summary line (rows, chunks, bytes, seconds, rows/s) to stdout.
Pub/Sub needs Google credentials (GOOGLE_APPLICATION_CREDENTIALS, or gcloud auth
application-default login) unless --emulator-host or PUBSUB_EMULATOR_HOST names an emulator.

exit codes: 0 published; 1 a publishing or input error; 2 a bad command line or set-up
(no credentials, say). Errors are one line on stderr.
"""
PUBLISH_EPILOG: Final = """\
Chunk ids are PREFIX:N (.PART appended when a chunk is split). The default prefix comes from
the file (path, size, modification time) and the settings that decide the cut, so publishing
the same file again with the same settings re-sends the same ids and the consumer writes each
row once; --id-prefix sets it.
"""


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
    group.add_argument(
        "--broker", choices=("pubsub", "kafka"), required=True, help="where to publish"
    )
    group.add_argument(
        "--topic",
        required=True,
        metavar="TOPIC",
        help="topic name (Pub/Sub: also projects/P/topics/T)",
    )
    group.add_argument(
        "--project",
        metavar="PROJECT",
        help="Pub/Sub project (default $PUBSUB_PROJECT_ID / $GOOGLE_CLOUD_PROJECT)",
    )
    group.add_argument(
        "--emulator-host",
        metavar="HOST:PORT",
        help="Pub/Sub emulator (default $PUBSUB_EMULATOR_HOST, else Google Cloud)",
    )
    group.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"),
        metavar="HOST:PORT[,...]",
        help="Kafka bootstrap servers (default $KAFKA_BOOTSTRAP_SERVERS)",
    )
    group.add_argument(
        "--max-message-bytes",
        type=_positive_int,
        metavar="BYTES",
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
        "--ordering-key",
        metavar="KEY",
        help="Pub/Sub ordering key / Kafka record key for every chunk",
    )
    group.add_argument(
        "--connect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long to wait for the broker at start (default 10)",
    )
    group.add_argument(
        "--max-in-flight",
        type=_positive_int,
        default=64,
        metavar="N",
        help="messages published but not yet acknowledged (default 64)",
    )
    group.add_argument(
        "--retries",
        type=_positive_int,
        default=5,
        metavar="N",
        help="attempts per message (default 5)",
    )
    out = parser.add_argument_group("chunks and output")
    out.add_argument(
        "--encoding",
        choices=sorted(ENCODINGS),
        default="arrow",
        help="how a chunk's columns are encoded (default arrow)",
    )
    out.add_argument(
        "--arrow-compression",
        choices=("lz4", "zstd"),
        help="Arrow IPC buffer compression (the Arrow encoding only)",
    )
    out.add_argument(
        "--id-prefix",
        metavar="PREFIX",
        help="chunk ids are PREFIX:N (default: derived from the file and settings for "
        "publish, random for loadgen)",
    )
    out.add_argument(
        "--progress",
        choices=("auto", "bar", "log", "none"),
        default="auto",
        help="progress on stderr: a bar on a terminal (auto), a line every 10 s (log), none",
    )
    out.add_argument(
        "--manifest",
        type=Path,
        metavar="FILE",
        help="write the summary (loadgen: and what was sent) as JSON to FILE",
    )
    out.add_argument("-v", "--verbose", action="store_true", help="log retries and client logs")
    out.add_argument(
        "--trace",
        action="store_true",
        help="OpenTelemetry: a span per message, its context written into the message "
        "(docs/tracing.md); spans go by OTLP/gRPC to OTEL_EXPORTER_OTLP_ENDPOINT "
        "(default http://localhost:4317)",
    )
    out.add_argument(
        "--trace-sample-ratio",
        type=float,
        metavar="R",
        help="with --trace: keep this share of the messages' traces (default "
        "OTEL_TRACES_SAMPLER_ARG, else 1.0); the consumer follows the choice",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    pub = sub.add_parser(
        "publish",
        help="publish a CSV, JSON Lines or Parquet file (or stdin)",
        description="Publish a CSV, JSON Lines or Parquet file (or stdin: --file -) as chunks "
        "of --chunk-rows rows.",
        epilog=PUBLISH_EPILOG,
    )
    pub.add_argument("--file", required=True, metavar="FILE", help="the input file, or - for stdin")
    pub.add_argument(
        "--format",
        choices=[f.value for f in InputFormat],
        help="input format (default: from the file name; required for stdin)",
    )
    pub.add_argument(
        "--chunk-rows",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="rows per chunk (default 1000; a chunk too big for one message is split)",
    )
    pub.add_argument(
        "--table", metavar="NAME", help="logical table name (default: the file's name)"
    )
    pub.add_argument(
        "--schema",
        metavar="COLUMNS",
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
    gen.add_argument(
        "--rows", type=int, default=100_000, metavar="N", help="rows to generate (default 100000)"
    )
    gen.add_argument(
        "--chunk-rows",
        type=_positive_int,
        default=1000,
        metavar="N",
        help="rows per chunk (default 1000)",
    )
    gen.add_argument(
        "--rate",
        type=_rate,
        default=None,
        metavar="ROWS_PER_S",
        help="rows/s, or 'max' (default: as fast as possible)",
    )
    gen.add_argument(
        "--kind",
        choices=("text", "numeric"),
        default="text",
        help="text: (id, text) rows; numeric: (id, features, count) rows (default text)",
    )
    gen.add_argument(
        "--width",
        type=_positive_int,
        metavar="N",
        help="text: characters per row (default 64); numeric: features dimension (default 16)",
    )
    gen.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="the generator's seed: the same seed gives the same rows (default 0)",
    )
    gen.add_argument(
        "--table", default="loadgen", metavar="NAME", help="logical table name (default loadgen)"
    )
    gen.add_argument(
        "--malformed",
        type=_fraction,
        default=0.0,
        metavar="FRACTION",
        help="fraction of malformed chunks (0..1, default 0)",
    )
    gen.add_argument(
        "--malformed-kinds",
        type=_kinds,
        default=DECODE_KINDS,
        metavar="KINDS",
        help="comma-separated: bad-encoding, wrong-type, missing-header, row-count, "
        "reject-marker (default: all but reject-marker)",
    )
    gen.add_argument(
        "--reject-marker",
        metavar="TEXT",
        help="text the chaos model rejects (reject-marker chunks carry it in one row)",
    )
    _broker_options(gen)
    return parser


__all__ = ["ENCODINGS", "PROG", "build_parser"]
