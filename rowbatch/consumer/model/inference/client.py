"""Talking to one KServe v2 gRPC inference server (``tritonclient.grpc.aio``) about one model:
the channel settings, discovery, one request at a time (its answer carrying the model version
the response names), and the readiness probe. Failures come out classified
(:mod:`rowbatch.consumer.model.inference.errors`); retries are the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from opentelemetry import trace
from tritonclient.utils import InferenceServerException

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.configured_spec import ConfiguredSpec
from rowbatch.consumer.model.discovery import (
    ModelDiscoveryError,
    ModelServerUnavailable,
    discover_model,
)
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    InferenceError,
    classify,
    grpc_status,
)
from rowbatch.consumer.model.server_stats import QueueTotals, queue_totals
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.model.tls import TlsOptions, channel_credentials, describe_handshake_failure
from rowbatch.tracing import active as tracing_active
from rowbatch.tracing import inject

#: tritonclient's own default for both message-length limits (INT32_MAX).
MAX_GRPC_MESSAGE_BYTES: Final = 2**31 - 1


@dataclass(frozen=True)
class ChannelOptions:
    """gRPC channel settings. tritonclient drops *all* its defaults when given channel args,
    so these restate them (message limits, keepalive) and make them configurable."""

    max_message_bytes: int = MAX_GRPC_MESSAGE_BYTES
    keepalive_time_ms: int = 2**31 - 1
    keepalive_timeout_ms: int = 20_000
    keepalive_permit_without_calls: bool = False
    http2_max_pings_without_data: int = 2
    initial_reconnect_backoff_ms: int = 100
    min_reconnect_backoff_ms: int = 100
    max_reconnect_backoff_ms: int = 1_000
    """gRPC's own reconnect backoff after the server went away (its defaults: 1 s initial, up to
    120 s) is kept short, so a restarted server is used again within about a second."""
    extra: Sequence[tuple[str, int | str]] = field(default=())
    """Further ``(grpc.option, value)`` pairs, appended as given."""

    def channel_args(self) -> list[tuple[str, int | str]]:
        return [
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.keepalive_time_ms", self.keepalive_time_ms),
            ("grpc.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("grpc.keepalive_permit_without_calls", int(self.keepalive_permit_without_calls)),
            ("grpc.http2.max_pings_without_data", self.http2_max_pings_without_data),
            ("grpc.initial_reconnect_backoff_ms", self.initial_reconnect_backoff_ms),
            ("grpc.min_reconnect_backoff_ms", self.min_reconnect_backoff_ms),
            ("grpc.max_reconnect_backoff_ms", self.max_reconnect_backoff_ms),
            *self.extra,
        ]


def _answered_version(result: Any) -> str:
    """The ``model_version`` of an ``InferResult``'s response (a field read per request)."""
    try:
        return str(result.get_response().model_version)
    except AttributeError:  # a stand-in result without a response
        return ""


def _rows(inputs: Sequence[Any]) -> int:
    """The batch dimension of a request's first input (0 when it has none)."""
    try:
        return int(inputs[0].shape()[0]) if inputs else 0
    except (AttributeError, IndexError, TypeError):
        return 0


