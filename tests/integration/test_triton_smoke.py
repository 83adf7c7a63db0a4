"""A real Triton (``harness.triton``) serving ``deploy/models/``: configs, values against
``harness.reference_models``, dynamic batching seen in Triton's own statistics, and the
``chaos`` model's run-time faults."""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc.aio as grpcclient
from tritonclient.utils import InferenceServerException

from harness.chaos import ChaosControl
from harness.reference_models import (
    EMBEDDING_DIM,
    EXPAND_DIM,
    FEATURE_DIM,
    embed_batch,
    expand,
    score,
)
from harness.triton import TritonEndpoint

TEXTS = [
    "",
    "a",
    "hello world",
    "naïve café ☕ — 日本語のテキスト 🤖",
    "Ünïcödé\u0000with nul and \t tabs\n",
    "the quick brown fox jumps over the lazy dog " * 20,
]


@pytest.fixture
async def client(triton: TritonEndpoint) -> AsyncIterator[Any]:
    async with grpcclient.InferenceServerClient(triton.grpc_url) as c:
        yield c


@pytest.fixture
def chaos_control(triton: TritonEndpoint) -> Iterator[Path]:
    """The chaos control file, reset to "no faults" before and after the test."""
    ChaosControl().write(triton.chaos_control)
    yield triton.chaos_control
    ChaosControl().write(triton.chaos_control)


async def infer_embedding(client: Any, model: str, texts: list[str]) -> npt.NDArray[np.float32]:
    data = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
    text = grpcclient.InferInput("TEXT", list(data.shape), "BYTES")
    text.set_data_from_numpy(data)
    result = await client.infer(model, [text])
    out: npt.NDArray[np.float32] = result.as_numpy("EMBEDDING")
    return out


def grpc_status(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


def as_int(value: Any) -> int:
    """gRPC JSON renders 64-bit numbers as strings and omits zeros."""
    return int(value or 0)


@pytest.mark.parametrize(
    ("model", "max_batch", "preferred", "delay_us", "queue"),
    [
        ("embedder", 256, [64, 128], 2000, 1024),
        ("chaos", 256, [64, 128], 2000, 256),
        ("scorer", 512, [256], 1000, 2048),
        ("expander", 256, [128], 1000, 1024),
    ],
)
async def test_model_config(
    client: Any, model: str, max_batch: int, preferred: list[int], delay_us: int, queue: int
) -> None:
    config = (await client.get_model_config(model, as_json=True))["config"]
    assert config["backend"] == "python"
    assert as_int(config["max_batch_size"]) == max_batch
    batching = config["dynamic_batching"]
    assert [as_int(n) for n in batching["preferred_batch_size"]] == preferred
    assert as_int(batching["max_queue_delay_microseconds"]) == delay_us
    assert as_int(batching["default_queue_policy"]["max_queue_size"]) == queue
    [group] = config["instance_group"]
    assert (as_int(group["count"]), group["kind"]) == (1, "KIND_CPU")
    io = {t["name"]: (t["data_type"], [as_int(d) for d in t["dims"]]) for t in config["input"]}
    io |= {t["name"]: (t["data_type"], [as_int(d) for d in t["dims"]]) for t in config["output"]}
    if model == "scorer":
        assert io == {
            "FEATURES": ("TYPE_FP32", [FEATURE_DIM]),
            "COUNT": ("TYPE_INT64", [1]),
            "SCORE": ("TYPE_FP32", [1]),
            "LABEL": ("TYPE_INT32", [1]),
        }
    elif model == "expander":
        assert io == {"X": ("TYPE_INT64", [1]), "Y": ("TYPE_FP32", [EXPAND_DIM])}
    else:
        assert io == {"TEXT": ("TYPE_STRING", [1]), "EMBEDDING": ("TYPE_FP32", [EMBEDDING_DIM])}


@pytest.mark.parametrize("model", ["embedder", "chaos"])
async def test_embedding_equals_reference(client: Any, model: str, chaos_control: Path) -> None:
    expected = embed_batch(TEXTS)
    got = await infer_embedding(client, model, TEXTS)
    assert got.dtype == np.float32
    assert got.shape == (len(TEXTS), EMBEDDING_DIM)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-6)
    for text, row in zip(TEXTS, expected, strict=True):  # one row per request, too
        np.testing.assert_array_equal((await infer_embedding(client, model, [text]))[0], row)


