"""Calling the model over KServe v2 gRPC (``tritonclient.grpc.aio``), with every failure sorted
into one of three classes, and retries with exponential backoff for the transient ones.

=============================  ==============================================  ===============
class                          when                                            what to do
=============================  ==============================================  ===============
:class:`RetryableInferenceError` UNAVAILABLE, RESOURCE_EXHAUSTED,               back off, retry
                               DEADLINE_EXCEEDED, HTTP 429/503 (from a proxy),  for ever
                               connection failures
:class:`PoisonInferenceError`  INVALID_ARGUMENT: the rows are bad              bisect, dead-
                                                                               letter
:class:`FatalInferenceError`   anything else (NOT_FOUND, INTERNAL, ...)        stop the
                                                                               consumer
=============================  ==============================================  ===============
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from numpy.typing import NDArray
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.stop import stop_after_attempt, stop_base, stop_never
from tenacity.wait import wait_base
from tritonclient.utils import InferenceServerException

from consumer.model.discovery import (
    ModelDiscoveryError,
    ModelServerUnavailable,
    ModelSpec,
    discover_model,
)
from consumer.model.tls import TlsOptions, channel_credentials, describe_handshake_failure

log = logging.getLogger(__name__)

#: gRPC statuses that say "try again later".
RETRYABLE_STATUSES: Final = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})
#: gRPC statuses that say "these rows are bad".
POISON_STATUSES: Final = frozenset({"INVALID_ARGUMENT"})
#: HTTP statuses (a gateway in front of the server) that say "try again later".
RETRYABLE_HTTP: Final = frozenset({"429", "502", "503", "504"})
#: gRPC statuses that, for a model this consumer already discovered and used, mean "the server
#: is unloading or restarting it" (Triton answers NOT_FOUND "has no available versions" while it
#: shuts down): transient while running, though fatal at start-up (see ``classify``).
GONE_WHILE_SERVED: Final = frozenset({"NOT_FOUND"})
_HTTP_RETRYABLE_TEXT: Final = re.compile(
    r"\b(?:status:? ?|HTTP/\S+ )(?:429|502|503|504)\b|too many requests|service unavailable"
    r"|bad gateway|gateway time-?out",
    re.I,
)
#: tritonclient's own default for both message-length limits (INT32_MAX).
MAX_GRPC_MESSAGE_BYTES: Final = 2**31 - 1


class InferenceError(Exception):
    """A failed inference request. ``status`` is the gRPC status name (``UNAVAILABLE``), an
    HTTP status (``503``), or the exception type for connection failures."""

    def __init__(self, message: str, *, model: str, status: str) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.status = status


class RetryableInferenceError(InferenceError):
    """Transient: the same request may succeed later."""


class PoisonInferenceError(InferenceError):
    """The server rejected the request's rows (INVALID_ARGUMENT): retrying cannot help, but a
    smaller request without the offending rows can."""


class FatalInferenceError(InferenceError):
    """Neither transient nor about the rows (unknown model, server bug): stop and tell someone."""


def grpc_status(exc: InferenceServerException) -> str:
    """``"StatusCode.UNAVAILABLE"`` -> ``"UNAVAILABLE"``; ``""`` for client-side errors."""
    return str(exc.status() or "").removeprefix("StatusCode.")


def classify(
    exc: InferenceServerException | OSError, *, model: str, served: bool = False
) -> InferenceError:
    """The :class:`InferenceError` subclass instance for a failed request to ``model``.
    ``served``: the model was discovered on this server and is being used, so NOT_FOUND means
    it is being unloaded or the server restarted (transient), not that it never existed."""
    if isinstance(exc, OSError):
        status = type(exc).__name__
        return RetryableInferenceError(
            f"model {model!r}: connection failed ({status}): {exc}", model=model, status=status
        )
    status = grpc_status(exc)
    text = str(exc.message() or "")
    described = f"model {model!r}: {status or 'client error'}: {text}"
    if status in RETRYABLE_STATUSES or status in RETRYABLE_HTTP:
        return RetryableInferenceError(described, model=model, status=status)
    if status in ("", "UNKNOWN") and _HTTP_RETRYABLE_TEXT.search(text):
        return RetryableInferenceError(described, model=model, status=status or "HTTP")
    if served and status in GONE_WHILE_SERVED:
        return RetryableInferenceError(
            f"{described} (the server is unloading or restarting the model; waiting for it)",
            model=model,
            status=status,
        )
    if status in POISON_STATUSES:
        return PoisonInferenceError(described, model=model, status=status)
    return FatalInferenceError(described, model=model, status=status or "CLIENT")


# --- the client ----------------------------------------------------------------------------------


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


class Inferencer(Protocol):
    """Anything that runs one inference request."""

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> dict[str, NDArray[Any]]: ...


class InferenceClient:
    """One model on one KServe v2 gRPC server. ``infer`` raises only :class:`InferenceError`
    subclasses for server and connection failures.

    ``tls``: TLS (or mutual TLS) to the server; its files are read here, so an unreadable one
    raises :class:`consumer.model.tls.TlsConfigError` at once. ``client`` replaces the
    ``tritonclient.grpc.aio.InferenceServerClient`` (tests)."""

    def __init__(
        self,
        url: str,
        model: str,
        version: str = "",
        *,
        channel: ChannelOptions | None = None,
        tls: TlsOptions | None = None,
        client: Any = None,
    ) -> None:
        self.url = url
        self.model = model
        self.version = version
        self.tls = tls
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
        """This model's spec from the server (see :func:`consumer.model.discovery.discover_model`).
        A failed TLS handshake (which gRPC reports as UNAVAILABLE) is named as such."""
        try:
            spec = await discover_model(
                self._client,
                self.model,
                self.version,
                server=f"inference server {self.url}",
                client_timeout=client_timeout,
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
    ) -> dict[str, NDArray[Any]]:
        """Runs one request; returns each requested output as a numpy array (BYTES outputs as
        object arrays of ``bytes``). ``client_timeout`` bounds the request in seconds."""
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
        try:
            result = await self._client.infer(
                self.model,
                list(inputs),
                model_version=self.version,
                outputs=requested,
                client_timeout=client_timeout,
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
        return arrays

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


def error_kind(error: InferenceError) -> str:
    """The ``kind`` label of ``rowbatch_inference_errors_total`` for ``error``."""
    status = error.status
    if status.isdigit() or status == "HTTP":
        return "http"
    if status.isupper() and status.replace("_", "").isalpha():
        kind = status.lower().replace("_", "-")
        return kind if kind in _KNOWN_KINDS else "other"
    return "connection" if isinstance(error, RetryableInferenceError) else "other"


_KNOWN_KINDS: Final = frozenset(
    {"unavailable", "resource-exhausted", "deadline-exceeded", "not-found", "invalid-argument"}
)


# --- retries -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for transient failures: the n-th wait is
    ``min(max_backoff_s, initial_backoff_s * multiplier**(n-1))``, of which the ``jitter``
    fraction is random (``1.0``: anywhere from 0 to the full wait; ``0.0``: none)."""

    initial_backoff_s: float = 0.1
    max_backoff_s: float = 10.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = None
    """``None``: transient failures never give up (only cancellation stops the retries)."""
    client_timeout_s: float | None = 60.0
    """Deadline of each request; running past it is DEADLINE_EXCEEDED, hence retried."""

    def __post_init__(self) -> None:
        if not 0 < self.initial_backoff_s <= self.max_backoff_s:
            raise ValueError(
                "need 0 < initial_backoff_s <= max_backoff_s, got "
                f"{self.initial_backoff_s} and {self.max_backoff_s}"
            )
        if self.multiplier < 1.0 or not 0.0 <= self.jitter <= 1.0:
            raise ValueError(f"need multiplier >= 1 and 0 <= jitter <= 1: {self}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 or None, not {self.max_attempts}")
        if self.client_timeout_s is not None and self.client_timeout_s <= 0:
            raise ValueError(f"client_timeout_s must be > 0 or None: {self.client_timeout_s}")

    def backoff(self, attempt: int, rng: random.Random) -> float:
        """Seconds to wait after the ``attempt``-th failed attempt (1-based)."""
        # Cap the exponent where the wait reaches its maximum: after hours of retries
        # multiplier**n would overflow a float.
        exponent = min(attempt - 1, self._max_exponent)
        base = min(self.max_backoff_s, self.initial_backoff_s * self.multiplier**exponent)
        return base * (1.0 - self.jitter * rng.random())

    @property
    def _max_exponent(self) -> int:
        if self.multiplier == 1.0:
            return 0
        ratio = self.max_backoff_s / self.initial_backoff_s
        return math.ceil(math.log(ratio) / math.log(self.multiplier))


