"""The input of ``rowbatch-consumer openai-batch`` (:mod:`rowbatch.consumer.service.openai_batch`):
an OpenAI Batch API file's lines checked one by one (a bad line is kept, by number, for an error
line of the output, never dropped) and turned into the state folder's Parquet table of requests,
deterministically, so a rerun on the same input resumes."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import orjson
import pyarrow as pa

from rowbatch.consumer.model.openai.handler import BATCH_PATHS
from rowbatch.consumer.service.config import ConfigError

REQUESTS_FILE: Final = "requests.parquet"
MANIFEST_FILE: Final = "requests.json"
ROW_GROUP_ROWS: Final = 1024
"""Requests per row group of the requests table: the unit ``--shards`` splits by."""
MANIFEST_VERSION: Final = 1

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


def replace_file(path: Path, write: Any) -> None:
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

    replace_file(state / REQUESTS_FILE, write)
    converted = Converted(digest.hexdigest(), lines, requests, tuple(bad))
    replace_file(manifest, lambda temporary: temporary.write_bytes(converted.to_json()))
    return converted
