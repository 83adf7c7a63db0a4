"""llama-cpp-python's OpenAI-compatible server (harness/llama.py) on the tiny local model, through
plain HTTP: what its answers and errors look like, so a client can classify them per row. The
facts asserted here are the ones harness/llama.py's docstring gives.

The first use of the ``llama`` fixture on a machine waits for the llama venv's build
(llama.cpp compiles for ~8-9 minutes on 2 cores; scripts/test.sh starts it in the background),
hence the long timeout.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from harness.errors import ServiceFailed
from harness.llama import CHAT_MODEL, EMBED_N_CTX, LlamaEndpoint, LlamaService
from harness.service import RunDir

pytestmark = pytest.mark.timeout(1500)


@pytest.fixture
def client(llama: LlamaEndpoint) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=llama.url, timeout=60.0) as http:
        yield http


def chat(client: httpx.Client, model: str, content: str, max_tokens: int = 8) -> httpx.Response:
    return client.post(
        "/v1/chat/completions",
        json={
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "temperature": 0,
            "max_tokens": max_tokens,
        },
    )


def test_models_lists_both_aliases(client: httpx.Client, llama: LlamaEndpoint) -> None:
    response = client.get("/v1/models")
    assert response.status_code == 200
    ids = [model["id"] for model in response.json()["data"]]
    assert ids == [llama.chat_model, llama.embed_model]


def test_chat_completion_at_temperature_0_is_text_with_usage_and_repeatable(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    first = chat(client, llama.chat_model, "Hello, wörld! Ünïcode → ✓ 🙂")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == llama.chat_model
    (choice,) = body["choices"]
    assert choice["index"] == 0
    assert choice["message"]["role"] == "assistant"
    text = choice["message"]["content"]
    assert isinstance(text, str) and text  # printable ASCII: the model cannot emit EOS greedily
    assert choice["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["prompt_tokens"] > 0
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert "openai-processing-ms" in first.headers

    second = chat(client, llama.chat_model, "Hello, wörld! Ünïcode → ✓ 🙂")
    assert second.status_code == 200
    assert second.json()["choices"][0]["message"]["content"] == text
    assert second.json()["usage"] == usage
    other = chat(client, llama.chat_model, "something else entirely")
    assert other.json()["choices"][0]["message"]["content"] != text


def test_text_completion_takes_one_prompt_per_request(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    prompts = ["one", "two", "three"]
    many = client.post(
        "/v1/completions",
        json={"model": llama.chat_model, "prompt": prompts, "max_tokens": 4, "temperature": 0},
    )
    # the server asserts len(prompt) <= 1: a failed assert, answered as a bare 500
    assert many.status_code == 500
    assert many.json() == {
        "error": {"message": "", "type": "internal_server_error", "param": None, "code": None}
    }

    texts = []
    for prompt in prompts:
        response = client.post(
            "/v1/completions",
            json={
                "model": llama.chat_model,
                "prompt": [prompt],  # a list of one is accepted
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "text_completion"
        (choice,) = body["choices"]
        assert choice["index"] == 0
        assert choice["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 4
        texts.append(choice["text"])
    assert all(texts) and len(set(texts)) == 3


def test_embeddings_one_vector_per_input(client: httpx.Client, llama: LlamaEndpoint) -> None:
    inputs = ["alpha", "beta", "gamma ✓"]
    response = client.post("/v1/embeddings", json={"model": llama.embed_model, "input": inputs})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == llama.embed_model
    assert [item["index"] for item in body["data"]] == [0, 1, 2]
    vectors = [item["embedding"] for item in body["data"]]
    assert all(len(vector) == llama.embedding_dim for vector in vectors)
    assert all(isinstance(x, float) for vector in vectors for x in vector)
    assert len({tuple(vector) for vector in vectors}) == 3
    assert body["usage"]["prompt_tokens"] > 0

    again = client.post("/v1/embeddings", json={"model": llama.embed_model, "input": inputs})
    assert [item["embedding"] for item in again.json()["data"]] == vectors


def test_embedding_of_a_long_input_is_truncated_not_refused(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    response = client.post("/v1/embeddings", json={"model": llama.embed_model, "input": "x" * 5000})
    assert response.status_code == 200, response.text
    assert len(response.json()["data"][0]["embedding"]) == llama.embedding_dim
    assert response.json()["usage"]["prompt_tokens"] == EMBED_N_CTX  # its n_batch


def test_prompt_longer_than_the_context_is_a_400(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    long_text = "a" * (llama.n_ctx * 4)
    response = chat(client, llama.chat_model, long_text)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "context_length_exceeded"
    assert error["param"] == "messages"
    assert error["message"].startswith(
        f"This model's maximum context length is {llama.n_ctx} tokens. However, you requested"
    )

    response = client.post(
        "/v1/completions",
        json={"model": llama.chat_model, "prompt": long_text, "max_tokens": 8},
    )
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "message": f"This model's maximum context length is {llama.n_ctx} tokens, however "
            f"you requested {llama.n_ctx * 4 + 2 + 8} tokens ({llama.n_ctx * 4 + 2} in your "
            "prompt; 8 for the completion). Please reduce your prompt; or completion length.",
            "type": "invalid_request_error",
            "param": "messages",  # sic, for text completions too
            "code": "context_length_exceeded",
        }
    }


def complete(client: httpx.Client, prompt: str, max_tokens: int) -> httpx.Response:
    return client.post(
        "/v1/completions",
        json={"model": CHAT_MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
    )


def test_the_prompt_alone_must_leave_one_token_of_context(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    # a prompt of N characters is N + 2 tokens: BOS, the SentencePiece space "▁", one per byte
    at_limit = complete(client, "a" * (llama.n_ctx - 2), 8)  # n_ctx tokens
    assert at_limit.status_code == 400
    assert at_limit.json()["error"]["code"] == "context_length_exceeded"

    one_left = complete(client, "a" * (llama.n_ctx - 3), 8)  # n_ctx - 1 tokens
    assert one_left.status_code == 200, one_left.text
    usage = one_left.json()["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (llama.n_ctx - 1, 1)
    assert one_left.json()["choices"][0]["finish_reason"] == "length"

    # max_tokens beyond what is left is cut to it, not refused
    some_left = complete(client, "b" * (llama.n_ctx - 10), 50)
    assert some_left.status_code == 200, some_left.text
    usage = some_left.json()["usage"]
    assert usage["prompt_tokens"] == llama.n_ctx - 8
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == llama.n_ctx
    assert some_left.json()["choices"][0]["finish_reason"] == "length"


def test_unknown_model_is_served_by_the_first_model(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    known = chat(client, llama.chat_model, "who serves me?")
    unknown = chat(client, "no-such-model", "who serves me?")
    assert unknown.status_code == 200, unknown.text
    assert unknown.json()["model"] == "no-such-model"  # echoed back, not an error
    assert (
        unknown.json()["choices"][0]["message"]["content"]
        == known.json()["choices"][0]["message"]["content"]
    )
    # without a model: the first one too, and "model" is its GGUF's path
    anonymous = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    )
    assert anonymous.status_code == 200
    assert anonymous.json()["model"] == str(llama.model_path)

    # embeddings for an unknown model: the first model (not an embedding one) answers 500
    response = client.post("/v1/embeddings", json={"model": "no-such-model", "input": ["a"]})
    assert response.status_code == 500
    assert response.json() == {
        "error": {
            "message": "Llama model must be created with embedding=True to call this method",
            "type": "internal_server_error",
            "param": None,
            "code": None,
        }
    }


def test_invalid_requests_are_500s(client: httpx.Client, llama: LlamaEndpoint) -> None:
    # request validation errors are caught by the server's error route: 500, not FastAPI's 422
    response = client.post(
        "/v1/chat/completions",
        json={"model": llama.chat_model, "messages": "not a list", "max_tokens": 2},
    )
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "internal_server_error"
    assert error["code"] is None
    assert error["message"].startswith("1 validation error:")
    assert "Input should be a valid list" in error["message"]

    # an empty input list for embeddings
    response = client.post("/v1/embeddings", json={"model": llama.embed_model, "input": []})
    assert response.status_code == 500
    assert response.json()["error"]["message"] == "llama_decode returned -1"

    # "n" is ignored: one choice
    response = client.post(
        "/v1/completions",
        json={"model": llama.chat_model, "prompt": "x", "n": 3, "max_tokens": 2},
    )
    assert response.status_code == 200
    assert len(response.json()["choices"]) == 1


def test_a_body_that_is_not_json_is_a_plain_text_500(llama: LlamaEndpoint) -> None:
    # the error route's own handler fails on it: uvicorn's bare 500, and it closes the
    # connection (a client reusing it may see a reset), hence a client of its own
    with httpx.Client(base_url=llama.url, timeout=60.0) as http:
        response = http.post(
            "/v1/chat/completions",
            content=b"{not json",
            headers={"content-type": "application/json"},
        )
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "Internal Server Error"


def test_concurrent_requests_are_served_one_at_a_time(
    client: httpx.Client, llama: LlamaEndpoint
) -> None:
    def timed(_: int) -> tuple[float, float, dict[str, Any]]:
        started = time.monotonic()
        response = chat(client, llama.chat_model, "count to many", max_tokens=200)
        assert response.status_code == 200, response.text
        return started, time.monotonic(), response.json()

    single_s = min(end - start for start, end, _ in map(timed, range(3)))
    n = 4
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(timed, range(n)))
    wall_s = max(end for _, end, _ in results) - min(start for start, _, _ in results)
    texts = {body["choices"][0]["message"]["content"] for _, _, body in results}
    assert len(texts) == 1  # same prompt, temperature 0
    print(f"one chat call (200 tokens): {single_s * 1000:.0f} ms; {n} at once: {wall_s:.2f} s")
    # served one after another: n calls at once take about n times one (a server running them
    # in parallel would take about one call's time)
    assert wall_s > 0.6 * n * single_s


def test_a_config_the_server_refuses_fails_the_start_with_its_error(run_dir: RunDir) -> None:
    service = LlamaService(run_dir, name="llama-refused", model_overrides={"tiny": {"n_ctx": -1}})
    with pytest.raises(ServiceFailed, match="exited with code 1 before it was ready") as failed:
        service.start()
    service.stop()
    notes = "\n".join(getattr(failed.value, "__notes__", []))
    assert "1 validation error for ConfigFileSettings\nmodels.0.n_ctx" in notes