class InferenceClient:
    """One model on one KServe v2 gRPC server. ``infer`` raises only :class:`InferenceError`
    subclasses for server and connection failures.

    ``tls``: TLS (or mutual TLS) to the server; its files are read here, so an unreadable one
    raises :class:`rowbatch.consumer.model.tls.TlsConfigError` at once. ``configured``: the tensor
    specs from configuration (``model.inputs`` / ``model.outputs``), for discovery. ``client``
    replaces the ``tritonclient.grpc.aio.InferenceServerClient`` (tests)."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str = "",
        *,
        channel: ChannelOptions | None = None,
        tls: TlsOptions | None = None,
        configured: ConfiguredSpec | None = None,
        client: Any = None,
    ) -> None:
        self.url = url
        self.model = model
        self.version = version
        self.tls = tls
        self.configured = configured
        self._served = False
        """Set once the model was discovered or answered: from then on NOT_FOUND means the
        server is unloading or restarting it (transient), not that it does not exist."""
        options = channel or ChannelOptions()
        if client is None:
            args = options.channel_args() + (tls.channel_args() if tls else [])
            creds = channel_credentials(tls) if tls is not None else None
            # creds (not ssl=/root_certificates=, which take paths) so the bytes are read once
            client = grpcaio.InferenceServerClient(url, creds=creds, channel_args=args)
        self._client = client

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._client.close()

    async def discover(self, client_timeout: float | None = 30.0) -> ModelSpec:
        """This model's spec from the server (see
        :func:`rowbatch.consumer.model.discovery.discover_model`). A failed TLS handshake (which
        gRPC reports as UNAVAILABLE) is named as such."""
        try:
            spec = await discover_model(
                self._client,
                self.model,
                self.version,
                server=f"inference server {self.url}",
                client_timeout=client_timeout,
                configured=self.configured,
            )
        except ModelServerUnavailable as exc:
            described = describe_handshake_failure(self.url, str(exc), self.tls)
            if described is None:
                raise
            raise ModelDiscoveryError(described) from exc
        self._served = True
        return spec

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        """Runs one request; returns each requested output as a numpy array (BYTES outputs as
        object arrays of ``bytes``) and the version that answered. ``client_timeout`` bounds
        the request in seconds."""
        if tracing_active():
            return await self._traced_infer(inputs, outputs, client_timeout)
        return await self._infer(inputs, outputs, client_timeout, None)

    async def _traced_infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], client_timeout: float | None
    ) -> Answer:
        """``_infer`` in a CLIENT span whose context goes to the server in the request's
        metadata (``traceparent``: Triton's own OpenTelemetry tracing continues it)."""
        host, _, port = self.url.rpartition(":")
        attributes: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rpc.method": "ModelInfer",
            "server.address": (host or self.url).strip("[]"),
            "rowbatch.model": self.model,
            "rowbatch.rows": _rows(inputs),
        }
        if host and port.isdigit():
            attributes["server.port"] = int(port)
        with trace.get_tracer("rowbatch.consumer.model").start_as_current_span(
            "inference.GRPCInferenceService/ModelInfer",
            kind=trace.SpanKind.CLIENT,
            attributes=attributes,
        ) as span:
            headers: dict[str, str] = {}
            inject(headers, pubsub=False)
            try:
                answer = await self._infer(inputs, outputs, client_timeout, headers)
            except InferenceError as exc:
                code = getattr(grpc.StatusCode, exc.status, None)
                if isinstance(code, grpc.StatusCode):
                    span.set_attribute("rpc.grpc.status_code", int(code.value[0]))
                span.set_attribute("rowbatch.error.status", exc.status)
                span.set_attribute("rowbatch.error", type(exc).__name__)
                raise
            span.set_attribute("rowbatch.model.version", answer.model_version)
            return answer

    async def _infer(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[str],
        client_timeout: float | None,
        headers: dict[str, str] | None,
    ) -> Answer:
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        try:
            result = await self._client.infer(
                self.model,
                list(inputs),
                model_version=self.version,
                outputs=requested,
                client_timeout=client_timeout,
                **({} if headers is None else {"headers": headers}),
            )
        except (InferenceServerException, OSError) as exc:
            raise classify(exc, model=self.model, served=self._served) from exc
        arrays: dict[str, NDArray[Any]] = {}
        for name in outputs:
            array = result.as_numpy(name)
            if array is None:
                raise FatalInferenceError(
                    f"model {self.model!r} answered without the requested output {name!r}",
                    model=self.model,
                    status="MISSING_OUTPUT",
                )
            arrays[name] = np.asarray(array)
        self._served = True
        return Answer(arrays, _answered_version(result))

    async def queue_totals(self, at: float, client_timeout: float = 2.0) -> QueueTotals | None:
        """The model's queue and compute totals from the server's statistics (``at``: the
        caller's clock now); None when the server does not keep them (UNIMPLEMENTED: MLServer,
        KServe's Python server) or holds none for the model. Other failures raise
        ``InferenceServerException`` or ``OSError`` (the caller reads again later)."""
        try:
            stats = await self._client.get_inference_statistics(
                self.model, self.version, as_json=True, client_timeout=client_timeout
            )
        except InferenceServerException as exc:
            if grpc_status(exc) == "UNIMPLEMENTED":
                return None
            raise
        return queue_totals(stats, self.model, at)

    async def ready(self, client_timeout: float = 1.0) -> bool:
        """Whether the server answers that the model is ready (``False`` on any error)."""
        try:
            return bool(
                await self._client.is_model_ready(
                    self.model, self.version, client_timeout=client_timeout
                )
            )
        except (InferenceServerException, OSError):
            return False
