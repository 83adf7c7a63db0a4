"""``rowbatch-consumer openai-batch``: an OpenAI Batch API job on an OpenAI-compatible fleet
(vLLM, SGLang...) in one command. The input file's lines (``{"custom_id", "method", "url",
"body"}``) become a Parquet table of requests in the state folder, table mode runs it through
``[model]`` (``kind = "openai"``, ``api`` forced to ``batch``) into a Parquet dataset there, and
the output file gets one line per request line, in input order, as OpenAI's batch output file
has them: the answer (``response``) or, for a request that failed for good, the reason
(``error``: a bad line's, or the dead letter's code and message).

The state folder (``--state``, default ``<output>.state``)::

    requests.parquet        the input's requests (line, custom_id, url, body), row groups of 1,024
    requests.json           the input's SHA-256 and the lines that are not requests (bad lines)
    table/                  table mode's progress and dead letters (shard-K-of-N/)
    results/shard-K-of-N/   the answers, a Parquet dataset per shard (one writer each)

A rerun with the same state and input resumes: the conversion is kept (the input's hash must
match), the table run reads only the requests not yet settled, and the output is written again
from what the state holds (the same bytes, when nothing was left to do). docs/generative.md,
"The OpenAI batch file format"."""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from rowbatch.consumer.service.batch_requests import REQUESTS_FILE, convert
from rowbatch.consumer.service.batch_results import RESULTS, TABLE_STATE, shard_name, write_output
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig

CHUNK_ROWS: Final = 1
"""Requests per table chunk: one, so a request that fails for good is dead-lettered alone at
once (table mode cuts a chunk with a bad row in halves, and the halves' rows not yet
committed would be asked again)."""
READ_AHEAD_CHUNKS: Final = 256
COMMIT_INTERVAL_S: Final = 5.0
"""How often the answers are committed: a kill redoes at most the answers since, and a run
ends at the first commit after its last answer."""
BATCH_TABLE: Final = "openai_batch"

#: ``[model]`` settings that shape a request: each line's body does that here.
_SHAPING: Final = (
    "prompt",
    "system_prompt",
    "json_schema",
    "sampling",
    "temperature",
    "rows_per_request",
)
_TOP_LEVEL: Final = frozenset(
    {"budget_bytes", "shutdown_grace_s", "log_format", "log_level", "server"}
    | {"max_message_bytes", "max_attributes_bytes"}
)

EXIT_CONFIG: Final = 2


# --- the run ----------------------------------------------------------------------------------


def batch_config(
    path: Path | None,
    *,
    requests: Path,
    state: Path,
    shard: int | None,
    shards: int,
) -> tuple[ConsumerConfig, list[str]]:
    """The table run's configuration: the file's ``[model]`` with ``api = "batch"`` (and the
    top-level settings), a table source over the requests, the answers into the state's
    Parquet dataset of this shard; and the file's settings left out (to say so)."""
    if path is None or not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None
    model = data.get("model")
    if not isinstance(model, dict) or model.get("kind") != "openai":
        raise ConfigError(
            f'{path}: openai-batch needs a [model] section with kind = "openai" (the fleet\'s '
            "OpenAI-compatible server: url, name...)"
        )
    ignored = [f"model.{k}" for k in _SHAPING if k in model]
    ignored += [k for k in data if k != "model" and k not in _TOP_LEVEL]
    model = {k: v for k, v in model.items() if k not in _SHAPING}
    model["api"] = "batch"
    index = _shard_index(shard, shards)
    fields: dict[str, Any] = {
        **{k: v for k, v in data.items() if k in _TOP_LEVEL},
        "model": model,
        "source": {
            "kind": "table",
            "input": str(requests.resolve()),
            "format": "parquet",
            "table": BATCH_TABLE,
            "chunk_rows": CHUNK_ROWS,
            "read_ahead_chunks": READ_AHEAD_CHUNKS,
            "state": str((state / TABLE_STATE).resolve()),
            "shards": shards,
            "shard": index,
        },
        "binding": {
            "outputs": {
                name: name
                for name in (
                    "response",
                    "text",
                    "finish_reason",
                    "prompt_tokens",
                    "completion_tokens",
                    "latency_ms",
                )
            },
            "passthrough": {"line": "int64", "custom_id": "string"},
        },
        "sink": {
            "kind": "parquet",
            "url": str((state / RESULTS / shard_name(index, shards)).resolve()),
            "table": BATCH_TABLE,
            "commit_interval_s": COMMIT_INTERVAL_S,
        },
    }
    fields.setdefault("log_format", "text")
    fields.setdefault("server", {})
    fields["server"] = {"port": 0, **fields["server"]}
    try:
        config = ConsumerConfig(**fields)  # ROWBATCH_* variables override, as for any command
    except ValidationError as exc:
        problems = "\n".join(
            f"  {'.'.join(str(p) for p in e['loc'] if p not in ('openai', 'table', 'parquet'))}: "
            f"{e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid configuration ({path}):\n{problems}") from None
    return config, ignored


