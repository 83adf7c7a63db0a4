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
import hashlib
import os
import sys
import tomllib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa
from pydantic import ValidationError

from rowbatch.consumer.model.openai.handler import BATCH_PATHS
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig

REQUESTS_FILE: Final = "requests.parquet"
MANIFEST_FILE: Final = "requests.json"
TABLE_STATE: Final = "table"
RESULTS: Final = "results"
ROW_GROUP_ROWS: Final = 1024
"""Requests per row group of the requests table: the unit ``--shards`` splits by."""
CHUNK_ROWS: Final = 1
"""Requests per table chunk: one, so a request that fails for good is dead-lettered alone at
once (table mode cuts a chunk with a bad row in halves, and the halves' rows not yet
committed would be asked again)."""
READ_AHEAD_CHUNKS: Final = 256
COMMIT_INTERVAL_S: Final = 5.0
"""How often the answers are committed: a kill redoes at most the answers since, and a run
ends at the first commit after its last answer."""
OUTPUT_WINDOW: Final = 4096
"""Lines of answers read at once while the output is written."""
MANIFEST_VERSION: Final = 1
BATCH_TABLE: Final = "openai_batch"

REQUESTS_SCHEMA: Final = pa.schema(
    [
        pa.field("line", pa.int64(), nullable=False),
        pa.field("custom_id", pa.string(), nullable=False),
        pa.field("url", pa.string(), nullable=False),
        pa.field("body", pa.string(), nullable=False),
    ]
)

#: Codes of the lines that are not requests (the output's ``error.code``).
INVALID_JSON: Final = "invalid_json_line"
INVALID_REQUEST: Final = "invalid_request"
DUPLICATE_ID: Final = "duplicate_custom_id"

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


class BatchStateError(ConfigError):
    """The state folder holds another input's requests."""


# --- the input --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BadLine:
    """An input line that is not a request: it gets an error line of its own."""

    line: int
    custom_id: str | None
    code: str
    message: str


@dataclass(frozen=True)
class Request:
    line: int
    custom_id: str
    url: str
    body: str
    """The body's JSON (compact)."""


def parse_line(number: int, raw: bytes, seen: dict[str, int]) -> Request | BadLine:
    """Line ``number`` of the input as a request, or why it is not one. ``seen``: the custom
    ids of the requests before it (with their lines); a request's is added."""
    try:
        item = orjson.loads(raw.rstrip(b"\r\n"))
    except orjson.JSONDecodeError as exc:
        why = f"not JSON: {exc.msg} at character {exc.pos + 1}"
        return BadLine(number, None, INVALID_JSON, f"line {number}: {why}")
    if not isinstance(item, dict):
        kind = type(item).__name__
        return BadLine(number, None, INVALID_JSON, f"line {number}: a JSON {kind}, not an object")
    custom_id = item.get("custom_id")
    problem = _problem(item, seen)
    if problem is not None:
        named = custom_id if isinstance(custom_id, str) else None
        return BadLine(number, named, problem[0], f"line {number}: {problem[1]}")
    named_id = str(custom_id)
    seen[named_id] = number
    return Request(number, named_id, str(item["url"]), orjson.dumps(item["body"]).decode())


def _problem(item: Mapping[str, Any], seen: Mapping[str, int]) -> tuple[str, str] | None:
    """Why a line's object is not a request (its code and words), or None."""
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return INVALID_REQUEST, f"custom_id is {custom_id!r}, not a non-empty string"
    method = item.get("method", "POST")
    url = item.get("url")
    body = item.get("body")
    if method != "POST":
        why = f"method is {method!r}; a batch request is a POST"
    elif url not in BATCH_PATHS:
        why = f"url {url!r} is not one of {', '.join(sorted(BATCH_PATHS))}"
    elif not isinstance(body, dict):
        why = f"body is a JSON {type(body).__name__}, not an object"
    elif custom_id in seen:
        return DUPLICATE_ID, f"custom_id {custom_id!r} is also on line {seen[custom_id]}"
    else:
        return None
    return INVALID_REQUEST, why


def read_input(lines: Iterable[bytes]) -> Iterator[Request | BadLine]:
    """Each request line (1-based numbers; blank lines hold no request and are skipped)."""
    seen: dict[str, int] = {}
    for number, raw in enumerate(lines, 1):
        text = raw.removeprefix(b"\xef\xbb\xbf") if number == 1 else raw
        if not text.strip():
            continue
        yield parse_line(number, text, seen)


@dataclass(frozen=True)
class Converted:
    """The input as the state folder holds it."""

    sha256: str
    lines: int
    """Request lines (blank ones not counted): the output's lines."""
    requests: int
    bad: tuple[BadLine, ...]

    def to_json(self) -> bytes:
        data = {**asdict(self), "version": MANIFEST_VERSION}
        return orjson.dumps(data, option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, text: bytes) -> Converted:
        data = orjson.loads(text)
        return cls(
            sha256=data["sha256"],
            lines=data["lines"],
            requests=data["requests"],
            bad=tuple(BadLine(**b) for b in data["bad"]),
        )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _hashed_lines(path: Path, digest: Any) -> Iterator[bytes]:
    with path.open("rb") as f:
        for raw in f:
            digest.update(raw)
            yield raw


