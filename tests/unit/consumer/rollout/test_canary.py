"""A canary in the pipeline: the rows whose keys fall in the share are answered by the
candidate and written with its name and version, the rest by production; every row once, a
write never mixes the two, a redelivery lands each row in the same arm, a larger share keeps
the rows of a smaller one, and the candidate's poison rows are isolated as production's are."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.rollout_hooks import Rollout
from rowbatch.consumer.engine.row_keys import RowKeys
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.rollout.arms import in_share, key_places
from rowbatch.consumer.rollout.canary import Canary
from rowbatch.consumer.rollout.metrics import RolloutMetrics
from rowbatch.consumer.sinks.base import ResultRows
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    Rejected,
    message,
)


class ModelSink(FakeSink):
    """Keeps each row's model name and version; every write is of one model."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[tuple[str, int], tuple[str, str]] = {}

    async def write(self, rows: ResultRows) -> int:
        for cid, idx in zip(rows.chunk_id, rows.row_index, strict=True):
            self.model.setdefault((str(cid), int(idx)), (rows.model_name, rows.model_version))
        return await super().write(rows)


def times(k: float, version: str = "") -> FnModel:
    async def run(batch: Batch) -> Answer:
        x = np.asarray(batch.columns["x"])
        if (x < 0).any():
            raise Rejected("negative")
        return Answer({"Y": x * k}, version)

    return FnModel(run, poison=Rejected)


def expected_arms(messages: int, rows: int, share: float, salt: str = "") -> set[tuple[str, int]]:
    ids = [f"chunk-{i}" for i in range(messages)]
    index = np.tile(np.arange(rows, dtype=np.int64), messages)
    chosen = in_share(key_places(ids, [rows] * messages, index, salt), share)
    keys = [(c, r) for c in ids for r in range(rows)]
    return {k for k, c in zip(keys, chosen, strict=True) if c}


async def run_canary(
    share: float, deliveries: list[Any], candidate: FnModel | None = None, salt: str = ""
) -> tuple[FakeSource, ModelSink, Metrics]:
    source, sink, metrics = FakeSource(deliveries), ModelSink(), Metrics()
    watch = RolloutMetrics(metrics.registry, "canary", ["y"])
    canary = Canary(candidate or times(3.0, "7"), share, salt, "m-next", "", metrics=watch)
    pipeline = make_pipeline(
        source,
        sink,
        times(2.0, "1"),
        metrics=metrics,
        rollout=Rollout(canary=canary),
        target_batch_size=16,
        max_wait_s=0.0,
        max_in_flight=2,
    )
    await asyncio.wait_for(pipeline.run(asyncio.Event()), 10)
    return source, sink, metrics


def deliveries(messages: int = 40, rows: int = 10) -> list[Any]:
    return [message(i, [float(i * 100 + r) for r in range(rows)]) for i in range(messages)]


async def test_the_share_s_rows_are_answered_by_the_candidate_and_say_so() -> None:
    source, sink, _ = await run_canary(0.25, deliveries())
    chosen = expected_arms(40, 10, 0.25)
    assert 60 < len(chosen) < 140
    assert len(sink.rows) == 400  # every row once
    for key, value in sink.rows.items():
        base = float(int(key[0].split("-")[1]) * 100 + key[1])
        if key in chosen:
            assert value == base * 3 and sink.model[key] == ("m-next", "7")
        else:
            assert value == base * 2 and sink.model[key] == ("m", "1")
    assert sorted(source.acked) == sorted(f"m{i}" for i in range(40))


async def test_a_redelivery_lands_every_row_in_the_same_arm() -> None:
    _, first, _ = await run_canary(0.1, deliveries())
    _, again, _ = await run_canary(0.1, list(reversed(deliveries())))
    assert first.model == again.model


async def test_a_larger_share_keeps_the_rows_of_a_smaller_one() -> None:
    _, small, _ = await run_canary(0.1, deliveries())
    _, large, _ = await run_canary(0.3, deliveries())
    in_small = {k for k, m in small.model.items() if m[0] == "m-next"}
    in_large = {k for k, m in large.model.items() if m[0] == "m-next"}
    assert in_small < in_large


async def test_a_salt_moves_the_subset() -> None:
    _, sink, _ = await run_canary(0.2, deliveries(), salt="again")
    assert {k for k, m in sink.model.items() if m[0] == "m-next"} == expected_arms(
        40, 10, 0.2, "again"
    )


async def test_rows_the_candidate_rejects_are_isolated_like_production_s() -> None:
    # Message 3's rows are negative: the arm holding each is the one that rejects it.
    batch = deliveries(8, 10)
    batch[3] = message(3, [-1.0] * 10)
    source, sink, metrics = await run_canary(0.5, batch)
    assert [mid for mid, _ in source.dead] == ["m3"]
    assert len(sink.rows) == 70
    assert not any(k[0] == "chunk-3" for k in sink.rows)
    arms = {k[1] for k in expected_arms(8, 10, 0.5) if k[0] == "chunk-3"}
    counts = {
        (arm, outcome): metrics.registry.get_sample_value(
            "rowbatch_rollout_rows_total", {"mode": "canary", "arm": arm, "outcome": outcome}
        )
        or 0.0
        for arm in ("production", "candidate")
        for outcome in ("answered", "failed")
    }
    # Each arm failed its share of message 3's rows; every other row was answered once
    # (isolation sends rows again, but counts each batch's rows once, at its end).
    assert counts[("candidate", "failed")] == len(arms)
    assert counts[("production", "failed")] == 10 - len(arms)
    assert counts[("candidate", "answered")] + counts[("production", "answered")] == 70


def test_split_keeps_each_row_once_in_batch_order() -> None:
    batch = Batch(
        {"x": np.arange(12.0)},
        {},
        (Segment(1, 0, 5), Segment(2, 2, 9)),
        0.0,
    )
    keys = RowKeys(("a", "b"), ("ma", "mb"), (5, 7), np.array([*range(5), *range(2, 9)]))
    canary = Canary(times(3.0), 0.5, "", "m-next", "")
    own, theirs = canary.split(batch, keys)
    assert own is not None and theirs is not None
    got = sorted([*own.columns["x"].tolist(), *theirs.columns["x"].tolist()])
    assert got == list(np.arange(12.0))
    for part in (own, theirs):
        values: Mapping[str, NDArray[Any]] = part.columns
        at = 0
        for seg in part.segments:  # each segment's rows are its message's rows, in order
            base = 0 if seg.message == 1 else 5 - 2
            assert values["x"][at : at + len(seg)].tolist() == [
                float(base + r) for r in range(seg.start, seg.stop)
            ]
            at += len(seg)
