"""Retrying inference requests: the backoff policy for transient failures, and the wrapper that
retries any :class:`Inferencer` with it, pausing the consumer while requests back off and
retrying at once when a readiness probe sees the server come back.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from opentelemetry import trace
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.stop import stop_after_attempt, stop_base, stop_never

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.inference.errors import InferenceError, RetryableInferenceError
from rowbatch.timing import SYSTEM_CLOCKS, Backoff, BackoffWait, Clocks
from rowbatch.tracing import active as tracing_active

log = logging.getLogger(__name__)

T = TypeVar("T")


class Inferencer(Protocol):
    """Anything that runs one inference request (an :class:`InferenceClient` for one server);
    what :class:`RetryingInferencer` retries."""

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer: ...


INFERENCE_BACKOFF = Backoff(0.1, 10.0)
"""The waits between retries of a transient inference failure unless configured
(``model.backoff_*``)."""


@dataclass(frozen=True)
class InferenceRetry:
    """How a transient inference failure is retried: waits of ``backoff``, forever unless
    ``max_attempts`` is set, each request bounded by ``client_timeout_s``."""

    backoff: Backoff = INFERENCE_BACKOFF
    max_attempts: int | None = None
    """``None``: transient failures never give up (only cancellation stops the retries)."""
    client_timeout_s: float | None = 60.0
    """Deadline of each request; running past it is DEADLINE_EXCEEDED, hence retried."""

    def __post_init__(self) -> None:
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 or None, not {self.max_attempts}")
        if self.client_timeout_s is not None and self.client_timeout_s <= 0:
            raise ValueError(f"client_timeout_s must be > 0 or None: {self.client_timeout_s}")


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
    ``clocks``: its ``sleep`` and jitter ``rng`` (injectable for tests)."""

    def __init__(
        self,
        client: Inferencer | None,
        policy: InferenceRetry | None = None,
        *,
        on_backoff_start: Callable[[], None] = _nothing,
        on_backoff_end: Callable[[], None] = _nothing,
        on_error: Callable[[InferenceError], None] = lambda _: None,
        probe: Callable[[], Awaitable[bool]] | None = None,
        probe_interval_s: float = 0.25,
        clocks: Clocks = SYSTEM_CLOCKS,
    ) -> None:
        self.policy = policy or InferenceRetry()
        self._client = client
        self._on_start = on_backoff_start
        self._on_end = on_backoff_end
        self._on_error = on_error
        self._probe = probe
        self._probe_interval_s = probe_interval_s
        self._probe_task: asyncio.Task[None] | None = None
        self._recovered = asyncio.Event()
        self._sleep = clocks.sleep
        self._wait = BackoffWait(self.policy.backoff, clocks.rng or random.Random())  # noqa: S311 (jitter, not secrets)
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

    async def infer(self, inputs: Sequence[Any], outputs: Sequence[str]) -> Answer:
        """The client's answer, after as many retries as transient failures need."""
        return await self.call(lambda: self._attempt(inputs, outputs))

    async def call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()``'s result, called again after each :class:`RetryableInferenceError`
        as the policy says (any request shape: the OpenAI-compatible handler's too);
        ``on_error`` sees each failed attempt."""
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

        async def counted() -> T:
            try:
                return await attempt()
            except InferenceError as exc:
                self._on_error(exc)
                raise

        retrying = AsyncRetrying(
            sleep=self._pause,
            stop=self._stop,
            wait=self._wait_for,
            retry=retry_if_exception_type(RetryableInferenceError),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            result: T = await retrying(counted)
        finally:
            if in_backoff:
                self._leave_backoff()
        return result

    def _wait_for(self, state: RetryCallState) -> float:
        """The policy's backoff, or longer where the server said when to come back (an HTTP
        ``Retry-After``)."""
        wait = float(self._wait(state))
        exc = state.outcome.exception() if state.outcome is not None else None
        if isinstance(exc, RetryableInferenceError) and exc.retry_after_s is not None:
            return max(wait, min(exc.retry_after_s, self.policy.backoff.max_s))
        return wait

    async def _attempt(self, inputs: Sequence[Any], outputs: Sequence[str]) -> Answer:
        assert self._client is not None, "infer() needs a client (call() does not)"
        return await self._client.infer(
            inputs, outputs, client_timeout=self.policy.client_timeout_s
        )

    async def _pause(self, seconds: float) -> None:
        """Sleep out a backoff, or less if the probe sees the server come back (in a
        ``backoff`` span under the request's when tracing is on)."""
        if not tracing_active():
            await self._sleep_or_recover(seconds)
            return
        with trace.get_tracer("rowbatch.consumer.model").start_as_current_span(
            "backoff", attributes={"rowbatch.backoff.seconds": seconds}
        ) as span:
            await self._sleep_or_recover(seconds)
            span.set_attribute("rowbatch.backoff.requests", self._backing_off)

    async def _sleep_or_recover(self, seconds: float) -> None:
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
