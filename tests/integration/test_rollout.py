"""Shadow and canary versions (issue 52) on the real stack: the Pub/Sub emulator, PostgreSQL,
and a tritonserver serving ``scorer`` in two versions that differ exactly on the rows whose
``COUNT % 10 == 7`` (:func:`harness.model_repository.scorer_versions_repository`).

- Shadow: production (v1) results are written as without a shadow, and the comparison table
  holds both versions' answers of every row: the rows that changed are exactly the known ones.
- Shadow with a candidate that is down (nothing listening) or slow (1 s an execution, a small
  backlog): every row is written once by production, none dead-lettered, the candidate's rows
  skipped and counted.
- Canary at 10 %: each row is written by the arm its key hash names (v2 for those below the
  share) and that holds across a kill -9 and redelivery (a child process killed mid-run, a
  second one finishing); the measured share is within sampling error of 10 %."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from prometheus_client import CollectorRegistry

from harness.model_repository import scorer_versions_repository
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from harness.reference_models import score, score_v2, v2_differs
from harness.service import RunDir
from harness.triton import TritonEndpoint, TritonService
from rowbatch.consumer.rollout.arms import in_share, key_places
from rowbatch.consumer.rollout.compare_cli import build_parser as compare_parser
from rowbatch.consumer.rollout.compare_cli import run_compare
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until
from tests.integration.test_consumer_process import (
    REDELIVERY_TIMEOUT_S,
    launcher,
    pg_count,
    unique_table,
    wait_for,
    wait_ready,
)

pytestmark = pytest.mark.timeout(400)

CHUNK_ROWS = 500
BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}


@pytest.fixture(scope="module")
def versions(run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonEndpoint]:
    """A tritonserver of its own: ``scorer`` v1 and v2, and ``scorer_slow`` whose v2 takes 1 s
    an execution."""
    root = tmp_path_factory.mktemp("rollout-models")
    scorer_versions_repository(root)
    scorer_versions_repository(root, name="scorer_slow", v2_delay_ms=1000.0)
    service = TritonService(
        RunDir(run_dir.root / f"rollout-{time.monotonic_ns()}"), root, name="triton-rollout"
    )
    try:
        yield service.start()
    finally:
        service.stop()


def chunks(total: int, seed: int) -> tuple[list[EncodedChunk], np.ndarray, np.ndarray]:
    """Chunks of :data:`CHUNK_ROWS` rows (ids 0..total-1, ``count = id % 1000``), alternately
    Arrow and JSON, with their features and counts."""
    rng = np.random.default_rng(seed)
    features = rng.normal(0.0, 0.5, size=(total, 16)).astype(np.float32)
    counts = np.arange(total, dtype=np.int64) % 1000
    out = [
        encode_chunk(
            "events",
            {
                "id": np.arange(start, start + CHUNK_ROWS, dtype=np.int64),
                "features": features[start : start + CHUNK_ROWS],
                "count": counts[start : start + CHUNK_ROWS],
            },
            "arrow" if n % 2 == 0 else "json",
            f"rollout-{seed}-{n}",
        )
        for n, start in enumerate(range(0, total, CHUNK_ROWS))
    ]
    return out, features, counts


def config(
    topics: Topics, triton: TritonEndpoint, dsn: str, table: str, candidate: dict[str, Any]
) -> dict[str, Any]:
    return {
        "source": topics.source(),
        "model": {
            "url": triton.grpc_url,
            "name": "scorer",
            "version": "1",
            "max_wait_ms": 20,
            "candidate": candidate,
        },
        "binding": BINDING,
        "sink": {"kind": "postgres", "dsn": dsn, "table": table},
        "server": {"port": 0},
        "log_format": "text",
    }


def rows(dsn: str, sql: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def rollout_rows(registry: CollectorRegistry, mode: str, arm: str, outcome: str) -> float:
    value = registry.get_sample_value(
        "rowbatch_rollout_rows_total", {"mode": mode, "arm": arm, "outcome": outcome}
    )
    return value or 0.0


def assert_production_results(
    dsn: str, table: str, features: np.ndarray, counts: np.ndarray
) -> None:
    """Every row once, v1's answer, written as v1."""
    got = rows(dsn, f"SELECT id, score, label, model_version FROM {table} ORDER BY id")
    assert [r[0] for r in got] == list(range(len(counts))), "every id exactly once"
    want_score, want_label = score(features, counts.reshape(-1, 1))
    np.testing.assert_array_equal(np.array([r[1] for r in got], np.float32), want_score[:, 0])
    assert [r[2] for r in got] == want_label[:, 0].tolist()
    assert {r[3] for r in got} == {"1"}


