"""The command line: the ``publish`` and ``loadgen`` subcommands and their options, each checked
as it is parsed."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Final

from producer.loadgen import DECODE_KINDS, MalformedKind
from producer.readers import InputFormat
from wire.headers import Encoding

PROG: Final = "rowbatch-producer"
ENCODINGS: Final = {"json": Encoding.JSON, "arrow": Encoding.ARROW}


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
    out.add_argument("--encoding", choices=sorted(ENCODINGS), default="arrow")
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


__all__ = ["ENCODINGS", "PROG", "build_parser"]
