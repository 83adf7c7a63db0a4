"""A rollout of a generative model (issue 52: "any handler"): an OpenAI-compatible production
model and a candidate that answers longer (``max_tokens`` replaced under ``[model.candidate]``)
on the fixed-step server (harness/fixed_step_llm.py: ``"x"`` a token), over the Pub/Sub
emulator into SQLite.

- Shadow: the result table holds production's 3-token answers; the comparison table holds both
  answers of every row, and ``rowbatch-consumer compare`` (SQLite read back) finds every row's
  text changed.
- Canary at 30 %: the rows whose key hash names the candidate carry its 5-token answers and its
  name, the others production's."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from harness.fixed_step_llm import FixedStepLlmEndpoint, FixedStepLlmService
from harness.service import RunDir
from rowbatch.consumer.rollout.arms import in_share, key_places
from rowbatch.consumer.rollout.compare_cli import build_parser as compare_parser
from rowbatch.consumer.rollout.compare_cli import run_compare
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.encode import encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until

pytestmark = pytest.mark.timeout(300)

MESSAGES = 10
ROWS = 20


@pytest.fixture(scope="module")
def llm(run_dir: RunDir) -> Iterator[FixedStepLlmEndpoint]:
    service = FixedStepLlmService(
        RunDir(run_dir.root / f"rollout-llm-{time.monotonic_ns()}"),
        slots=64,
        step_ms=2,
        max_waiting=256,
        name="fixed_step_llm_rollout",
    )
    try:
        yield service.start()
    finally:
        service.stop()


def config(
    topics: Topics, llm: FixedStepLlmEndpoint, db: Path, candidate: dict[str, Any]
) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": topics.source(),
            "model": {
                "kind": "openai",
                "url": llm.url,
                "name": llm.model,
                "prompt": "Say something about {topic}.",
                "max_tokens": 3,
                "max_in_flight": 16,
                "max_wait_ms": 20,
                "startup_wait_s": 30,
                "candidate": {"max_tokens": 5, **candidate},
            },
            "binding": {
                "outputs": {"text": "answer", "completion_tokens": "completion_tokens"},
                "passthrough": {"id": "int64"},
            },
            "sink": {"kind": "sqlite", "path": str(db), "table": "answers"},
            "server": {"port": 0},
            "log_format": "text",
        }
    )


def publish(topics: Topics) -> None:
    topics.publish(
        [
            encode_chunk(
                "docs",
                {
                    "id": np.arange(n * ROWS, (n + 1) * ROWS, dtype=np.int64),
                    "topic": [f"topic {n}-{r}" for r in range(ROWS)],
                },
                "json",
                f"gen-{n}",
            )
            for n in range(MESSAGES)
        ]
    )


def select(db: Path, sql: str) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        try:
            return conn.execute(sql).fetchall()
        except sqlite3.OperationalError:  # not created yet
            return []


def count(db: Path, table: str) -> int:
    found = select(db, f"SELECT count(*) FROM {table}")
    return int(found[0][0]) if found else 0


async def test_a_shadow_of_a_generative_candidate(
    topics: Topics, llm: FixedStepLlmEndpoint, tmp_path: Path
) -> None:
    total = MESSAGES * ROWS
    db = tmp_path / "results.sqlite"
    publish(topics)
    cfg = config(topics, llm, db, {"mode": "shadow"})
    async with consumer_running(cfg) as run:
        await wait_until(
            lambda: count(db, "answers_candidate") == total, 120, "compared rows", run.task
        )
    answers = select(
        db, "SELECT id, answer, completion_tokens, model_name FROM answers ORDER BY id"
    )
    assert [(a[1], a[2], a[3]) for a in answers] == [("xxx", 3, llm.model)] * total
    compared = select(
        db,
        "SELECT answer, answer__candidate, completion_tokens, completion_tokens__candidate, "
        "candidate_error FROM answers_candidate",
    )
    assert set(compared) == {("xxx", "xxxxx", 3, 5, None)}
    out = tmp_path / "compare.json"
    assert run_compare(cfg, compare_parser().parse_args(["--json", str(out)])) == 0
    report = json.loads(out.read_text())
    text = next(o for o in report["outputs"] if o["name"] == "answer")
    assert report["rows"] == total and text["kind"] == "class"
    assert text["flipped"]["total"] == total and text["agreement"] == 0.0
    assert topics.dead_letters(0) == []


async def test_a_canary_of_a_generative_candidate(
    topics: Topics, llm: FixedStepLlmEndpoint, tmp_path: Path
) -> None:
    total = MESSAGES * ROWS
    db = tmp_path / "results.sqlite"
    publish(topics)
    cfg = config(topics, llm, db, {"mode": "canary", "share": 0.3, "name": llm.model})
    async with consumer_running(cfg) as run:
        await wait_until(lambda: count(db, "answers") == total, 120, "all rows", run.task)
    rows = select(db, "SELECT chunk_id, row_index, answer FROM answers ORDER BY id")
    places = key_places([r[0] for r in rows], [1] * total, np.array([r[1] for r in rows]))
    chosen = in_share(places, 0.3)
    assert 0 < chosen.sum() < total
    assert [r[2] for r in rows] == ["xxxxx" if c else "xxx" for c in chosen.tolist()]
    assert topics.dead_letters(0) == []
