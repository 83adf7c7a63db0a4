"""Error classification, the client wrapper and retries with backoff, against fakes (no server,
no real sleeping)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from tritonclient.utils import InferenceServerException

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.inference.client import (
    MAX_GRPC_MESSAGE_BYTES,
    ChannelOptions,
    InferenceClient,
)
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    InferenceError,
    PoisonInferenceError,
    RetryableInferenceError,
    classify,
)
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.timing import Backoff, Clocks


def server_error(status: str | None, message: str = "boom") -> InferenceServerException:
    return InferenceServerException(msg=message, status=None if status is None else status)


# --- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        ("StatusCode.UNAVAILABLE", "Exceeds maximum queue size", RetryableInferenceError),
        ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", RetryableInferenceError),
        ("StatusCode.RESOURCE_EXHAUSTED", "quota", RetryableInferenceError),
        ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", RetryableInferenceError),
        ("429", "Too Many Requests", RetryableInferenceError),
        ("503", "", RetryableInferenceError),
        (
            "StatusCode.UNKNOWN",
            "Received http2 header with status: 429",
            RetryableInferenceError,
        ),
        (None, "HTTP/1.1 503 Service Unavailable", RetryableInferenceError),
        ("StatusCode.INVALID_ARGUMENT", "unexpected shape", PoisonInferenceError),
        ("StatusCode.NOT_FOUND", "Request for unknown model", FatalInferenceError),
        ("StatusCode.INTERNAL", "model crashed", FatalInferenceError),
        ("StatusCode.UNKNOWN", "something odd", FatalInferenceError),
        ("StatusCode.UNIMPLEMENTED", "", FatalInferenceError),
        (None, "got unexpected numpy array shape", FatalInferenceError),
    ],
)
def test_classify(status: str | None, message: str, expected: type[InferenceError]) -> None:
    err = classify(server_error(status, message), model="embedder")
    assert type(err) is expected
    assert err.model == "embedder"
    assert "model 'embedder'" in str(err)
    assert message in str(err)
    if status is not None and status.startswith("StatusCode."):
        assert err.status == status.removeprefix("StatusCode.")
        assert err.status in str(err)


@pytest.mark.parametrize("exc", [ConnectionRefusedError("refused"), OSError("network down")])
def test_connection_failures_are_retryable(exc: OSError) -> None:
    err = classify(exc, model="m")
    assert isinstance(err, RetryableInferenceError)
    assert err.status == type(exc).__name__


# --- the client --------------------------------------------------------------------------------


class FakeResult:
    def __init__(self, arrays: dict[str, NDArray[Any]]) -> None:
        self.arrays = arrays

    def as_numpy(self, name: str) -> NDArray[Any] | None:
        return self.arrays.get(name)


class FakeTriton:
    """Stands in for tritonclient.grpc.aio.InferenceServerClient."""

    def __init__(self, answers: Sequence[BaseException | dict[str, NDArray[Any]]]) -> None:
        self.answers = list(answers)
        self.calls: list[dict[str, Any]] = []
        self.closed = False

    async def infer(self, model: str, inputs: list[Any], **kwargs: Any) -> FakeResult:
        self.calls.append({"model": model, "inputs": inputs, **kwargs})
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return FakeResult(answer)

    async def close(self) -> None:
        self.closed = True


async def test_client_infer_returns_requested_outputs() -> None:
    fake = FakeTriton([{"SCORE": np.ones((2, 1), np.float32), "LABEL": np.zeros((2, 1))}])
    async with InferenceClient("h:1", "scorer", "3", client=fake) as client:
        out = await client.infer(["in"], ["SCORE", "LABEL"], client_timeout=2.5)
    assert fake.closed
    assert set(out.outputs) == {"SCORE", "LABEL"}
    [call] = fake.calls
    assert (call["model"], call["inputs"], call["model_version"]) == ("scorer", ["in"], "3")
    assert call["client_timeout"] == 2.5
    assert [o.name() for o in call["outputs"]] == ["SCORE", "LABEL"]


async def test_client_classifies_errors() -> None:
    fake = FakeTriton([server_error("StatusCode.INVALID_ARGUMENT", "bad row")])
    client = InferenceClient("h:1", "chaos", client=fake)
    with pytest.raises(PoisonInferenceError, match="bad row") as caught:
        await client.infer([], ["EMBEDDING"])
    assert isinstance(caught.value.__cause__, InferenceServerException)
    fake.answers = [ConnectionResetError("reset")]
    with pytest.raises(RetryableInferenceError, match="connection failed"):
        await client.infer([], ["EMBEDDING"])
    fake.answers = [ValueError("a bug")]  # not a server failure: not wrapped
    with pytest.raises(ValueError, match="a bug"):
        await client.infer([], ["EMBEDDING"])


async def test_client_missing_output_is_fatal() -> None:
    client = InferenceClient("h:1", "m", client=FakeTriton([{"A": np.zeros(1)}]))
    with pytest.raises(FatalInferenceError, match="without the requested output 'B'"):
        await client.infer([], ["A", "B"])


def test_channel_args_restate_defaults() -> None:
    args = dict(ChannelOptions().channel_args())
    assert args["grpc.max_send_message_length"] == MAX_GRPC_MESSAGE_BYTES
    assert args["grpc.max_receive_message_length"] == MAX_GRPC_MESSAGE_BYTES
    assert args["grpc.keepalive_timeout_ms"] == 20_000
    custom = ChannelOptions(max_message_bytes=1 << 20, extra=(("grpc.lb_policy_name", "rr"),))
    custom_args = dict(custom.channel_args())
    assert custom_args["grpc.max_receive_message_length"] == 1 << 20
    assert custom_args["grpc.lb_policy_name"] == "rr"


async def test_real_client_is_built_with_channel_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real ``tritonclient`` client is made, with every channel argument (which replace
    all of gRPC's defaults) and no credentials for plaintext."""
    real = grpcaio.InferenceServerClient
    made: list[tuple[str, dict[str, Any], Any]] = []

    def spy(url: str, **kwargs: Any) -> Any:
        client = real(url, **kwargs)
        made.append((url, kwargs, client))
        return client

    monkeypatch.setattr(grpcaio, "InferenceServerClient", spy)
    options = ChannelOptions(max_message_bytes=1234)
    client = InferenceClient("127.0.0.1:1", "m", channel=options)
    try:
        [(url, kwargs, built)] = made
        assert url == "127.0.0.1:1"
        assert kwargs["creds"] is None
        assert kwargs["channel_args"] == options.channel_args()
        args = dict(kwargs["channel_args"])
        assert args["grpc.max_send_message_length"] == 1234
        assert args["grpc.max_receive_message_length"] == 1234
        assert isinstance(built, real)
        assert client._client is built
    finally:
        await client.close()