def _shard_index(shard: int | None, shards: int) -> int:
    """This worker's shard: ``--shard``, else ``$JOB_COMPLETION_INDEX`` (as table mode)."""
    from rowbatch.consumer.sources.table.settings import TableSettings  # noqa: PLC0415

    try:
        return TableSettings(input="-", shards=shards, shard=shard).shard_index()
    except (ValueError, ValidationError) as exc:
        raise ConfigError(f"--shard: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rowbatch-consumer openai-batch",
        description=(
            "Run an OpenAI Batch API input file (JSON Lines of custom_id, method, url, body) "
            "through the OpenAI-compatible server of the configuration's [model] with table "
            "mode, and write OpenAI's batch output file: one line per request line, in input "
            "order. A rerun with the same --state resumes (only the requests not yet answered "
            "are sent) and writes the output again."
        ),
        epilog=(
            "exit codes: 0 done (the output written; with --shards, this shard done and the "
            "output written once every shard is); 1 failed while running; 2 bad configuration, "
            "input or state, or a failed start-up check; 3 stopped before the shard was done "
            "(run it again to resume); 4 a part of the requests table could not be read"
        ),
    )
    parser.add_argument(
        "--config",
        type=Path,
        required=True,
        metavar="FILE",
        help=(
            'the TOML file whose [model] (kind = "openai") names the server; its request-shaping '
            "settings (prompt, temperature, sampling...) are ignored: each body is the request"
        ),
    )
    parser.add_argument(
        "--input",
        type=Path,
        required=True,
        metavar="FILE",
        help="the batch input file (JSON Lines)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="the batch output file to write (JSON Lines)",
    )
    parser.add_argument(
        "--state",
        type=Path,
        metavar="DIR",
        help="where the requests, progress and answers are kept (default: "
        "OUTPUT.state); must outlive the run for a rerun to resume",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        metavar="N",
        help="workers splitting the requests (by 1,024-request row group)",
    )
    parser.add_argument(
        "--shard",
        type=int,
        metavar="I",
        help="this worker's shard, 0 to N-1 (default: $JOB_COMPLETION_INDEX)",
    )
    parser.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="also write the table run's summary as JSON to FILE",
    )
    return parser


def _say(text: str) -> None:
    print(f"openai-batch: {text}", file=sys.stderr)


def main(argv: list[str]) -> int:
    """The command (``argv`` after ``openai-batch``); its exit code."""
    args = build_parser().parse_args(argv)
    if args.shards < 1 or (args.shard is not None and not 0 <= args.shard < args.shards):
        _say("error: --shard I needs 0 <= I < --shards N")
        return EXIT_CONFIG
    state: Path = args.state or args.output.with_name(f"{args.output.name}.state")
    if not args.input.is_file():
        _say(f"error: --input {args.input} is not a file")
        return EXIT_CONFIG
    try:
        config, ignored = batch_config(
            args.config,
            requests=state / REQUESTS_FILE,
            state=state,
            shard=args.shard,
            shards=args.shards,
        )
        converted = convert(args.input, state)
    except ConfigError as exc:
        _say(f"error: {exc}")
        return EXIT_CONFIG
    if ignored:
        _say(f"ignored from {args.config}: {', '.join(ignored)} (each line's body is the request)")
    _say(
        f"{args.input}: {converted.lines:,} request line(s), {converted.requests:,} to send, "
        f"{len(converted.bad):,} not requests"
        + "".join(f"\n  {b.message}" for b in converted.bad[:20])
        + (f"\n  ... and {len(converted.bad) - 20:,} more" if len(converted.bad) > 20 else "")
    )
    if converted.requests:
        code = _run_table(config, args.summary)
        if code != 0:
            return code
    counts: Counter[str] = Counter()
    missing = write_output(state, args.shards, converted, args.output, counts)
    if missing:
        _say(
            f"this shard is done; {len(missing):,} request(s) of other shards are not yet: "
            f"the output is written by the last shard to finish (or a rerun of any shard)"
        )
        return 0
    said = ", ".join(f"{n:,} {what}" for what, n in sorted(counts.items()))
    _say(f"wrote {args.output}: {converted.lines:,} lines ({said}); state in {state}")
    return 0


def _run_table(config: ConsumerConfig, summary: Path | None) -> int:
    """The table run, as ``rowbatch-consumer table`` runs it (its exit code)."""
    from rowbatch.consumer.model.inference.errors import InferenceError  # noqa: PLC0415
    from rowbatch.consumer.service import logs  # noqa: PLC0415
    from rowbatch.consumer.service.cli import _execute  # noqa: PLC0415

    logs.configure(config.log_format, config.log_level)
    try:
        return _execute(config, argparse.Namespace(command="table", summary=summary))
    except InferenceError as exc:  # at start-up: a wrong key, model name or URL
        _say(f"error: {exc}")
        return EXIT_CONFIG


__all__ = ["batch_config", "main"]
