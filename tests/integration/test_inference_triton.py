"""rowbatch.consumer.model (discovery, binding, inference) and engine.poison against the real Triton
(``harness.triton``): discovery, answers equal to ``harness.reference_models``, poison
isolated by bisecting, and retries through an outage of the ``chaos`` model."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray

from harness.chaos import ChaosControl
from harness.proc import LOOPBACK, free_port
from harness.reference_models import EMBEDDING_DIM, FEATURE_DIM, embed_batch, score
from harness.triton import TritonEndpoint
from rowbatch.consumer.engine.poison import isolate
from rowbatch.consumer.model.binding import Binding, check_binding
from rowbatch.consumer.model.chunk_check import check_columns
from rowbatch.consumer.model.discovery import (
    ModelNotFound,
    ModelServerUnavailable,
    input_bytes_per_row,
    output_bytes_per_row,
)
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    PoisonInferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.consumer.model.server_kind import target_batch_size
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from rowbatch.consumer.model.tensors import build_inputs
from rowbatch.timing import Backoff
from rowbatch.wire.columns.column_type import INT64, STRING, ColumnType

EMBED_BINDING = Binding({"text": "TEXT"}, {"EMBEDDING": "embedding"}, ("id",))
SCORE_BINDING = Binding(
    {"features": "FEATURES", "count": "COUNT"}, {"SCORE": "score", "LABEL": "label"}, ("id",)
)


@pytest.fixture
def chaos_control(triton: TritonEndpoint) -> Iterator[Path]:
    """The chaos control file, reset to "no faults" before and after the test."""
    ChaosControl().write(triton.chaos_control)
    yield triton.chaos_control
    ChaosControl().write(triton.chaos_control)


def client_for(triton: TritonEndpoint, model: str) -> InferenceClient:
    return InferenceClient(triton.grpc_url, model)


@pytest.fixture
async def embedder(triton: TritonEndpoint) -> AsyncIterator[InferenceClient]:
    async with client_for(triton, "embedder") as client:
        yield client


@pytest.fixture
async def chaos(triton: TritonEndpoint) -> AsyncIterator[InferenceClient]:
    async with client_for(triton, "chaos") as client:
        yield client


def texts(n: int, prefix: str = "row") -> NDArray[np.object_]:
    out = np.empty(n, dtype=object)
    out[:] = [f"{prefix} {i}: naïve café ☕ {'x' * (i % 17)}" for i in range(n)]
    return out


async def embed(client: InferenceClient, spec: ModelSpec, values: NDArray[Any]) -> NDArray[Any]:
    inputs = build_inputs(spec, EMBED_BINDING, {"text": values})
    return (await client.infer(inputs, ["EMBEDDING"], client_timeout=30.0)).outputs["EMBEDDING"]


# --- discovery ---------------------------------------------------------------------------------


async def test_discover_embedder(embedder: InferenceClient) -> None:
    spec = await embedder.discover()
    assert spec == ModelSpec(
        name="embedder",
        version="1",
        inputs=(TensorSpec("TEXT", "BYTES", (1,)),),
        outputs=(TensorSpec("EMBEDDING", "FP32", (EMBEDDING_DIM,)),),
        max_batch_size=256,
        preferred_batch_sizes=(64, 128),
        instance_count=1,
    )
    assert target_batch_size(spec, None) == 128
    assert output_bytes_per_row(spec) == EMBEDDING_DIM * 4
    check_binding(spec, EMBED_BINDING)
    check_columns(spec, EMBED_BINDING, {"text": STRING, "id": INT64})


async def test_discover_scorer(triton: TritonEndpoint) -> None:
    async with client_for(triton, "scorer") as client:
        spec = await client.discover()
    assert spec.inputs == (
        TensorSpec("FEATURES", "FP32", (FEATURE_DIM,)),
        TensorSpec("COUNT", "INT64", (1,)),
    )
    assert spec.outputs == (TensorSpec("SCORE", "FP32", (1,)), TensorSpec("LABEL", "INT32", (1,)))
    assert (spec.max_batch_size, spec.preferred_batch_sizes, spec.version) == (512, (256,), "1")
    assert target_batch_size(spec, None) == 256
    assert input_bytes_per_row(spec) == FEATURE_DIM * 4 + 8
    check_binding(spec, SCORE_BINDING)
    types = {"features": ColumnType.vector(FEATURE_DIM), "count": INT64, "id": STRING}
    check_columns(spec, SCORE_BINDING, types)


async def test_unknown_model(triton: TritonEndpoint) -> None:
    async with client_for(triton, "no-such-model") as client:
        with pytest.raises(ModelNotFound) as caught:
            await client.discover()
        assert "'no-such-model'" in str(caught.value)
        assert triton.grpc_url in str(caught.value)
        with pytest.raises(FatalInferenceError) as fatal:
            await client.infer(build_inputs(*_embedder_spec(), {"text": texts(1)}), ["EMBEDDING"])
        assert fatal.value.status == "NOT_FOUND"


def _embedder_spec() -> tuple[ModelSpec, Binding]:
    spec = ModelSpec(
        "embedder",
        "",
        (TensorSpec("TEXT", "BYTES", (1,)),),
        (TensorSpec("EMBEDDING", "FP32", (EMBEDDING_DIM,)),),
        256,
    )
    return spec, EMBED_BINDING


async def test_server_down() -> None:
    url = f"{LOOPBACK}:{free_port()}"
    async with InferenceClient(url, "embedder") as client:
        with pytest.raises(ModelServerUnavailable) as caught:
            await client.discover(client_timeout=5.0)
        assert url in str(caught.value)
        with pytest.raises(RetryableInferenceError) as retryable:
            await client.infer(build_inputs(*_embedder_spec(), {"text": texts(1)}), ["EMBEDDING"])
        assert retryable.value.status == "UNAVAILABLE"


# --- answers -----------------------------------------------------------------------------------


async def test_embedder_matches_reference(embedder: InferenceClient) -> None:
    spec = await embedder.discover()
    values = texts(target_batch_size(spec))
    values[0], values[1] = "", "日本語のテキスト 🤖 with\ttabs\nand NUL \x00"
    got = await embed(embedder, spec, values)
    assert got.dtype == np.float32
    assert got.shape == (128, EMBEDDING_DIM)
    np.testing.assert_array_equal(got, embed_batch(list(values)))


async def test_scorer_matches_reference(triton: TritonEndpoint) -> None:
    rng = np.random.default_rng(11)
    async with client_for(triton, "scorer") as client:
        spec = await client.discover()
        n = target_batch_size(spec)
        features = rng.normal(0.0, 1.0, size=(n, FEATURE_DIM)).astype(np.float32)
        count = rng.integers(-5, 10_000, size=n, dtype=np.int64)
        columns: dict[str, NDArray[Any]] = {
            "features": features,
            "count": count,
            "id": np.arange(n),
        }
        inputs = build_inputs(spec, SCORE_BINDING, columns)
        out = await client.infer(inputs, list(SCORE_BINDING.outputs))
    expected_score, expected_label = score(features, count.reshape(-1, 1))
    assert out.outputs["SCORE"].shape == out.outputs["LABEL"].shape == (256, 1)
    np.testing.assert_array_equal(out.outputs["SCORE"], expected_score)
    np.testing.assert_array_equal(out.outputs["LABEL"], expected_label)


# --- poison ------------------------------------------------------------------------------------


async def test_reject_marker_is_poison(chaos: InferenceClient, chaos_control: Path) -> None:
    spec = await chaos.discover()
    ChaosControl(reject_marker="POISON").write(chaos_control)
    values = texts(8)
    values[3] = "this row is POISON"
    with pytest.raises(PoisonInferenceError) as caught:
        await embed(chaos, spec, values)
    assert caught.value.status == "INVALID_ARGUMENT"
    assert "POISON" in str(caught.value)
    clean = texts(8)
    np.testing.assert_array_equal(await embed(chaos, spec, clean), embed_batch(list(clean)))


async def test_isolate_finds_the_marked_groups(chaos: InferenceClient, chaos_control: Path) -> None:
    spec = await chaos.discover()
    ChaosControl(reject_marker="POISON").write(chaos_control)
    rng = np.random.default_rng(5)
    marked = {2, 9, 17}
    groups: list[list[str]] = []
    for g in range(20):
        rows = [f"group {g} row {r}" for r in range(int(rng.integers(1, 9)))]
        if g in marked:
            rows[int(rng.integers(0, len(rows)))] += " POISON"
        groups.append(rows)

    attempts = 0

    async def attempt(part: Sequence[list[str]]) -> NDArray[Any]:
        nonlocal attempts
        attempts += 1
        values = np.array([t for rows in part for t in rows], dtype=object)
        return await embed(chaos, spec, values)

    def is_poison(exc: BaseException) -> bool:
        return isinstance(exc, PoisonInferenceError)

    found = await isolate(groups, attempt, is_poison)

    assert sorted(groups.index(g) for g, _ in found.bad) == sorted(marked)
    assert all(isinstance(e, PoisonInferenceError) for _, e in found.bad)
    good_rows = 0
    for part, result in found.good:
        flat = [t for rows in part for t in rows]
        np.testing.assert_array_equal(result, embed_batch(flat))
        good_rows += len(flat)
    assert good_rows == sum(len(groups[i]) for i in range(20) if i not in marked)
    assert attempts <= 1 + 2 * len(marked) * 5  # ceil(log2 20) = 5


# --- retries -----------------------------------------------------------------------------------


async def test_retries_through_an_outage(chaos: InferenceClient, chaos_control: Path) -> None:
    spec = await chaos.discover()
    events: list[tuple[str, float]] = []
    inferencer = RetryingInferencer(
        chaos,
        InferenceRetry(Backoff(0.1, 0.5), client_timeout_s=10.0),
        on_backoff_start=lambda: events.append(("start", time.time())),
        on_backoff_end=lambda: events.append(("end", time.time())),
    )
    values = texts(16, "during outage")
    inputs = build_inputs(spec, EMBED_BINDING, {"text": values})
    control = ChaosControl.unavailable_for(2.0)
    control.write(chaos_control)
    assert control.unavailable_until is not None

    out = await inferencer.infer(inputs, ["EMBEDDING"])

    np.testing.assert_array_equal(out.outputs["EMBEDDING"], embed_batch(list(values)))
    assert [name for name, _ in events] == ["start", "end"]
    assert events[1][1] >= control.unavailable_until
    assert inferencer.backing_off == 0