async def test_shadow_finds_exactly_the_rows_v2_changes(
    topics: Topics, versions: TritonEndpoint, postgres: PostgresEndpoint, tmp_path: Path
) -> None:
    total = 10_000
    table = unique_table("shadow")
    published, features, counts = chunks(total, seed=52)
    topics.publish(published)
    candidate = {"mode": "shadow", "version": "2", "backlog_rows": 20_000}
    cfg = ConsumerConfig.model_validate(config(topics, versions, postgres.dsn, table, candidate))
    async with consumer_running(cfg) as run:
        await wait_until(lambda: bool(run.running), 60, "the consumer running", run.task)
        await wait_until(
            lambda: pg_count(postgres.dsn, f"{table}_candidate") == total,
            what=f"{total} compared rows",
            alive=run.task,
        )
        registry = run.running[0].metrics.registry
        assert rollout_rows(registry, "shadow", "candidate", "skipped") == 0
        assert rollout_rows(registry, "shadow", "candidate", "answered") == total
    assert_production_results(postgres.dsn, table, features, counts)
    compared = rows(
        postgres.dsn,
        f"SELECT id, score, score__candidate, label, label__candidate, production_version, "
        f"model_version, candidate_error FROM {table}_candidate ORDER BY id",
    )
    assert [r[0] for r in compared] == list(range(total))
    flipped = {r[0] for r in compared if r[3] != r[4]}
    assert flipped == set(np.flatnonzero(v2_differs(counts)).tolist())
    want2 = score_v2(features, counts.reshape(-1, 1))[0][:, 0]
    np.testing.assert_array_equal(np.array([r[2] for r in compared], np.float32), want2)
    assert {(r[5], r[6], r[7]) for r in compared} == {("1", "2", None)}
    assert topics.dead_letters(0) == []
    # The report over the table (PostgreSQL read back): the flipped labels are the known rows.
    out = tmp_path / "compare.json"
    args = compare_parser().parse_args(["--json", str(out), "--flipped", "5"])
    assert run_compare(cfg, args) == 0
    report = json.loads(out.read_text())
    assert report["rows"] == total and report["candidate_failed"] == 0
    label = next(o for o in report["outputs"] if o["name"] == "label")
    assert label["flipped"]["total"] == len(flipped)
    assert label["agreement"] == pytest.approx(1 - len(flipped) / total)
    assert [r["id"] for r in label["flipped"]["rows"]] == sorted(flipped)[:5]


@pytest.mark.parametrize("candidate_kind", ["down", "slow"])
async def test_a_candidate_down_or_slow_changes_nothing_for_production(
    topics: Topics, versions: TritonEndpoint, postgres: PostgresEndpoint, candidate_kind: str
) -> None:
    total = 10_000
    table = unique_table(f"shadow_{candidate_kind}")
    published, features, counts = chunks(total, seed=53)
    topics.publish(published)
    candidate: dict[str, Any] = {"mode": "shadow", "version": "2", "backlog_rows": 1000}
    if candidate_kind == "down":
        candidate["url"] = f"127.0.0.1:{free_port()}"  # nothing listens
    else:
        candidate["name"] = "scorer_slow"
    cfg = ConsumerConfig.model_validate(config(topics, versions, postgres.dsn, table, candidate))
    async with consumer_running(cfg) as run:
        await wait_until(
            lambda: pg_count(postgres.dsn, table) == total, what=f"{total} rows", alive=run.task
        )
        registry = run.running[0].metrics.registry
        skipped = rollout_rows(registry, "shadow", "candidate", "skipped")
        answered = rollout_rows(registry, "shadow", "candidate", "answered")
    assert_production_results(postgres.dsn, table, features, counts)
    assert topics.dead_letters(0) == []
    print(f"\ncandidate {candidate_kind}: {skipped:.0f} rows skipped, {answered:.0f} compared")
    if candidate_kind == "down":
        assert skipped == total and answered == 0
    else:
        assert skipped > 0 and answered + skipped <= total


@pytest.mark.timeout(600)
def test_canary_rows_keep_their_arm_across_a_kill_9(
    topics: Topics,
    pubsub: PubSubEndpoint,
    versions: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
) -> None:
    total = 40_000
    share = 0.1
    table = unique_table("canary")
    published, features, counts = chunks(total, seed=54)
    topics.publish(published)
    cfg = config(
        topics, versions, postgres.dsn, table, {"mode": "canary", "share": share, "version": "2"}
    )
    cfg["source"] = {**cfg["source"], "max_lease_extension_s": 10}

    def count() -> int:
        return pg_count(postgres.dsn, table)

    with launcher(tmp_path, pubsub, cfg) as runs:
        first = runs.start("first")
        wait_ready(first)
        wait_for(lambda: count() > 0, 60, "the first rows", first, every_s=0.02)
        first.send(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        at_kill = count()
        assert 0 < at_kill < total, f"{at_kill} of {total} rows written when killed"
        second = runs.start("second")
        wait_ready(second)
        wait_for(lambda: count() == total, REDELIVERY_TIMEOUT_S, f"{total} rows", second)
        second.send(signal.SIGTERM)
        assert second.wait(60) == 0, second.log()
    got = rows(
        postgres.dsn,
        f"SELECT chunk_id, row_index, id, score, label, model_version FROM {table} ORDER BY id",
    )
    assert [r[2] for r in got] == list(range(total)), "every id exactly once"
    places = key_places([r[0] for r in got], [1] * total, np.array([r[1] for r in got], np.int64))
    chosen = in_share(places, share)
    assert [r[5] for r in got] == ["2" if c else "1" for c in chosen.tolist()]
    v1, v2 = score(features, counts.reshape(-1, 1)), score_v2(features, counts.reshape(-1, 1))
    want = np.where(chosen, v2[0][:, 0], v1[0][:, 0])
    np.testing.assert_array_equal(np.array([r[3] for r in got], np.float32), want)
    measured = chosen.mean()
    print(f"\ncanary: {measured:.2%} of {total} rows by v2 ({at_kill} written at the kill)")
    assert abs(measured - share) < 5 * (share * (1 - share) / total) ** 0.5
    assert topics.dead_letters(0) == []
