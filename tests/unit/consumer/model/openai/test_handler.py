"""The OpenAI-compatible handler over an ``EndpointPool``, end to end against a fake server
behind each endpoint's HTTP session: rows become requests through the window, answers become
the bound outputs in row order; a row the server refuses alone, whose template column is null
or whose structured answer does not parse fails alone (``RowsFailed``); a refused request of
several rows is sent again one row per request; transient answers are retried
(``Retry-After``, the window halved, intake paused once), fatal ones fail the batch. Time is a
fake clock."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pytest
from numpy.typing import NDArray

from rowbatch.consumer.model.answer import Answer, RowError, RowsFailed
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    InferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.consumer.model.openai.client import (
    EndpointPool,
    HttpAnswer,
    HttpSession,
    HttpUnreachable,
)
from rowbatch.consumer.model.openai.handler import OpenAIHandler
from rowbatch.consumer.model.openai.outputs import embedding_outputs, text_outputs
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.openai.token_rate import TokenRate
from rowbatch.consumer.model.spec import TensorSpec
from rowbatch.timing import Backoff, Clocks

Json = dict[str, Any]
Serve = Callable[["Request", Json], Awaitable[HttpAnswer]]

TOO_LONG = (
    "This model's maximum context length is 4096 tokens. However, you requested 9000 tokens "
    "(8744 in the messages, 256 in the completion). Please reduce the length of the messages."
)


class ZeroRandom(random.Random):
    """No jitter: backoff waits are exactly the policy's."""

    def random(self) -> float:
        return 0.0


class FakeClock:
    """Monotonic time that moves only when something sleeps on it (or the test moves it)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)

    def clocks(self) -> Clocks:
        return Clocks(monotonic=self.monotonic, sleep=self.sleep, rng=ZeroRandom())


@dataclass
class Rows:
    """A batch's rows as the handler reads them (the engine's ``Batch``)."""

    columns: dict[str, NDArray[Any]]
    nulls: dict[str, NDArray[np.bool_]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))


def texts(*values: str) -> Rows:
    return Rows({"body": np.array(list(values), dtype=object)})


@dataclass(frozen=True)
class Request:
    """One request as the fake server sees it: the endpoint it was sent to and its path."""

    base: str
    path: str


class Server:
    """The fake server behind every endpoint: records each request (its endpoint, path and JSON
    body) and answers through ``serve``."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.requests: list[tuple[str, str, Json]] = []
        self.closed: list[str] = []

    def session(self, base: str) -> HttpSession:
        return FakeSession(self, base)

    @property
    def bodies(self) -> list[Json]:
        return [body for _, _, body in self.requests]


class FakeSession:
    """An endpoint's HTTP session (the pool's ``transport``) in front of :class:`Server`."""

    def __init__(self, server: Server, base: str) -> None:
        self._server = server
        self._base = base

    async def post(self, path: str, body: bytes) -> HttpAnswer:
        parsed = orjson.loads(body)
        self._server.requests.append((self._base, path, parsed))
        return await self._server.serve(Request(self._base, path), parsed)

    async def get(self, path: str, timeout_s: float | None = None) -> HttpAnswer:
        return HttpAnswer(404, b"not found")

    async def close(self) -> None:
        self._server.closed.append(self._base)


