"""A shadow beside the pipeline: production's rows are written as without it, the candidate's
answers land in the comparison table beside production's (its failures as errors, its
refused writes counted), and a candidate that never answers or a full backlog changes nothing
on the production side (rows skipped and counted, never waited for)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from rowbatch.consumer.engine.batcher import Batch
from rowbatch.consumer.engine.rollout_hooks import Rollout
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.candidate import CandidateSettings
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.rollout.comparison import (
    CANDIDATE_ERROR,
    CANDIDATE_LATENCY,
    LATENCY,
    PRODUCTION_VERSION,
    ComparisonLayout,
    agreeing,
)
from rowbatch.consumer.rollout.metrics import RolloutMetrics
from rowbatch.consumer.rollout.shadow import Shadow
from rowbatch.consumer.sinks.base import ResultRows, TableSpec
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import FakeSink, FakeSource, FnModel, message
from tests.unit.consumer.rollout.test_canary import expected_arms


class ComparisonSink:
    def __init__(self, *, fail: bool = False) -> None:
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}
        self.fail = fail
        self.written = asyncio.Event()

    async def open(self, table: TableSpec) -> None:
        pass

    async def write(self, rows: ResultRows) -> int:
        if self.fail:
            raise OSError("the comparison table is down")
        for i, (cid, idx) in enumerate(zip(rows.chunk_id, rows.row_index, strict=True)):
            self.rows[(str(cid), int(idx))] = {
                "version": rows.model_version,
                **{
                    k: None if rows.nulls.get(k, np.zeros(len(rows), bool))[i] else v[i]
                    for k, v in rows.outputs.items()
                },
            }
        self.written.set()
        return len(rows)

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        pass

    async def close(self) -> None:
        pass


def model(
    k: float,
    version: str,
    *,
    hang: asyncio.Event | None = None,
    fail: bool = False,
    differ: bool = True,
) -> FnModel:
    """``x * k``, and one more where ``x % 10 == 7`` when ``differ`` (the candidate)."""

    async def run(batch: Batch) -> Answer:
        if hang is not None:
            await hang.wait()
        if fail:
            raise RuntimeError("candidate exploded")
        x = np.asarray(batch.columns["x"])
        return Answer({"Y": np.where(differ & (x % 10 == 7), x * k + 1, x * k)}, version)

    return FnModel(run)


def counted(registry: CollectorRegistry, outcome: str, arm: str = "candidate") -> float:
    value = registry.get_sample_value(
        "rowbatch_rollout_rows_total", {"mode": "shadow", "arm": arm, "outcome": outcome}
    )
    return value or 0.0


async def run_shadow(
    candidate: FnModel,
    sink: ComparisonSink,
    *,
    share: float | None = None,
    backlog_rows: int = 4096,
    messages: int = 20,
    wait_for_rows: int | None = None,
) -> tuple[FakeSource, FakeSink, Metrics]:
    settings = CandidateSettings(mode="shadow", share=share, backlog_rows=backlog_rows)
    metrics = Metrics()
    shadow = Shadow(
        sink,
        settings=settings,
        layout=ComparisonLayout({"Y": "y"}, (), "m", ""),
        metrics=RolloutMetrics(metrics.registry, "shadow", ["y"]),
        max_bytes=10_000_000,
    )
    task = asyncio.create_task(shadow.run(candidate, 2))
    deliveries = [message(i, [float(i * 10 + r) for r in range(10)]) for i in range(messages)]
    source, results = FakeSource(deliveries), FakeSink()
    pipeline = make_pipeline(
        source,
        results,
        model(2.0, "1", differ=False),
        metrics=metrics,
        rollout=Rollout(shadow=shadow.offer),
        target_batch_size=16,
        max_wait_s=0.0,
        max_in_flight=2,
    )
    try:
        await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)
        if wait_for_rows is not None:
            async with asyncio.timeout(10):
                while len(sink.rows) < wait_for_rows:
                    sink.written.clear()
                    await sink.written.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return source, results, metrics


def production_unchanged(source: FakeSource, results: FakeSink, messages: int = 20) -> None:
    assert len(results.rows) == messages * 10
    assert all(v == (float(k[0].split("-")[1]) * 10 + k[1]) * 2 for k, v in results.rows.items())
    assert len(source.acked) == messages and not source.nacked and not source.dead


async def test_the_comparison_table_holds_both_answers_of_every_row() -> None:
    sink = ComparisonSink()
    source, results, metrics = await run_shadow(model(2.0, "2"), sink, wait_for_rows=200)
    production_unchanged(source, results)
    assert len(sink.rows) == 200
    differ = {k for k, r in sink.rows.items() if r["y"] != r["y__candidate"]}
    assert differ == {k for k in sink.rows if k[1] == 7}  # x % 10 == 7 <=> row 7
    row = sink.rows[("chunk-3", 7)]
    assert row["version"] == "2" and row[PRODUCTION_VERSION] == "1"
    assert row[CANDIDATE_ERROR] is None and row[LATENCY] >= 0 and row[CANDIDATE_LATENCY] >= 0
    r = metrics.registry
    assert counted(r, "answered") == 200 and counted(r, "answered", "production") == 200
    agree = r.get_sample_value(
        "rowbatch_rollout_agreement_rows_total", {"output": "y", "agree": "true"}
    )
    assert agree == 180


async def test_a_share_shadows_only_its_rows() -> None:
    sink = ComparisonSink()
    want = expected_arms(40, 10, 0.25)
    await run_shadow(model(2.0, "2"), sink, share=0.25, messages=40, wait_for_rows=len(want))
    assert set(sink.rows) == want


async def test_a_failing_candidate_is_written_as_its_error_and_changes_nothing() -> None:
    sink = ComparisonSink()
    source, results, metrics = await run_shadow(model(2.0, "2", fail=True), sink, wait_for_rows=200)
    production_unchanged(source, results)
    assert all(r["y__candidate"] is None for r in sink.rows.values())
    assert all("candidate exploded" in r[CANDIDATE_ERROR] for r in sink.rows.values())
    assert counted(metrics.registry, "failed") == 200


async def test_a_candidate_that_never_answers_holds_nothing_back() -> None:
    sink = ComparisonSink()
    hang = asyncio.Event()
    source, results, metrics = await run_shadow(model(2.0, "2", hang=hang), sink, backlog_rows=50)
    production_unchanged(source, results)
    r = metrics.registry
    assert counted(r, "skipped") >= 150  # the backlog holds at most 50 rows
    assert counted(r, "dropped") <= 50 and counted(r, "dropped") > 0
    assert not sink.rows


async def test_a_comparison_table_that_refuses_writes_costs_samples_only() -> None:
    sink = ComparisonSink(fail=True)
    source, results, metrics = await run_shadow(model(2.0, "2"), sink)
    production_unchanged(source, results)
    r = metrics.registry
    assert counted(r, "unwritten") + counted(r, "dropped") == 200
    assert counted(r, "unwritten") > 0


def test_agreement_of_floats_ints_and_vectors() -> None:
    a = np.array([1.0, 2.0, 3.0], np.float32)
    assert agreeing(a, a + np.float32(1e-7)).tolist() == [True, True, True]
    assert agreeing(a, a + np.array([0, 1, 0], np.float32)).tolist() == [True, False, True]
    assert agreeing(np.array([1, 0]), np.array([1, 1])).tolist() == [True, False]
    v = np.ones((2, 4), np.float32)
    w = v.copy()
    w[1, 3] = 0
    assert agreeing(v, w).tolist() == [True, False]