# --- retry policy ------------------------------------------------------------------------------


class ZeroRandom(random.Random):
    def random(self) -> float:
        return 0.0


class AlmostOneRandom(random.Random):
    def random(self) -> float:
        return 0.999


@pytest.mark.parametrize("kwargs", [{"max_attempts": 0}, {"client_timeout_s": 0.0}])
def test_invalid_retries(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"must"):
        InferenceRetry(**kwargs)


# --- retrying ----------------------------------------------------------------------------------


class ScriptedInferencer:
    """Fails with the scripted errors, then answers."""

    def __init__(self, errors: Sequence[BaseException]) -> None:
        self.errors = list(errors)
        self.timeouts: list[float | None] = []

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        self.timeouts.append(client_timeout)
        await asyncio.sleep(0)
        if self.errors:
            raise self.errors.pop(0)
        return Answer({name: np.arange(len(inputs)) for name in outputs})


def retryable(n: int = 0) -> RetryableInferenceError:
    return RetryableInferenceError(f"down {n}", model="m", status="UNAVAILABLE")


class Recorder:
    """Hooks and sleep that record what happened, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.sleeps: list[float] = []

    def start(self) -> None:
        self.events.append("start")

    def end(self) -> None:
        self.events.append("end")

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.events.append("sleep")
        await asyncio.sleep(0)


def retrying(inner: Any, rec: Recorder, **policy: Any) -> RetryingInferencer:
    return RetryingInferencer(
        inner,
        InferenceRetry(Backoff(0.1, 10.0), **policy),
        on_backoff_start=rec.start,
        on_backoff_end=rec.end,
        clocks=Clocks(sleep=rec.sleep, rng=ZeroRandom()),
    )


async def test_success_first_time_calls_no_hooks() -> None:
    rec = Recorder()
    inner = ScriptedInferencer([])
    out = await retrying(inner, rec, client_timeout_s=7.0).infer([1, 2], ["Y"])
    assert out.outputs["Y"].tolist() == [0, 1]
    assert rec.events == []
    assert inner.timeouts == [7.0]


async def test_retries_until_success_with_one_backoff_period() -> None:
    rec = Recorder()
    inner = ScriptedInferencer([retryable(i) for i in range(5)])
    wrapper = retrying(inner, rec)
    out = await wrapper.infer([1], ["Y"])
    assert out.outputs["Y"].tolist() == [0]
    assert rec.events == ["start"] + ["sleep"] * 5 + ["end"]
    assert rec.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6])
    assert len(inner.timeouts) == 6
    assert wrapper.backing_off == 0
    # A second failure burst is a second period.
    inner.errors = [retryable()]
    await wrapper.infer([1], ["Y"])
    assert rec.events.count("start") == rec.events.count("end") == 2


async def test_transient_errors_never_give_up_by_default() -> None:
    rec = Recorder()
    inner = ScriptedInferencer([retryable(i) for i in range(2000)])
    await retrying(inner, rec).infer([1], ["Y"])
    assert len(rec.sleeps) == 2000
    assert max(rec.sleeps) == 10.0
    assert rec.events[0] == "start"
    assert rec.events[-1] == "end"


async def test_max_attempts_reraises_the_last_error() -> None:
    rec = Recorder()
    inner = ScriptedInferencer([retryable(i) for i in range(10)])
    with pytest.raises(RetryableInferenceError, match="down 2"):
        await retrying(inner, rec, max_attempts=3).infer([1], ["Y"])
    assert rec.events == ["start", "sleep", "sleep", "end"]


@pytest.mark.parametrize(
    "error",
    [
        PoisonInferenceError("bad rows", model="m", status="INVALID_ARGUMENT"),
        FatalInferenceError("gone", model="m", status="NOT_FOUND"),
        ValueError("bug"),
    ],
)
async def test_other_errors_are_not_retried(error: Exception) -> None:
    rec = Recorder()
    inner = ScriptedInferencer([error])
    with pytest.raises(type(error)):
        await retrying(inner, rec).infer([1], ["Y"])
    assert rec.events == []
    assert len(inner.timeouts) == 1
    # ...also after some transient failures: the backoff period still ends.
    inner = ScriptedInferencer([retryable(), retryable(), error])
    with pytest.raises(type(error)):
        await retrying(inner, rec).infer([1], ["Y"])
    assert rec.events == ["start", "sleep", "sleep", "end"]


async def test_cancellation_stops_retrying_and_ends_the_period() -> None:
    rec = Recorder()
    blocked = asyncio.Event()

    async def sleep_forever(seconds: float) -> None:
        rec.sleeps.append(seconds)
        blocked.set()
        await asyncio.Event().wait()

    inner = ScriptedInferencer([retryable()])
    wrapper = RetryingInferencer(
        inner,
        on_backoff_start=rec.start,
        on_backoff_end=rec.end,
        clocks=Clocks(sleep=sleep_forever),
    )
    task = asyncio.create_task(wrapper.infer([1], ["Y"]))
    await blocked.wait()
    assert rec.events == ["start"]
    assert wrapper.backing_off == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rec.events == ["start", "end"]
    assert wrapper.backing_off == 0


async def test_concurrent_requests_share_one_backoff_period() -> None:
    rec = Recorder()
    release, both_sleeping = asyncio.Event(), asyncio.Event()

    async def sleep(seconds: float) -> None:
        rec.events.append("sleep")
        if rec.events.count("sleep") == 2:
            both_sleeping.set()
        await release.wait()

    inner = ScriptedInferencer([retryable(1), retryable(2)])  # both requests fail once
    wrapper = RetryingInferencer(
        inner, on_backoff_start=rec.start, on_backoff_end=rec.end, clocks=Clocks(sleep=sleep)
    )
    a = asyncio.create_task(wrapper.infer([1], ["Y"]))
    b = asyncio.create_task(wrapper.infer([1], ["Y"]))
    await both_sleeping.wait()
    assert wrapper.backing_off == 2
    assert rec.events == ["start", "sleep", "sleep"]
    release.set()
    await asyncio.gather(a, b)
    assert rec.events == ["start", "sleep", "sleep", "end"]
    assert wrapper.backing_off == 0
