"""The model layer's spans, against the ``tritonclient`` stand-in of ``test_inference``: one
CLIENT span per request whose context goes to the server in the request's metadata
(``traceparent``), with the endpoint, the version that answered or the gRPC status of a
failure; a ``backoff`` span per wait of the retrying wrapper. None of it when tracing is off."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import rowbatch.tracing
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.model.inference.errors import (
    PoisonInferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.timing import Backoff, Clocks
from rowbatch.tracing import context_of, traceparent_of
from tests.unit import tracing_fixtures
from tests.unit.consumer.model.test_inference import (
    FakeResult,
    FakeTriton,
    Recorder,
    ScriptedInferencer,
    ZeroRandom,
    retryable,
    server_error,
)
from tests.unit.tracing_fixtures import attrs, context, named

spans = tracing_fixtures.spans  # the fixture, where pytest finds it

REQUEST = "inference.GRPCInferenceService/ModelInfer"


class Input:
    """An ``InferInput`` stand-in: only its shape is read."""

    def __init__(self, *shape: int) -> None:
        self._shape = list(shape)

    def shape(self) -> list[int]:
        return self._shape


class VersionedResult(FakeResult):
    def get_response(self) -> Any:
        return SimpleNamespace(model_version="4")


class VersionedTriton(FakeTriton):
    """Answers name the model version that answered (``get_response().model_version``)."""

    async def infer(self, model: str, inputs: list[Any], **kwargs: Any) -> FakeResult:
        plain = await super().infer(model, inputs, **kwargs)
        return VersionedResult(plain.arrays)


def answer() -> dict[str, NDArray[Any]]:
    return {"SCORE": np.ones((5, 1), np.float32)}


async def test_a_request_sends_its_span_context(spans: InMemorySpanExporter) -> None:
    fake = VersionedTriton([answer()])
    client = InferenceClient("triton.local:8001", "scorer", "4", client=fake)
    out = await client.infer([Input(5, 3)], ["SCORE"], client_timeout=2.0)
    assert out.model_version == "4"
    [span] = spans.get_finished_spans()
    assert span.name == REQUEST
    assert span.kind is SpanKind.CLIENT
    assert attrs(span) == {
        "rpc.system": "grpc",
        "rpc.service": "inference.GRPCInferenceService",
        "rpc.method": "ModelInfer",
        "server.address": "triton.local",
        "server.port": 8001,
        "rowbatch.model": "scorer",
        "rowbatch.rows": 5,
        "rowbatch.model.version": "4",
    }
    [call] = fake.calls
    assert call["headers"] == {"traceparent": traceparent_of(context(span))}
    assert call["client_timeout"] == 2.0


async def test_a_request_under_a_span_continues_its_trace(spans: InMemorySpanExporter) -> None:
    fake = FakeTriton([answer()])
    client = InferenceClient("h:1", "m", client=fake)
    with trace.get_tracer("test").start_as_current_span("infer m") as outer:
        await client.infer([], ["SCORE"])
    request, infer = spans.get_finished_spans()
    assert request.parent is not None
    assert request.parent.span_id == context(infer).span_id
    sent = context_of(fake.calls[0]["headers"])
    assert sent is not None
    assert sent.trace_id == outer.get_span_context().trace_id
    assert sent.span_id == context(request).span_id  # the request's span, not the outer one
    assert attrs(request)["rowbatch.rows"] == 0  # no inputs
    assert attrs(request)["rowbatch.model.version"] == ""  # a result naming no version


@pytest.mark.parametrize(
    ("url", "address", "port"),
    [("10.0.0.2:8001", "10.0.0.2", 8001), ("[::1]:8001", "::1", 8001), ("triton", "triton", None)],
)
async def test_the_endpoint_is_named(
    spans: InMemorySpanExporter, url: str, address: str, port: int | None
) -> None:
    await InferenceClient(url, "m", client=FakeTriton([answer()])).infer([], ["SCORE"])
    [span] = spans.get_finished_spans()
    assert (attrs(span)["server.address"], attrs(span).get("server.port")) == (address, port)


@pytest.mark.parametrize(
    ("error", "raised", "status", "code"),
    [
        (
            server_error("StatusCode.UNAVAILABLE", "down"),
            RetryableInferenceError,
            "UNAVAILABLE",
            14,
        ),
        (
            server_error("StatusCode.INVALID_ARGUMENT", "bad"),
            PoisonInferenceError,
            "INVALID_ARGUMENT",
            3,
        ),
    ],
)
async def test_a_failed_request_names_its_status(
    spans: InMemorySpanExporter,
    error: Exception,
    raised: type[Exception],
    status: str,
    code: int,
) -> None:
    fake = FakeTriton([error])
    client = InferenceClient("h:1", "m", client=fake)
    with pytest.raises(raised):
        await client.infer([Input(2)], ["SCORE"])
    [span] = spans.get_finished_spans()
    assert attrs(span)["rpc.grpc.status_code"] == code  # the number, as the convention says
    assert attrs(span)["rowbatch.error.status"] == status
    assert attrs(span)["rowbatch.error"] == raised.__name__
    assert "rowbatch.model.version" not in attrs(span)
    assert span.status.status_code is StatusCode.ERROR
    assert fake.calls[0]["headers"] == {"traceparent": traceparent_of(context(span))}


async def test_without_tracing_no_headers_are_passed(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rowbatch.tracing, "_active", False)
    fake = FakeTriton([answer()])
    await InferenceClient("h:1", "m", client=fake).infer([Input(5)], ["SCORE"])
    [call] = fake.calls
    assert "headers" not in call
    assert spans.get_finished_spans() == ()


# --- retries ------------------------------------------------------------------------------------


def retrying(inner: Any, rec: Recorder) -> RetryingInferencer:
    return RetryingInferencer(
        inner,
        InferenceRetry(Backoff(0.1, 10.0)),
        clocks=Clocks(sleep=rec.sleep, rng=ZeroRandom()),
    )


async def test_each_backoff_wait_is_a_span(spans: InMemorySpanExporter) -> None:
    rec = Recorder()
    inner = ScriptedInferencer([retryable(0), retryable(1)])
    with trace.get_tracer("test").start_as_current_span("infer m"):
        await retrying(inner, rec).infer([1], ["Y"])
    finished = spans.get_finished_spans()
    backoffs = named(finished, "backoff")
    [infer] = named(finished, "infer m")
    assert len(backoffs) == len(rec.sleeps) == 2
    assert [attrs(b)["rowbatch.backoff.seconds"] for b in backoffs] == pytest.approx(rec.sleeps)
    assert [attrs(b)["rowbatch.backoff.requests"] for b in backoffs] == [1, 1]
    for span in backoffs:
        assert span.parent is not None
        assert span.parent.span_id == context(infer).span_id


async def test_retried_requests_are_spans_beside_their_backoff(
    spans: InMemorySpanExporter,
) -> None:
    fake = FakeTriton([server_error("StatusCode.UNAVAILABLE", "down"), answer()])
    rec = Recorder()
    wrapper = retrying(InferenceClient("h:1", "m", client=fake), rec)
    with trace.get_tracer("test").start_as_current_span("infer m"):
        await wrapper.infer([Input(5)], ["SCORE"])
    finished = spans.get_finished_spans()
    [infer] = named(finished, "infer m")
    requests = named(finished, REQUEST)
    [backoff] = named(finished, "backoff")
    assert [s.status.status_code for s in requests] == [StatusCode.ERROR, StatusCode.UNSET]
    for span in [*requests, backoff]:
        assert span.parent is not None
        assert span.parent.span_id == context(infer).span_id
    # Each attempt sends its own span's context.
    sent = [call["headers"]["traceparent"] for call in fake.calls]
    assert sent == [traceparent_of(context(s)) for s in requests]
    assert len(set(sent)) == 2


async def test_without_tracing_backoffs_make_no_spans(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rowbatch.tracing, "_active", False)
    rec = Recorder()
    await retrying(ScriptedInferencer([retryable()]), rec).infer([1], ["Y"])
    assert len(rec.sleeps) == 1
    assert spans.get_finished_spans() == ()