class Gate:
    """The backoff callbacks the service wires to the intake gate, and the errors seen."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.errors: list[InferenceError] = []

    def started(self) -> None:
        self.events.append("start")

    def ended(self) -> None:
        self.events.append("end")


@dataclass
class Harness:
    handler: OpenAIHandler
    pool: EndpointPool
    server: Server
    clock: FakeClock
    gate: Gate
    retrying: RetryingInferencer
    tokens: list[tuple[int, int]]


def settings(**fields: Any) -> OpenAISettings:
    base: Json = {"kind": "openai", "name": "llm", "prompt": "Say: {body}"}
    return OpenAISettings(**(base | fields))


@asynccontextmanager
async def harness(
    config: OpenAISettings,
    serve: Serve,
    *,
    outputs: Sequence[TensorSpec] | None = None,
    rate_per_minute: int | None = None,
) -> AsyncIterator[Harness]:
    clock = FakeClock()
    server = Server(serve)
    gate = Gate()
    pool = EndpointPool(
        config,
        clocks=clock.clocks(),
        transport=server.session,
    )
    retrying = RetryingInferencer(
        None,
        InferenceRetry(Backoff(0.1, 10.0), client_timeout_s=config.timeout_s),
        on_backoff_start=gate.started,
        on_backoff_end=gate.ended,
        on_error=gate.errors.append,
        clocks=clock.clocks(),
    )

    async def post(path: str, body: Json) -> Json:
        return await retrying.call(lambda: pool.post(path, body))

    tokens: list[tuple[int, int]] = []
    handler = OpenAIHandler(
        post,
        config,
        outputs if outputs is not None else text_outputs(config.json_schema),
        {},
        target_batch_size=8,
        clock=clock.monotonic,
        on_tokens=lambda p, c: tokens.append((p, c)),
        token_rate=(
            TokenRate(rate_per_minute, clock.monotonic, clock.sleep)
            if rate_per_minute is not None
            else None
        ),
    )
    try:
        yield Harness(handler, pool, server, clock, gate, retrying, tokens)
    finally:
        await pool.close()


def ok(payload: Json) -> HttpAnswer:
    return HttpAnswer(200, orjson.dumps(payload))


def error(status: int, message: str, retry_after: str | None = None) -> HttpAnswer:
    body = {"error": {"message": message, "type": "BadRequestError", "code": status}}
    return HttpAnswer(status, orjson.dumps(body), retry_after)


def chat_answer(content: str, *, prompt_tokens: int = 3, completion_tokens: int = 5) -> Json:
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "llm-served",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "length" if "!" in content else "stop",
            }
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def user_text(body: Json) -> str:
    return str(body["messages"][-1]["content"])


async def echo(request: Request, body: Json) -> HttpAnswer:
    """Chat: answers each prompt upper-cased, its length as prompt tokens."""
    text = user_text(body)
    return ok(chat_answer(text.upper(), prompt_tokens=len(text), completion_tokens=len(text) // 2))


def outputs_of(answer: Answer) -> dict[str, list[Any]]:
    return {name: values.tolist() for name, values in answer.outputs.items()}


# --- chat -----------------------------------------------------------------------------------


async def test_chat_rows_are_answered_into_their_outputs_in_row_order() -> None:
    words = ["alpha", "beta", "gamma!", "delta"]
    arrived: dict[str, int] = {}
    answered = [asyncio.Event() for _ in words]
    everyone = asyncio.Event()

    async def backwards(request: Request, body: Json) -> HttpAnswer:
        # Every request waits for all of them, then they answer last row first.
        row = words.index(user_text(body).removeprefix("Say: "))
        arrived[user_text(body)] = row
        if len(arrived) == len(words):
            everyone.set()
        await everyone.wait()
        if row + 1 < len(words):
            await answered[row + 1].wait()
        answered[row].set()
        return await echo(request, body)

    async with harness(settings(), backwards) as h:
        answer = await h.handler.run(texts(*words))
    got = outputs_of(answer)
    assert got["text"] == ["SAY: ALPHA", "SAY: BETA", "SAY: GAMMA!", "SAY: DELTA"]
    assert got["finish_reason"] == ["stop", "stop", "length", "stop"]
    assert got["prompt_tokens"] == [10, 9, 11, 10]
    assert got["completion_tokens"] == [5, 4, 5, 5]
    assert got["model"] == ["llm-served"] * 4
    assert got["latency_ms"] == [0.0] * 4  # the fake clock did not move
    assert answer.outputs["prompt_tokens"].dtype == np.int64
    assert answer.outputs["latency_ms"].dtype == np.float64
    assert set(answer.outputs) == {
        "text",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "model",
        "latency_ms",
    }
    assert len(h.server.requests) == 4
    assert sorted(h.tokens) == sorted([(10, 5), (9, 4), (11, 5), (10, 5)])
    assert h.gate.events == []


async def test_a_chat_request_is_what_the_settings_say() -> None:
    config = settings(
        prompt="Summarise {body} in {lang}",
        system_prompt="You write {lang}, {{briefly}}",
        max_tokens=64,
        temperature=0.5,
        sampling={"top_p": 0.9, "seed": 3},
    )
    rows = Rows({"body": np.array(["the text"], object), "lang": np.array(["French"], object)})
    async with harness(config, echo) as h:
        assert h.handler.columns == ("body", "lang")
        await h.handler.run(rows)
    [(base, path, body)] = h.server.requests
    assert (base, path) == ("http://127.0.0.1:8000", "/v1/chat/completions")
    assert body == {
        "model": "llm",
        "top_p": 0.9,
        "seed": 3,
        "max_tokens": 64,
        "temperature": 0.5,
        "messages": [
            {"role": "system", "content": "You write French, {briefly}"},
            {"role": "user", "content": "Summarise the text in French"},
        ],
    }


async def test_temperature_none_is_left_to_the_server() -> None:
    async with harness(settings(temperature=None), echo) as h:
        await h.handler.run(texts("a"))
    assert "temperature" not in h.server.bodies[0]


async def test_latency_is_the_requests_time_on_the_clock() -> None:
    clock_box: list[FakeClock] = []

    async def slow(request: Request, body: Json) -> HttpAnswer:
        clock_box[0].now += 0.25
        return await echo(request, body)

    async with harness(settings(), slow) as h:
        clock_box.append(h.clock)
        answer = await h.handler.run(texts("a"))
    assert answer.outputs["latency_ms"].tolist() == [250.0]


async def test_only_the_bound_outputs_are_answered() -> None:
    outputs = [TensorSpec("text", "BYTES", ())]
    async with harness(settings(), echo, outputs=outputs) as h:
        answer = await h.handler.run(texts("a", "b"))
    assert outputs_of(answer) == {"text": ["SAY: A", "SAY: B"]}


async def test_the_window_bounds_requests_in_flight() -> None:
    state = {"now": 0, "most": 0}

    async def counting(request: Request, body: Json) -> HttpAnswer:
        state["now"] += 1
        state["most"] = max(state["most"], state["now"])
        for _ in range(5):
            await asyncio.sleep(0)
        state["now"] -= 1
        return await echo(request, body)

    async with harness(settings(max_in_flight=2), counting) as h:
        answer = await h.handler.run(texts(*[f"r{i}" for i in range(7)]))
        assert [e.window.in_use for e in h.pool.endpoints] == [0]
    assert state["most"] == 2
    assert len(h.server.requests) == 7
    assert answer.outputs["text"].tolist() == [f"SAY: R{i}" for i in range(7)]


async def test_requests_are_spread_over_the_endpoints() -> None:
    async def yielding(request: Request, body: Json) -> HttpAnswer:
        for _ in range(3):  # a request in flight while the next one picks its endpoint
            await asyncio.sleep(0)
        return await echo(request, body)

    config = settings(url=("http://a:1", "http://b:2/v1"), max_in_flight=1)
    async with harness(config, yielding) as h:
        answer = await h.handler.run(texts(*[f"r{i}" for i in range(6)]))
    assert {base for base, _, _ in h.server.requests} == {"http://a:1", "http://b:2"}
    assert answer.outputs["text"].tolist() == [f"SAY: R{i}" for i in range(6)]


# --- rows failing on their own --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "words", "code"),
    [
        (400, TOO_LONG, "prompt_too_long"),
        (400, "the input exceeds the context window", "prompt_too_long"),
        (400, "'messages' must not be empty", "invalid_request"),
        (413, "request entity too large", "invalid_request"),
        (422, "unprocessable: bad field", "invalid_request"),
    ],
)
async def test_a_row_the_server_refuses_fails_alone(status: int, words: str, code: str) -> None:
    async def refuse_third(request: Request, body: Json) -> HttpAnswer:
        if "third" in user_text(body):
            return error(status, words)
        return await echo(request, body)

    async with harness(settings(), refuse_third) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("first", "second", "third", "fourth"))
    failed = caught.value.failed
    assert list(failed) == [2]
    assert failed[2].code == code
    assert words in failed[2].message
    assert f"HTTP {status}" in failed[2].message
    got = outputs_of(caught.value.answer)
    assert got["text"] == ["SAY: FIRST", "SAY: SECOND", "", "SAY: FOURTH"]
    assert got["finish_reason"] == ["stop", "stop", "", "stop"]
    assert got["model"] == ["llm-served", "llm-served", "", "llm-served"]
    assert len(h.server.requests) == 4  # nothing sent again
    assert h.gate.events == []  # poison is not retried


async def test_several_refused_rows_each_fail_with_its_own_words() -> None:
    async def refuse(request: Request, body: Json) -> HttpAnswer:
        text = user_text(body)
        if "long" in text:
            return error(400, TOO_LONG)
        if "odd" in text:
            return error(400, "unsupported character")
        return await echo(request, body)

    async with harness(settings(), refuse) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("long", "fine", "odd", "fine too"))
    assert {row: e.code for row, e in caught.value.failed.items()} == {
        0: "prompt_too_long",
        2: "invalid_request",
    }
    assert "unsupported character" in caught.value.failed[2].message
    assert caught.value.answer.outputs["text"].tolist() == ["", "SAY: FINE", "", "SAY: FINE TOO"]
    assert "2 row(s) failed on their own" in str(caught.value)


def completion(prompts: Sequence[str], *, reverse: bool = True) -> Json:
    choices = [
        {"index": i, "text": f"<{p}>", "finish_reason": "stop", "logprobs": None}
        for i, p in enumerate(prompts)
    ]
    return {
        "object": "text_completion",
        "model": "llm-served",
        "choices": choices[::-1] if reverse else choices,
        "usage": {"prompt_tokens": 4 * len(prompts), "completion_tokens": 7 * len(prompts)},
    }


async def test_completions_refused_as_a_whole_are_sent_again_one_row_each() -> None:
    async def refuse_p5(request: Request, body: Json) -> HttpAnswer:
        prompts = body["prompt"]
        if "p5" in prompts:
            return error(400, TOO_LONG if len(prompts) == 1 else "one of the prompts is bad")
        return ok(completion(prompts))

    config = settings(api="completions", prompt="{body}", rows_per_request=4)
    outputs = [t for t in text_outputs(None) if t.name in ("text", "finish_reason", "model")]
    async with harness(config, refuse_p5, outputs=outputs) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts(*[f"p{i}" for i in range(8)]))
    assert {row: e.code for row, e in caught.value.failed.items()} == {5: "prompt_too_long"}
    want = [f"<p{i}>" if i != 5 else "" for i in range(8)]
    assert caught.value.answer.outputs["text"].tolist() == want
    sent = sorted(body["prompt"] for body in h.server.bodies)
    # Two requests of four rows; the refused one again as four requests of one row.
    assert sent == sorted(
        [["p0", "p1", "p2", "p3"], ["p4", "p5", "p6", "p7"], ["p4"], ["p5"], ["p6"], ["p7"]]
    )
    assert all(path == "/v1/completions" for _, path, _ in h.server.requests)
    assert h.server.bodies[0]["max_tokens"] == 256
    assert h.server.bodies[0]["temperature"] == 0.0


async def test_completions_answered_in_any_order_land_on_their_rows() -> None:
    async def shuffled(request: Request, body: Json) -> HttpAnswer:
        return ok(completion(body["prompt"], reverse=True))

    config = settings(api="completions", prompt="{body}", rows_per_request=3)
    async with harness(config, shuffled) as h:
        answer = await h.handler.run(texts(*[f"q{i}" for i in range(7)]))
    assert answer.outputs["text"].tolist() == [f"<q{i}>" for i in range(7)]
    assert [len(body["prompt"]) for body in h.server.bodies] == [3, 3, 1]


async def test_an_answer_with_fewer_choices_than_rows_fails_its_rows_for_good() -> None:
    async def short(request: Request, body: Json) -> HttpAnswer:
        return ok(completion(body["prompt"][:-1]))

    config = settings(api="completions", prompt="{body}", rows_per_request=4)
    async with harness(config, short) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("a", "b", "c", "d"))
    failed = fatal_rows(caught.value)
    assert sorted(failed) == [0, 1, 2, 3]  # the request's rows, nacked (not dead-lettered)
    assert all("3 result(s) for 4 row(s)" in m for m in failed.values())


async def test_a_null_template_column_fails_its_row_without_a_request() -> None:
    rows = Rows(
        {"body": np.array(["one", "", "three"], object)},
        {"body": np.array([False, True, False])},
    )
    async with harness(settings(), echo) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(rows)
    assert caught.value.failed == {
        1: RowError("null_not_allowed", "column 'body' is null, and the prompt names it")
    }
    assert sorted(user_text(b) for b in h.server.bodies) == ["Say: one", "Say: three"]
    assert caught.value.answer.outputs["text"].tolist() == ["SAY: ONE", "", "SAY: THREE"]


async def test_a_null_in_the_system_prompts_column_fails_the_row_too() -> None:
    config = settings(system_prompt="Speak {lang}")
    rows = Rows(
        {"body": np.array(["a", "b"], object), "lang": np.array(["", "en"], object)},
        {"lang": np.array([True, False])},
    )
    async with harness(config, echo) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(rows)
    assert {r: e.code for r, e in caught.value.failed.items()} == {0: "null_not_allowed"}
    assert "'lang'" in caught.value.failed[0].message
    assert [user_text(b) for b in h.server.bodies] == ["Say: b"]


async def test_every_row_null_sends_nothing() -> None:
    rows = Rows({"body": np.array(["", ""], object)}, {"body": np.array([True, True])})
    async with harness(settings(), echo) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(rows)
    assert sorted(caught.value.failed) == [0, 1]
    assert h.server.requests == []


# --- structured output ----------------------------------------------------------------------

SCHEMA: Json = {
    "type": "object",
    "properties": {
        "label": {"type": "string"},
        "score": {"type": "number"},
        "n": {"type": "integer"},
        "ok": {"type": "boolean"},
        "extra": {"type": "array"},
    },
}

ANSWERS = {
    "r0": '{"label": "pos", "score": 0.75, "n": 3, "ok": true, "extra": "x"}',
    "r1": "Sure! Here is the JSON: {",
    "r2": '{"label": "neg", "score": 1, "n": -2, "ok": false, "extra": "y"}',
    "r3": '{"label": 5, "score": 0.1, "n": 1, "ok": true, "extra": "z"}',
    "r4": "[1, 2]",
    "r5": '{"label": "x", "score": 0.1, "n": 1.5, "ok": true, "extra": "z"}',
}


async def test_json_schema_answers_become_typed_fields_and_the_unparseable_fail() -> None:
    async def structured(request: Request, body: Json) -> HttpAnswer:
        return ok(chat_answer(ANSWERS[user_text(body)]))

    config = settings(prompt="{body}", json_schema=SCHEMA)
    async with harness(config, structured) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts(*ANSWERS))
    failed = caught.value.failed
    assert {r: e.code for r, e in failed.items()} == {
        1: "unparseable_output",
        3: "unparseable_output",
        4: "unparseable_output",
        5: "unparseable_output",
    }
    assert "not JSON" in failed[1].message
    assert "'label'" in failed[3].message
    assert "not a JSON object" in failed[4].message
    assert "'n'" in failed[5].message
    out = caught.value.answer.outputs
    assert out["json.label"].tolist() == ["pos", "", "neg", "", "", ""]
    assert out["json.score"].tolist() == [0.75, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert out["json.n"].tolist() == [3, 0, -2, 0, 0, 0]
    assert out["json.ok"].tolist() == [True, False, False, False, False, False]
    assert out["json.extra"].tolist() == ["x", "", "y", "", "", ""]  # untyped: a string
    assert out["json.score"].dtype == np.dtype(np.float64)
    assert out["json.n"].dtype == np.dtype(np.int64)
    assert out["json.ok"].dtype == np.dtype(np.bool_)
    assert out["text"].tolist()[0] == ANSWERS["r0"]
    assert h.server.bodies[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "row", "schema": SCHEMA},
    }
    assert len(h.server.requests) == len(ANSWERS)  # an unparseable answer is not asked again


async def test_json_schema_all_parsed_is_a_plain_answer() -> None:
    async def structured(request: Request, body: Json) -> HttpAnswer:
        return ok(chat_answer(ANSWERS[user_text(body)]))

    config = settings(prompt="{body}", json_schema=SCHEMA)
    async with harness(config, structured) as h:
        answer = await h.handler.run(texts("r2", "r0"))
    assert answer.outputs["json.label"].tolist() == ["neg", "pos"]


# --- embeddings -----------------------------------------------------------------------------


def embeddings(inputs: Sequence[str], dim: int) -> Json:
    return {
        "object": "list",
        "model": "embedder",
        "data": [
            {"object": "embedding", "index": i, "embedding": [float(len(t))] * dim}
            for i, t in reversed(list(enumerate(inputs)))
        ],
        "usage": {"prompt_tokens": len(inputs), "total_tokens": len(inputs)},
    }


async def test_embeddings_are_rows_by_dim() -> None:
    async def embed(request: Request, body: Json) -> HttpAnswer:
        return ok(embeddings(body["input"], 3))

    config = settings(api="embeddings", prompt="{body}", rows_per_request=2)
    async with harness(config, embed, outputs=embedding_outputs(3)) as h:
        answer = await h.handler.run(texts("a", "bb", "ccc", "dddd", "eeeee"))
    vectors = answer.outputs["embedding"]
    assert vectors.shape == (5, 3)
    assert vectors.dtype == np.float32
    assert vectors.tolist() == [[float(n)] * 3 for n in range(1, 6)]
    assert answer.outputs["model"].tolist() == ["embedder"] * 5
    assert [body["input"] for body in h.server.bodies] == [["a", "bb"], ["ccc", "dddd"], ["eeeee"]]
    assert all(path == "/v1/embeddings" for _, path, _ in h.server.requests)
    for body in h.server.bodies:
        assert "max_tokens" not in body
        assert "temperature" not in body
        assert "response_format" not in body


@pytest.mark.parametrize("vector", [[1.0, 2.0], [1.0, 2.0, 3.0, 4.0], "AAAAAA==", None])
async def test_an_embedding_of_the_wrong_length_is_fatal(vector: Any) -> None:
    async def wrong(request: Request, body: Json) -> HttpAnswer:
        answer = embeddings(body["input"], 3)
        answer["data"][0]["embedding"] = vector
        return ok(answer)

    config = settings(api="embeddings", prompt="{body}")
    async with harness(config, wrong, outputs=embedding_outputs(3)) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("a", "b"))
    failed = fatal_rows(caught.value)
    assert sorted(failed) == [0, 1]  # one request of both rows
    assert all("where start-up found 3" in m for m in failed.values())
    assert not h.handler.is_poison(caught.value)


def fatal_rows(failed: RowsFailed) -> dict[int, str]:
    """The rows whose request failed for good (nacked, not dead-lettered), with the error."""
    return {row: error.message for row, error in failed.failed.items() if error.fatal}


# --- transient and fatal answers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "retry_after", "slept"),
    [(429, "3", 3.0), (503, None, 0.1), (429, "120", 10.0), (429, "soon", 0.1)],
)
async def test_an_overload_is_retried_after_retry_after_and_halves_the_window(
    status: int, retry_after: str | None, slept: float
) -> None:
    calls: list[int] = []

    async def overloaded_once(request: Request, body: Json) -> HttpAnswer:
        calls.append(1)
        if len(calls) == 1:
            return error(status, "too many requests", retry_after)
        return await echo(request, body)

    async with harness(settings(max_in_flight=8), overloaded_once) as h:
        answer = await h.handler.run(texts("a"))
        window = h.pool.endpoints[0].window
        assert window.limit == 4
        assert window.in_use == 0
        assert h.retrying.backing_off == 0
    assert answer.outputs["text"].tolist() == ["SAY: A"]
    assert len(h.server.requests) == 2
    assert h.clock.sleeps == [pytest.approx(slept)]
    assert h.gate.events == ["start", "end"]
    [seen] = h.gate.errors
    assert isinstance(seen, RetryableInferenceError)
    assert seen.status == str(status)


async def test_retrying_call_directly_with_fake_clocks() -> None:
    clock = FakeClock()
    gate = Gate()
    retrying = RetryingInferencer(
        None,
        InferenceRetry(Backoff(0.1, 10.0)),
        on_backoff_start=gate.started,
        on_backoff_end=gate.ended,
        on_error=gate.errors.append,
        clocks=clock.clocks(),
    )
    failures = [
        RetryableInferenceError("busy", model="m", status="429", retry_after_s=2.0),
        RetryableInferenceError("busy", model="m", status="503"),
        RetryableInferenceError("busy", model="m", status="429", retry_after_s=0.0),
    ]

    async def attempt() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert await retrying.call(attempt) == "done"
    # max(backoff, Retry-After): 2.0; then the policy's 0.2 and 0.4.
    assert clock.sleeps == pytest.approx([2.0, 0.2, 0.4])
    assert gate.events == ["start", "end"]
    assert [e.status for e in gate.errors] == ["429", "503", "429"]


async def test_retrying_call_passes_fatal_errors_through_at_once() -> None:
    clock = FakeClock()
    gate = Gate()
    retrying = RetryingInferencer(
        None, on_error=gate.errors.append, clocks=clock.clocks(), on_backoff_start=gate.started
    )

    async def attempt() -> str:
        raise FatalInferenceError("gone", model="m", status="404")

    with pytest.raises(FatalInferenceError, match="gone"):
        await retrying.call(attempt)
    assert clock.sleeps == []
    assert gate.events == []
    assert len(gate.errors) == 1


async def test_concurrent_overloads_halve_once_and_pause_once() -> None:
    refused: set[str] = set()

    async def overload_first_of_each(request: Request, body: Json) -> HttpAnswer:
        text = user_text(body)
        if text not in refused:
            refused.add(text)
            return error(429, "queue full", "1")
        return await echo(request, body)

    async with harness(settings(max_in_flight=8), overload_first_of_each) as h:
        answer = await h.handler.run(texts("a", "b", "c", "d"))
        # Four 429s at the same instant: one cut (the cooldown), not four: 8 -> 4; then the
        # four answers are a window's worth: 5.
        assert h.pool.endpoints[0].window.limit == 5
    assert answer.outputs["text"].tolist() == ["SAY: A", "SAY: B", "SAY: C", "SAY: D"]
    assert len(h.server.requests) == 8
    assert h.gate.events == ["start", "end"]


async def test_a_connection_failure_is_retried() -> None:
    calls: list[int] = []

    async def flaky(request: Request, body: Json) -> HttpAnswer:
        calls.append(1)
        if len(calls) == 1:
            raise HttpUnreachable("ClientConnectorError: connection refused")
        return await echo(request, body)

    async with harness(settings(), flaky) as h:
        answer = await h.handler.run(texts("a"))
        assert h.pool.endpoints[0].window.limit == 16  # not an overload: the window stays
    assert answer.outputs["text"].tolist() == ["SAY: A"]
    assert h.gate.events == ["start", "end"]
    assert h.gate.errors[0].status == "CONNECTION"
    assert "connection refused" in str(h.gate.errors[0])


@pytest.mark.parametrize(
    ("status", "hint"),
    [(500, ""), (401, "model.api_key"), (403, "model.api_key"), (404, "model.name")],
)
async def test_a_fatal_answer_fails_its_rows_for_good(status: int, hint: str) -> None:
    async def broken(request: Request, body: Json) -> HttpAnswer:
        if "b" in user_text(body):
            return error(status, "the server broke")
        return await echo(request, body)

    async with harness(settings(), broken) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("a", "b", "c"))
        assert h.pool.endpoints[0].window.in_use == 0
    failed = fatal_rows(caught.value)
    assert list(failed) == [1]  # only b's request: its message nacked, a and c answered
    assert f"HTTP {status}: the server broke" in failed[1]
    assert hint in failed[1]
    assert caught.value.answer.outputs["text"].tolist()[0::2] == ["SAY: A", "SAY: C"]
    assert h.gate.events == []  # not retried
    assert sum("b" in user_text(b) for b in h.server.bodies) == 1


async def test_after_a_fatal_batch_the_pool_has_every_place_back() -> None:
    # One place: the other rows wait in the pool's queue when the fatal answer cancels them.
    async def broken(request: Request, body: Json) -> HttpAnswer:
        await asyncio.sleep(0)
        if user_text(body) == "Say: x":
            return error(500, "crashed")
        return await echo(request, body)

    async with harness(settings(max_in_flight=1), broken) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("a", "x", "c", "d"))
        assert list(fatal_rows(caught.value)) == [1]
        window = h.pool.endpoints[0].window
        assert (window.in_use, window.limit) == (0, 1)
        answer = await h.handler.run(texts("e", "f", "g"))
    assert answer.outputs["text"].tolist() == ["SAY: E", "SAY: F", "SAY: G"]
    assert h.server.closed == ["http://127.0.0.1:8000"]  # the pool closes its sessions


async def test_a_fatal_answer_to_a_row_sent_again_alone_fails_that_row_for_good() -> None:
    async def bad(request: Request, body: Json) -> HttpAnswer:
        prompts = body["prompt"]
        if len(prompts) > 1:
            return error(400, "bad batch")
        if prompts == ["x"]:
            return error(500, "crashed")
        return ok(completion(prompts))

    config = settings(api="completions", prompt="{body}", rows_per_request=3)
    async with harness(config, bad) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("a", "x", "c"))
    failed = fatal_rows(caught.value)
    assert list(failed) == [1] and "crashed" in failed[1]


async def test_an_answer_that_is_not_json_is_fatal() -> None:
    async def garbage(request: Request, body: Json) -> HttpAnswer:
        return HttpAnswer(200, b"<html>proxy error</html>")

    async with harness(settings(), garbage) as h:
        with pytest.raises(RowsFailed) as caught:
            await h.handler.run(texts("a"))
    assert "not JSON" in fatal_rows(caught.value)[0]


# --- tokens per minute ----------------------------------------------------------------------


async def test_tokens_per_minute_makes_a_request_wait_on_the_clock() -> None:
    used = {"prompt": 2, "completion": 3000}

    async def counted(request: Request, body: Json) -> HttpAnswer:
        return ok(
            chat_answer("ok", prompt_tokens=used["prompt"], completion_tokens=used["completion"])
        )

    # 3840 a minute: 64 a second (waits are exact binary fractions on the fake clock).
    # "abcd": 4 bytes -> 4 // 4 + 1 + max_tokens 3000 = 3002 estimated.
    config = settings(prompt="{body}", max_tokens=3000, tokens_per_minute=3840)
    async with harness(config, counted, rate_per_minute=3840) as h:
        await h.handler.run(texts("abcd"))
        assert h.clock.sleeps == []  # a full bucket: 838 left
        await h.handler.run(texts("abcd"))
        assert h.clock.sleeps == [(3002 - 838) / 64]  # then empty
        # The server counts 2 where 3002 were estimated: after this wait, 3000 given back...
        used.update(prompt=1, completion=1)
        await h.handler.run(texts("abcd"))
        assert h.clock.sleeps[-1] == 3002 / 64
        # ...so the next request waits for 2 tokens only.
        await h.handler.run(texts("abcd"))
        assert h.clock.sleeps[-1] == 2 / 64
    assert len(h.clock.sleeps) == 3
    assert h.tokens == [(2, 3000), (2, 3000), (1, 1), (1, 1)]


async def test_token_rate_waits_for_what_a_minute_refills() -> None:
    clock = FakeClock()
    rate = TokenRate(60, clock.monotonic, clock.sleep)  # one a second
    await rate.take(60)
    await rate.take(30)
    assert clock.sleeps == [pytest.approx(30.0)]
    await rate.take(1000)  # more than a minute's worth: waits for a full bucket only
    assert clock.sleeps[-1] == pytest.approx(60.0)
    rate.settle(60, 0)  # all of it given back (never beyond a minute's worth)
    await rate.take(60)
    assert len(clock.sleeps) == 2