def _replace(path: Path, write: Any) -> None:
    """``write(temporary)`` then rename it to ``path`` (whole or not at all; shards that
    convert at once write the same bytes)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        temporary.replace(path)
    finally:
        temporary.unlink(missing_ok=True)


def convert(source: Path, state: Path) -> Converted:
    """The input's requests as ``state/requests.parquet`` and its manifest; kept when the
    state already holds this input's (a rerun), refused (:class:`BatchStateError`) when it
    holds another's."""
    state.mkdir(parents=True, exist_ok=True)
    manifest = state / MANIFEST_FILE
    if manifest.is_file() and (state / REQUESTS_FILE).is_file():
        known = Converted.from_json(manifest.read_bytes())
        sha = file_sha256(source)
        if sha != known.sha256:
            raise BatchStateError(
                f"the state {state} holds the requests of another input (SHA-256 "
                f"{known.sha256[:12]}..., {source} is {sha[:12]}...): give another --state, or "
                "remove it to start over"
            )
        return known
    digest = hashlib.sha256()
    bad: list[BadLine] = []
    lines = requests = 0

    def write(temporary: Path) -> None:
        nonlocal lines, requests
        import pyarrow.parquet as pq  # noqa: PLC0415  # table mode's modules only here

        pending: list[Request] = []
        with pq.ParquetWriter(temporary, REQUESTS_SCHEMA, compression="zstd") as writer:

            def flush() -> None:
                columns = {
                    "line": [r.line for r in pending],
                    "custom_id": [r.custom_id for r in pending],
                    "url": [r.url for r in pending],
                    "body": [r.body for r in pending],
                }
                writer.write_table(pa.Table.from_pydict(columns, schema=REQUESTS_SCHEMA))
                pending.clear()

            for item in read_input(_hashed_lines(source, digest)):
                lines += 1
                if isinstance(item, BadLine):
                    bad.append(item)
                    continue
                requests += 1
                pending.append(item)
                if len(pending) == ROW_GROUP_ROWS:
                    flush()
            if pending or not requests:
                flush()

    _replace(state / REQUESTS_FILE, write)
    converted = Converted(digest.hexdigest(), lines, requests, tuple(bad))
    _replace(manifest, lambda temporary: temporary.write_bytes(converted.to_json()))
    return converted


# --- the output -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcomes:
    """What the state holds of every request line."""

    custom_ids: Mapping[int, str]
    """Each request's line -> its custom id."""
    errors: Mapping[int, tuple[str, str]]
    """A dead-lettered request's line -> (code, message)."""
    answered: frozenset[int]
    """The lines with an answer."""

    def missing(self) -> list[int]:
        """Request lines with no outcome yet (another shard's, or a run that stopped)."""
        return sorted(set(self.custom_ids) - self.answered - set(self.errors))


def batch_request_id(sha256: str, line: int, kind: str = "batch_req") -> str:
    """A stable id for line ``line`` of the input with hash ``sha256`` (a rerun writes the
    same output)."""
    return f"{kind}_{hashlib.sha256(f'{sha256}:{line}:{kind}'.encode()).hexdigest()[:32]}"


def answer_line(sha256: str, line: int, custom_id: str, response: str) -> bytes:
    """The output line of an answered request (``response``: the answer's JSON text)."""
    return orjson.dumps(
        {
            "id": batch_request_id(sha256, line),
            "custom_id": custom_id,
            "response": {
                "status_code": 200,
                "request_id": batch_request_id(sha256, line, "req"),
                "body": orjson.Fragment(response),
            },
            "error": None,
        }
    )


def error_line(sha256: str, line: int, custom_id: str | None, code: str, message: str) -> bytes:
    """The output line of a request that failed for good (or of a line that is none)."""
    return orjson.dumps(
        {
            "id": batch_request_id(sha256, line),
            "custom_id": custom_id,
            "response": None,
            "error": {"code": code, "message": message},
        }
    )


def output_lines(
    converted: Converted,
    outcomes: Outcomes,
    answers: Iterable[tuple[int, str]],
) -> Iterator[bytes]:
    """The output file's lines, in input order: ``answers`` are (line, response JSON) in line
    order; every request line needs an answer or an error (:meth:`Outcomes.missing`)."""
    bad = {b.line: b for b in converted.bad}
    answer_iter = iter(answers)
    pending = next(answer_iter, None)
    for line in sorted((*outcomes.custom_ids, *bad)):
        if line in bad:
            b = bad[line]
            yield error_line(converted.sha256, line, b.custom_id, b.code, b.message)
            continue
        while pending is not None and pending[0] < line:
            pending = next(answer_iter, None)
        custom_id = outcomes.custom_ids[line]
        if pending is not None and pending[0] == line:
            yield answer_line(converted.sha256, line, custom_id, pending[1])
        elif line in outcomes.errors:
            code, message = outcomes.errors[line]
            yield error_line(converted.sha256, line, custom_id, code, message)
        else:
            raise ValueError(f"line {line} (custom_id {custom_id!r}) has no outcome")


