"""``model_version`` from the inference response when the spec names none (MLServer's metadata
lists no versions): the client reads it from each answer, the batch runner keeps it, each
written row carries the version of the answer it came from (a write never mixes two), and a
fixed version (Triton's, from discovery) still wins."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from harness.model_specs import SCORER
from rowbatch.consumer.engine.batcher import Batch, Segment
from rowbatch.consumer.engine.ledger import Ledger
from rowbatch.consumer.engine.pipeline import Pipeline
from rowbatch.consumer.engine.results import Answered, ResultBuilder, split_by_message
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.handler import OipHandler
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.sinks.base import ResultRows
from tests.unit.consumer.engine.factories import make_pipeline
from tests.unit.consumer.engine.test_pipeline import (
    FakeSink,
    FakeSource,
    FnModel,
    message,
)
from tests.unit.consumer.model.test_inference import FakeResult, FakeTriton


class VersionedResult(FakeResult):
    """An InferResult whose response names the model version that answered."""

    def __init__(self, arrays: dict[str, NDArray[Any]], version: str) -> None:
        super().__init__(arrays)
        self.version = version

    def get_response(self) -> Any:
        return SimpleNamespace(model_version=self.version)


class VersionedTriton(FakeTriton):
    def __init__(self, version: str) -> None:
        super().__init__([{"SCORE": np.ones((2, 1), np.float32)}])
        self.version = version

    async def infer(self, model: str, inputs: list[Any], **kwargs: Any) -> FakeResult:
        plain = await super().infer(model, inputs, **kwargs)
        assert isinstance(plain, FakeResult)
        return VersionedResult(plain.arrays, self.version)


async def test_the_client_reads_the_answered_version() -> None:
    client = InferenceClient("h:1", "scorer", client=VersionedTriton("3"))
    answer = await client.infer([], ["SCORE"])
    assert isinstance(answer, Answer)
    assert answer.model_version == "3"
    assert set(answer.outputs) == {"SCORE"}
    plain = InferenceClient("h:1", "scorer", client=FakeTriton([{"SCORE": np.zeros(2)}]))
    assert (await plain.infer([], ["SCORE"])).model_version == ""  # a result without a response


class ScriptedInferencer:
    def __init__(self, version: str) -> None:
        self.version = version

    async def infer(self, inputs: Sequence[Any], outputs: Sequence[str]) -> Answer:
        return Answer({"SCORE": np.arange(3, dtype=np.float32).reshape(3, 1)}, self.version)


async def test_the_model_handler_keeps_the_version_through_the_reshape() -> None:
    binding = Binding(inputs={"f": "FEATURES", "c": "COUNT"}, outputs={"SCORE": "score"})
    handler = OipHandler(ScriptedInferencer("7"), SCORER, binding, {}, target_batch_size=3)
    batch = Batch(
        columns={"f": np.zeros((3, 16), np.float32), "c": np.zeros(3, np.int64)},
        nulls={},
        segments=(Segment(0, 0, 3),),
        oldest_at=0.0,
    )
    out = await handler.run(batch)
    assert out.outputs["SCORE"].shape == (3,)
    assert out.model_version == "7"


def test_split_keeps_the_version_and_the_builder_uses_it_unless_fixed() -> None:
    ledger = Ledger()
    a, b = (ledger.open(message(i, [1.0]), f"c{i}", 2, 0, 0.0).key for i in range(2))
    batch = Batch(
        columns={"x": np.arange(3.0)},
        nulls={},
        segments=(Segment(a, 0, 2), Segment(b, 0, 1)),
        oldest_at=0.0,
    )
    part = Answered(batch, {"Y": np.arange(3.0)}, "4")
    assert [p.model_version for p in split_by_message(part)] == ["4", "4"]

    def rows(fixed: str) -> ResultRows:
        builder = ResultBuilder(
            ledger,
            outputs={"Y": "y"},
            passthrough=(),
            model_name="m",
            model_version=fixed,
            wall=lambda: datetime(2025, 1, 1, tzinfo=UTC).timestamp(),
        )
        return builder.build([part])

    assert rows("").model_version == "4"
    assert rows("1").model_version == "1"


class VersionSink(FakeSink):
    """Records each row's version; holds writes until every batch is answered, so answered
    batches of both versions wait together (and would be merged into one write)."""

    def __init__(self, gate: asyncio.Event) -> None:
        super().__init__()
        self.gate = gate
        self.versions: dict[float, str] = {}
        self.write_versions: list[str] = []

    async def write(self, rows: ResultRows) -> int:
        await self.gate.wait()
        self.write_versions.append(rows.model_version)
        for y in rows.outputs["y"]:
            self.versions[float(y)] = rows.model_version
        return await super().write(rows)


def run_pipeline(source: FakeSource, sink: FakeSink, run: Any, fixed_version: str) -> Pipeline:
    return make_pipeline(
        source,
        sink,
        FnModel(run),
        target_batch_size=4,
        max_wait_s=0.0,
        max_in_flight=2,
        model_version=fixed_version,
        write_concurrency=1,
        max_write_rows=48,  # the writers' queue holds all 12 answered batches
    )


async def versioned_rows(fixed_version: str) -> tuple[VersionSink, dict[float, str]]:
    """12 messages of 4 rows (12 batches), the first 5 answered by version "1", the rest by
    "2"."""
    gate = asyncio.Event()
    answered: dict[float, str] = {}
    calls = 0

    async def run(batch: Batch) -> Answer:
        nonlocal calls
        calls += 1
        version = "1" if calls <= 5 else "2"  # the model reloaded in a new version
        y = np.asarray(batch.columns["x"]) * 2
        answered.update((float(v), version) for v in y)
        if calls == 12:
            gate.set()
        return Answer({"Y": y}, version)

    deliveries = [message(i, [float(4 * i + r) for r in range(4)]) for i in range(12)]
    source, sink = FakeSource(deliveries), VersionSink(gate)
    await asyncio.wait_for(run_pipeline(source, sink, run, fixed_version).run(asyncio.Event()), 10)
    assert len(source.acked) == 12
    return sink, answered


async def test_each_row_carries_the_version_its_answer_named() -> None:
    sink, answered = await versioned_rows("")
    assert sink.versions == answered
    assert set(sink.versions.values()) == {"1", "2"}
    assert len(sink.write_versions) < 12  # batches of one version were still merged


async def test_a_fixed_version_wins_over_the_answers() -> None:
    sink, _ = await versioned_rows("9")
    assert set(sink.versions.values()) == {"9"}
