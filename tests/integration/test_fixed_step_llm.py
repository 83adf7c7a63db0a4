"""The fixed-step LLM server (harness/fixed_step_llm.py) as a real process over real HTTP: the
OpenAI shapes, a completion taking its tokens' steps, exactly the excess of a burst answered
429, vLLM's gauges on /metrics, and full slots while twice the slots run back to back."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.fixed_step_llm import FixedStepLlmEndpoint, FixedStepLlmService
from harness.service import RunDir

SLOTS = 4
MAX_WAITING = 6
STEP_MS = 20.0
TOKENS = 25  # a completion: 25 steps of 20 ms = 0.5 s


@pytest.fixture(scope="module")
def llm(run_dir: RunDir) -> Iterator[FixedStepLlmEndpoint]:
    with FixedStepLlmService(
        run_dir, slots=SLOTS, step_ms=STEP_MS, max_waiting=MAX_WAITING, tokens=TOKENS
    ) as endpoint:
        yield endpoint


@pytest.fixture
async def client(llm: FixedStepLlmEndpoint) -> AsyncIterator[httpx.AsyncClient]:
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=llm.url, limits=limits, timeout=30.0) as c:
        yield c


def chat(model: str, text: str = "hello there") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def metrics(text: str) -> dict[str, float]:
    """Each sample as ``name`` -> value (one label set per name here)."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_a_chat_completion_has_the_openai_shape_and_takes_its_steps(
    llm: FixedStepLlmEndpoint, client: httpx.AsyncClient
) -> None:
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=chat(llm.model, "a" * 40))
    elapsed = time.monotonic() - started
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["model"] == llm.model
    assert answer["id"].startswith("chatcmpl-")
    [choice] = answer["choices"]
    assert choice["index"] == 0
    assert choice["message"] == {"role": "assistant", "content": "x" * TOKENS}
    assert choice["finish_reason"] == "length"
    assert answer["usage"] == {
        "prompt_tokens": 11,
        "completion_tokens": TOKENS,
        "total_tokens": 11 + TOKENS,
    }
    # admitted at the next tick (within one step), then one step per token
    step_s = STEP_MS / 1e3
    assert TOKENS * step_s * 0.98 <= elapsed <= (TOKENS + 1) * step_s + 0.15, elapsed


async def test_max_tokens_sets_the_steps(
    llm: FixedStepLlmEndpoint, client: httpx.AsyncClient
) -> None:
    started = time.monotonic()
    response = await client.post("/v1/chat/completions", json=chat(llm.model) | {"max_tokens": 5})
    elapsed = time.monotonic() - started
    assert response.json()["choices"][0]["message"]["content"] == "xxxxx"
    assert 5 * STEP_MS / 1e3 * 0.98 <= elapsed <= 6 * STEP_MS / 1e3 + 0.15, elapsed


async def test_completions_of_a_prompt_list_and_embeddings(
    llm: FixedStepLlmEndpoint, client: httpx.AsyncClient
) -> None:
    response = await client.post(
        "/v1/completions",
        json={"model": llm.model, "prompt": ["abcd", "efgh", "i"], "max_tokens": 3},
    )
    answer = response.json()
    assert answer["object"] == "text_completion"
    assert [(c["index"], c["text"], c["finish_reason"]) for c in answer["choices"]] == [
        (0, "xxx", "length"),
        (1, "xxx", "length"),
        (2, "xxx", "length"),
    ]
    assert answer["usage"] == {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}

    response = await client.post("/v1/embeddings", json={"model": llm.model, "input": ["a", "b"]})
    data = response.json()["data"]
    assert [(d["object"], d["index"], len(d["embedding"])) for d in data] == [
        ("embedding", 0, 8),
        ("embedding", 1, 8),
    ]

    models = (await client.get("/v1/models")).json()
    assert [m["id"] for m in models["data"]] == [llm.model]
    assert (await client.get("/health")).status_code == 200


async def test_a_burst_beyond_slots_and_queue_gets_exactly_the_excess_429(
    llm: FixedStepLlmEndpoint, client: httpx.AsyncClient
) -> None:
    before = metrics((await client.get("/metrics")).text)
    burst = SLOTS + MAX_WAITING + 5
    sent = [
        asyncio.create_task(client.post("/v1/chat/completions", json=chat(llm.model)))
        for _ in range(burst)
    ]
    # The 429s come back at once, long before the first completion (0.5 s).
    done, _ = await asyncio.wait(sent, timeout=TOKENS * STEP_MS / 1e3 / 2)
    rejected = [task.result() for task in done]
    assert len(rejected) == 5
    for response in rejected:
        assert response.status_code == 429
        assert response.headers["retry-after"] == "1"
        error = response.json()["error"]
        assert error["code"] == "rate_limit_exceeded"
        assert error["message"]

    await asyncio.sleep(3 * STEP_MS / 1e3)  # a tick or two: admitted into the slots
    during = (await client.get("/metrics")).text
    gauges = metrics(during)
    assert gauges["vllm:num_requests_running"] == SLOTS
    assert gauges["vllm:num_requests_waiting"] == MAX_WAITING
    assert 'vllm:num_requests_running{model_name="fixed-step"}' in during

    answers = await asyncio.gather(*sent)
    assert sorted(r.status_code for r in answers) == [200] * (SLOTS + MAX_WAITING) + [429] * 5
    after = metrics((await client.get("/metrics")).text)
    assert (
        after["rowbatch_fixed_step_rejected_total"] - before["rowbatch_fixed_step_rejected_total"]
        == 5
    )
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == (
        SLOTS + MAX_WAITING
    )
    assert (after["vllm:num_requests_running"], after["vllm:num_requests_waiting"]) == (0, 0)


async def test_twice_the_slots_back_to_back_keep_every_slot_busy(
    llm: FixedStepLlmEndpoint, client: httpx.AsyncClient
) -> None:
    assert (await client.post("/stats/reset")).status_code == 200
    answers = await asyncio.gather(
        *(client.post("/v1/chat/completions", json=chat(llm.model)) for _ in range(2 * SLOTS))
    )
    assert [r.status_code for r in answers] == [200] * (2 * SLOTS)
    stats = (await client.get("/stats")).json()
    assert stats["requests_served"] == stats["http_served"] == 2 * SLOTS
    assert stats["rejected"] == 0
    # two rounds of TOKENS steps; a burst that straddles a tick costs one more step
    assert 2 * TOKENS <= stats["window_ticks"] <= 2 * TOKENS + 2
    assert stats["occupied_slot_ticks"] == 2 * SLOTS * TOKENS
    assert stats["occupancy"] >= 0.95, stats
    queue = stats["waiting_queue"]
    assert queue["max"] == SLOTS  # the second round waited through the first
    assert queue["samples"] == stats["window_ticks"]
    assert queue["p50"] in (0, SLOTS)
    assert stats["dropped_ticks"] == 0


def test_stop_ends_the_server_process(run_dir: RunDir) -> None:
    service = FixedStepLlmService(
        run_dir, slots=1, step_ms=5, max_waiting=0, name="fixed_step_llm_stop"
    )
    endpoint = service.start()
    pid = service.pid
    assert pid is not None
    assert httpx.get(f"{endpoint.url}/v1/models").status_code == 200
    service.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{endpoint.url}/health")
