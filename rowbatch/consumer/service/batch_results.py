"""The output of ``rowbatch-consumer openai-batch`` (:mod:`rowbatch.consumer.service.openai_batch`):
one line per input line, in input order, in OpenAI's batch output format, from the answers the
table run wrote to the state folder and from its dead letters."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from rowbatch.consumer.service.batch_requests import REQUESTS_FILE, Converted, replace_file

TABLE_STATE: Final = "table"
RESULTS: Final = "results"
OUTPUT_WINDOW: Final = 4096
"""Lines of answers read at once while the output is written."""


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
    replace_file(output, write)
    if counts is not None:
        counts["answered"] += len(answered)
        done = set(answered)
        counts.update(code for line, (code, _) in outcomes.errors.items() if line not in done)
        counts.update(b.code for b in converted.bad)
    return []