class _PolicyWait(wait_base):
    def __init__(self, policy: RetryPolicy, rng: random.Random) -> None:
        self._policy = policy
        self._rng = rng

    def __call__(self, retry_state: RetryCallState) -> float:
        return self._policy.backoff(retry_state.attempt_number, self._rng)


def _nothing() -> None:
    return None


class RetryingInferencer:
    """Retries :class:`RetryableInferenceError` with exponential backoff and jitter; poison and
    fatal errors pass straight through.

    Backoff periods are counted across concurrent requests: ``on_backoff_start`` is called when
    the first request starts backing off, ``on_backoff_end`` when no request is backing off any
    more (its retry answered, failed otherwise, or was cancelled). The consumer pauses its
    source and sets a metric there. ``on_error`` sees every failed attempt (metrics).

    ``probe`` (e.g. :meth:`InferenceClient.ready`) is asked every ``probe_interval_s`` while
    requests back off; when it turns from not ready to ready (the server came back), every
    waiting request retries at once instead of sleeping out its backoff. A server that stays
    ready while refusing requests (a full queue) does not shorten the backoff.
    ``sleep`` and ``rng`` are injectable for tests."""

    def __init__(
        self,
        client: Inferencer,
        policy: RetryPolicy | None = None,
        *,
        on_backoff_start: Callable[[], None] = _nothing,
        on_backoff_end: Callable[[], None] = _nothing,
        on_error: Callable[[InferenceError], None] = lambda _: None,
        probe: Callable[[], Awaitable[bool]] | None = None,
        probe_interval_s: float = 0.25,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.policy = policy or RetryPolicy()
        self._client = client
        self._on_start = on_backoff_start
        self._on_end = on_backoff_end
        self._on_error = on_error
        self._probe = probe
        self._probe_interval_s = probe_interval_s
        self._probe_task: asyncio.Task[None] | None = None
        self._recovered = asyncio.Event()
        self._sleep = sleep
        self._wait = _PolicyWait(self.policy, rng or random.Random())  # noqa: S311 (jitter, not secrets)
        self._stop: stop_base = (
            stop_never
            if self.policy.max_attempts is None
            else stop_after_attempt(self.policy.max_attempts)
        )
        self._backing_off = 0

    @property
    def backing_off(self) -> int:
        """Requests now waiting to retry."""
        return self._backing_off

    async def infer(self, inputs: Sequence[Any], outputs: Sequence[str]) -> dict[str, NDArray[Any]]:
        """The client's answer, after as many retries as transient failures need."""
        in_backoff = False

        def before_sleep(state: RetryCallState) -> None:
            nonlocal in_backoff
            if not in_backoff:
                in_backoff = True
                self._enter_backoff()
            exc = state.outcome.exception() if state.outcome is not None else None
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            log.warning(
                "inference attempt %d failed, retrying in %.2f s: %s",
                state.attempt_number,
                wait,
                exc,
            )

        retrying = AsyncRetrying(
            sleep=self._pause,
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception_type(RetryableInferenceError),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            result: dict[str, NDArray[Any]] = await retrying(self._attempt, inputs, outputs)
        finally:
            if in_backoff:
                self._leave_backoff()
        return result

    async def _attempt(
        self, inputs: Sequence[Any], outputs: Sequence[str]
    ) -> dict[str, NDArray[Any]]:
        try:
            return await self._client.infer(
                inputs, outputs, client_timeout=self.policy.client_timeout_s
            )
        except InferenceError as exc:
            self._on_error(exc)
            raise

    async def _pause(self, seconds: float) -> None:
        """Sleep out a backoff, or less if the probe sees the server come back."""
        recovered = asyncio.ensure_future(self._recovered.wait())
        slept = asyncio.ensure_future(self._sleep(seconds))
        try:
            await asyncio.wait({recovered, slept}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (recovered, slept):
                task.cancel()
            await asyncio.gather(recovered, slept, return_exceptions=True)

    async def _watch(self, probe: Callable[[], Awaitable[bool]]) -> None:
        was_down = False
        while True:
            await self._sleep(self._probe_interval_s)
            try:
                up = await probe()
            except Exception:  # noqa: BLE001 (a probe failing means "not ready")
                up = False
            if not up:
                was_down = True
            elif was_down:
                was_down = False
                log.info("inference server answers ready again; retrying at once")
                self._recovered.set()
                self._recovered = asyncio.Event()

    def _enter_backoff(self) -> None:
        self._backing_off += 1
        if self._backing_off == 1:
            self._on_start()
            if self._probe is not None:
                self._probe_task = asyncio.ensure_future(self._watch(self._probe))

    def _leave_backoff(self) -> None:
        self._backing_off -= 1
        if self._backing_off == 0:
            if self._probe_task is not None:
                self._probe_task.cancel()
                self._probe_task = None
            self._on_end()


__all__ = [
    "ChannelOptions",
    "FatalInferenceError",
    "InferenceClient",
    "InferenceError",
    "Inferencer",
    "PoisonInferenceError",
    "RetryPolicy",
    "RetryableInferenceError",
    "RetryingInferencer",
    "classify",
    "error_kind",
    "grpc_status",
]