async def test_scorer_equals_reference(client: Any) -> None:
    rng = np.random.default_rng(7)
    features = rng.normal(0.0, 1.0, size=(50, FEATURE_DIM)).astype(np.float32)
    features[0] = 0.0
    count = rng.integers(-5, 10_000, size=(50, 1), dtype=np.int64)
    count[0] = 0
    inputs = [
        grpcclient.InferInput("FEATURES", list(features.shape), "FP32"),
        grpcclient.InferInput("COUNT", list(count.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(features)
    inputs[1].set_data_from_numpy(count)
    result = await client.infer("scorer", inputs)
    expected_score, expected_label = score(features, count)
    got_score, got_label = result.as_numpy("SCORE"), result.as_numpy("LABEL")
    assert (got_score.dtype, got_label.dtype) == (np.float32, np.int32)
    assert got_score.shape == got_label.shape == (50, 1)
    np.testing.assert_array_equal(got_score, expected_score)
    np.testing.assert_array_equal(got_label, expected_label)
    assert set(got_label.ravel().tolist()) == {0, 1}


async def test_expander_equals_reference(client: Any) -> None:
    x = np.array([[0], [1], [-3], [59_999], [2**40]], dtype=np.int64)
    data = grpcclient.InferInput("X", list(x.shape), "INT64")
    data.set_data_from_numpy(x)
    result = await client.infer("expander", [data])
    got = result.as_numpy("Y")
    assert got.dtype == np.float32
    assert got.shape == (len(x), EXPAND_DIM)
    np.testing.assert_array_equal(got, expand(x))


async def embedder_stats(client: Any) -> dict[str, Any]:
    stats = await client.get_inference_statistics("embedder", as_json=True)
    [model_stats] = stats["model_stats"]
    result: dict[str, Any] = model_stats
    return result


def batch_sizes(model_stats: dict[str, Any]) -> dict[int, int]:
    """Executions per batch size, from Triton's per-batch-size statistics."""
    return {
        as_int(b["batch_size"]): as_int(b["compute_infer"].get("count"))
        for b in model_stats.get("batch_stats", [])
    }


def metric(text: str, name: str, model: str) -> float:
    pattern = rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$'
    return sum(float(m) for m in re.findall(pattern, text, flags=re.MULTILINE))


async def test_concurrent_requests_are_batched(client: Any, triton: TritonEndpoint) -> None:
    texts = [f"concurrent request {i} ✓" for i in range(64)]
    before = await embedder_stats(client)

    results = await asyncio.gather(*(infer_embedding(client, "embedder", [t]) for t in texts))

    after = await embedder_stats(client)
    for text, got in zip(texts, results, strict=True):  # each answer went to its own request
        np.testing.assert_array_equal(got, embed_batch([text]))
    inferences = as_int(after["inference_count"]) - as_int(before["inference_count"])
    executions = as_int(after["execution_count"]) - as_int(before["execution_count"])
    assert inferences == len(texts)
    assert 1 <= executions < inferences, "Triton's dynamic batcher never merged requests"
    old, new = batch_sizes(before), batch_sizes(after)
    merged = {size: new[size] - old.get(size, 0) for size in new if size > 1}
    assert any(n > 0 for n in merged.values()), f"no batch of size > 1 in {new}"

    # Triton's Prometheus metrics tell the same story.
    body = await asyncio.to_thread(
        lambda: urllib.request.urlopen(triton.metrics_url, timeout=5).read().decode()
    )
    metric_inferences = metric(body, "nv_inference_count", "embedder")
    metric_executions = metric(body, "nv_inference_exec_count", "embedder")
    assert metric_inferences >= as_int(after["inference_count"])
    assert metric_executions < metric_inferences


async def test_chaos_reject_marker_is_invalid_argument(client: Any, chaos_control: Path) -> None:
    # A delay makes the queued requests meet in one batch: only the marked one must fail.
    ChaosControl(reject_marker="POISON", delay_s=0.05).write(chaos_control)
    texts = ["clean 1", "has POISON inside", "clean 2", "clean 3"]
    results = await asyncio.gather(
        *(infer_embedding(client, "chaos", [t]) for t in texts), return_exceptions=True
    )
    for text, result in zip(texts, results, strict=True):
        if "POISON" in text:
            assert isinstance(result, InferenceServerException), result
            assert grpc_status(result) == "INVALID_ARGUMENT"
            assert "POISON" in str(result.message())
        else:
            assert isinstance(result, np.ndarray), result
            np.testing.assert_array_equal(result, embed_batch([text]))

    ChaosControl().write(chaos_control)
    await infer_embedding(client, "chaos", ["has POISON inside"])  # accepted once reset


async def test_chaos_unavailable_until_then_recovers(client: Any, chaos_control: Path) -> None:
    control = ChaosControl.unavailable_for(1.5)
    control.write(chaos_control)
    with pytest.raises(InferenceServerException) as caught:
        await infer_embedding(client, "chaos", ["while down"])
    assert grpc_status(caught.value) == "UNAVAILABLE"

    assert control.unavailable_until is not None
    deadline = time.monotonic() + 20.0
    failures = 0
    while True:
        try:
            got = await infer_embedding(client, "chaos", ["after recovery"])
            break
        except InferenceServerException as exc:
            assert grpc_status(exc) == "UNAVAILABLE"
            failures += 1
            assert time.monotonic() < deadline, "chaos model did not recover"
            await asyncio.sleep(0.1)
    assert time.time() >= control.unavailable_until
    assert failures >= 1
    np.testing.assert_array_equal(got, embed_batch(["after recovery"]))


async def test_chaos_unavailable_fraction_is_deterministic(
    client: Any, chaos_control: Path
) -> None:
    ChaosControl(unavailable_fraction=0.25).write(chaos_control)
    outcomes = []
    for i in range(12):  # one at a time, so the failing positions are fixed
        try:
            await infer_embedding(client, "chaos", [f"row {i}"])
            outcomes.append("ok")
        except InferenceServerException as exc:
            outcomes.append(grpc_status(exc))
    assert outcomes == (["ok", "ok", "ok", "UNAVAILABLE"] * 3)


async def test_chaos_delay(client: Any, chaos_control: Path) -> None:
    ChaosControl(delay_s=0.3).write(chaos_control)
    started = time.monotonic()
    await infer_embedding(client, "chaos", ["slow"])
    assert time.monotonic() - started >= 0.3
    assert ChaosControl.read(chaos_control) == ChaosControl(delay_s=0.3)