def shard_name(shard: int, shards: int) -> str:
    return f"shard-{shard}-of-{shards}"


def _result_datasets(state: Path, shards: int) -> list[Any]:
    import pyarrow.dataset as ds  # noqa: PLC0415

    found = []
    for shard in range(shards):
        root = state / RESULTS / shard_name(shard, shards)
        if root.is_dir():
            dataset = ds.dataset(str(root), format="parquet", partitioning="hive")
            if dataset.files:
                found.append(dataset)
    return found


def read_outcomes(state: Path, shards: int) -> Outcomes:
    """The requests' outcomes so far: the answers of every shard's dataset, the dead letters
    of every shard's table state."""
    import pyarrow.parquet as pq  # noqa: PLC0415

    from rowbatch.consumer.sources.table.dead_letters import (  # noqa: PLC0415
        UNREADABLE_CODE,
        read_dead_letters,
    )
    from rowbatch.consumer.sources.table.state import StateFolder  # noqa: PLC0415

    table = pq.read_table(state / REQUESTS_FILE, columns=["line", "custom_id"])
    lines: list[int] = table["line"].to_pylist()
    custom_ids = dict(zip(lines, table["custom_id"].to_pylist(), strict=True))
    errors: dict[int, tuple[str, str]] = {}
    for shard in range(shards):
        folder = state / TABLE_STATE / shard_name(shard, shards)
        if not folder.is_dir():
            continue
        for letter in read_dead_letters(StateFolder(str(state / TABLE_STATE), folder.name)):
            row = letter.get("file_row")
            if letter.get("code") == UNREADABLE_CODE or not isinstance(row, int):
                continue  # a part of the requests file that could not be read: not settled
            if 0 <= row < len(lines):
                errors[lines[row]] = (str(letter.get("code")), str(letter.get("message")))
    answered: set[int] = set()
    for dataset in _result_datasets(state, shards):
        answered.update(dataset.to_table(columns=["line"])["line"].to_pylist())
    return Outcomes(custom_ids, errors, frozenset(answered))


def read_answers(state: Path, shards: int, lines: Iterable[int]) -> Iterator[tuple[int, str]]:
    """(line, response) of the answered ``lines``, in line order, a window at a time."""
    import pyarrow.dataset as ds  # noqa: PLC0415

    datasets = _result_datasets(state, shards)
    ordered = sorted(lines)
    for start in range(0, len(ordered), OUTPUT_WINDOW):
        window = ordered[start : start + OUTPUT_WINDOW]
        wanted = (ds.field("line") >= window[0]) & (ds.field("line") <= window[-1])
        found: dict[int, str] = {}
        for dataset in datasets:
            part = dataset.to_table(columns=["line", "response"], filter=wanted)
            found.update(zip(part["line"].to_pylist(), part["response"].to_pylist(), strict=True))
        for line in window:
            yield line, found[line]


def write_output(
    state: Path,
    shards: int,
    converted: Converted,
    output: Path,
    counts: Counter[str] | None = None,
) -> list[int]:
    """Writes the output file (whole or not at all) when every request line has an outcome
    (and counts its lines in ``counts``: ``answered``, and each error code); else writes
    nothing and returns the lines still without one."""
    outcomes = read_outcomes(state, shards) if converted.requests else Outcomes({}, {}, frozenset())
    missing = outcomes.missing()
    if missing:
        return missing
    answered = sorted(outcomes.answered & set(outcomes.custom_ids))

    def write(temporary: Path) -> None:
        with temporary.open("wb") as f:
            answers = read_answers(state, shards, answered)
            for text in output_lines(converted, outcomes, answers):
                f.write(text + b"\n")

    output.parent.mkdir(parents=True, exist_ok=True)
    _replace(output, write)
    if counts is not None:
        counts["answered"] += len(answered)
        done = set(answered)
        counts.update(code for line, (code, _) in outcomes.errors.items() if line not in done)
        counts.update(b.code for b in converted.bad)
    return []


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
    from rowbatch.consumer.service.shutdown import exit_past_stuck_threads  # noqa: PLC0415

    return exit_past_stuck_threads(_main(argv))


def _main(argv: list[str]) -> int:
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


__all__ = [
    "BadLine",
    "Converted",
    "Outcomes",
    "Request",
    "batch_config",
    "convert",
    "main",
    "output_lines",
    "parse_line",
    "read_input",
    "read_outcomes",
    "write_output",
]
