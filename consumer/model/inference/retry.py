"""Retrying inference requests: the backoff policy for transient failures, and the wrapper that
retries any :class:`Inferencer` with it, pausing the consumer while requests back off and
retrying at once when a readiness probe sees the server come back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.stop import stop_after_attempt, stop_base, stop_never
from tenacity.wait import wait_base

from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.inference.errors import InferenceError, RetryableInferenceError

log = logging.getLogger(__name__)


class Inferencer(Protocol):
    """Anything that runs one inference request (an :class:`InferenceClient` for one server);
    what :class:`RetryingInferencer` retries."""

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer: ...


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

    async def infer(self, inputs: Sequence[Any], outputs: Sequence[str]) -> Answer:
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
            result: Answer = await retrying(self._attempt, inputs, outputs)
        finally:
            if in_backoff:
                self._leave_backoff()
        return result

    async def _attempt(self, inputs: Sequence[Any], outputs: Sequence[str]) -> Answer:
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
