"""A model server that restarts is a transient fault: NOT_FOUND for a model in use is retried,
every failed attempt is counted by kind, and a readiness probe ends the backoff as soon as the
server is back (but not while a ready server is refusing work)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    InferenceError,
    PoisonInferenceError,
    RetryableInferenceError,
    classify,
    error_kind,
)
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.timing import Backoff, Clocks
from tests.unit.consumer.model.test_inference import FakeTriton, ScriptedInferencer, server_error

GONE = "Request for unknown model: 'scorer' has no available versions"


def test_not_found_is_transient_only_for_a_model_in_use() -> None:
    exc = server_error("StatusCode.NOT_FOUND", GONE)
    assert isinstance(classify(exc, model="scorer"), FatalInferenceError)
    served = classify(exc, model="scorer", served=True)
    assert isinstance(served, RetryableInferenceError)
    assert "unloading or restarting" in str(served)


@pytest.mark.parametrize("status", ["502", "504"])
def test_gateway_errors_are_transient(status: str) -> None:
    assert isinstance(classify(server_error(status), model="m"), RetryableInferenceError)
    text = server_error(None, f"HTTP/1.1 {status} Bad Gateway")
    assert isinstance(classify(text, model="m"), RetryableInferenceError)


async def test_client_treats_not_found_as_transient_once_its_model_answered() -> None:
    gone = server_error("StatusCode.NOT_FOUND", GONE)
    fake = FakeTriton([gone])
    client = InferenceClient("h:1", "scorer", client=fake)
    with pytest.raises(FatalInferenceError):  # never seen: the model may not exist at all
        await client.infer([], ["SCORE"])
    fake.answers = [{"SCORE": np.zeros(1)}, gone]
    await client.infer([], ["SCORE"])
    with pytest.raises(RetryableInferenceError, match="no available versions"):
        await client.infer([], ["SCORE"])


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (RetryableInferenceError("x", model="m", status="UNAVAILABLE"), "unavailable"),
        (RetryableInferenceError("x", model="m", status="NOT_FOUND"), "not-found"),
        (
            RetryableInferenceError("x", model="m", status="RESOURCE_EXHAUSTED"),
            "resource-exhausted",
        ),
        (RetryableInferenceError("x", model="m", status="ConnectionResetError"), "connection"),
        (RetryableInferenceError("x", model="m", status="503"), "http"),
        (PoisonInferenceError("x", model="m", status="INVALID_ARGUMENT"), "invalid-argument"),
        (FatalInferenceError("x", model="m", status="INTERNAL"), "other"),
        (FatalInferenceError("x", model="m", status="MISSING_OUTPUT"), "other"),
    ],
)
def test_error_kinds(error: InferenceError, kind: str) -> None:
    assert error_kind(error) == kind


def down(status: str = "UNAVAILABLE") -> RetryableInferenceError:
    return RetryableInferenceError("down", model="m", status=status)


class Scripted:
    """A probe answering from a script (its last answer repeats) and a sleep that returns at
    once for the probe's interval but never for a backoff unless ``release`` is set."""

    def __init__(self, answers: Sequence[bool]) -> None:
        self.answers = list(answers)
        self.events: list[str] = []
        self.release = asyncio.Event()

    async def probe(self) -> bool:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.events.append(f"probe:{answer}")
        if len(self.events) >= 12:
            self.release.set()
        return answer

    async def sleep(self, seconds: float) -> None:
        if seconds == PROBE_S:
            await asyncio.sleep(0)
            return
        self.events.append("backoff")
        await self.release.wait()
        self.events.append("backoff-over")


PROBE_S = 0.125


class Traced(ScriptedInferencer):
    def __init__(self, errors: Sequence[BaseException], script: Scripted) -> None:
        super().__init__(errors)
        self.script = script

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        self.script.events.append("attempt")
        return await super().infer(inputs, outputs, client_timeout=client_timeout)


def inferencer(inner: Any, script: Scripted, errors: list[InferenceError]) -> RetryingInferencer:
    return RetryingInferencer(
        inner,
        InferenceRetry(Backoff(30.0, 30.0, jitter=0.0)),
        on_error=errors.append,
        probe=script.probe,
        probe_interval_s=PROBE_S,
        clocks=Clocks(sleep=script.sleep),
    )


async def test_probe_ends_the_backoff_when_the_server_comes_back() -> None:
    script = Scripted([False, False, True])
    errors: list[InferenceError] = []
    inner = Traced([down("NOT_FOUND")], script)
    out = await asyncio.wait_for(inferencer(inner, script, errors).infer([1, 2], ["Y"]), 5)
    assert np.array_equal(out.outputs["Y"], np.arange(2))
    # retried right after the probe saw the server come back, not after the 30 s backoff
    retry = script.events.index("attempt", 1)
    assert script.events[1:4] == ["backoff", "probe:False", "probe:False"]
    assert "probe:True" in script.events[:retry]
    assert "backoff-over" not in script.events[:retry]
    assert [error_kind(e) for e in errors] == ["not-found"]


async def test_a_ready_server_that_refuses_work_keeps_the_full_backoff() -> None:
    script = Scripted([True])
    errors: list[InferenceError] = []
    inner = Traced([down()], script)
    await asyncio.wait_for(inferencer(inner, script, errors).infer([1], ["Y"]), 5)
    # the probe said "ready" all along: the retry waited for the backoff to end
    retry = script.events.index("attempt", 1)
    assert "backoff-over" in script.events[:retry]
    assert script.events.count("probe:True") >= 10  # the probe ran, and woke nobody
    assert len(errors) == 1


async def test_probe_stops_when_nothing_backs_off() -> None:
    script = Scripted([False, True])
    inner = Traced([down(), down()], script)
    retrying = inferencer(inner, script, [])
    await asyncio.wait_for(retrying.infer([1], ["Y"]), 5)
    assert retrying.backing_off == 0
    probes = sum(e.startswith("probe") for e in script.events)
    for _ in range(5):
        await asyncio.sleep(0)
    assert sum(e.startswith("probe") for e in script.events) == probes
    assert isinstance(InferenceServerException("x"), Exception)
