"""Retrying transient broker errors: the bounds (:class:`RetryPolicy`) and the tenacity loop
both publishers run a send in, which logs each failed attempt."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_random,
)

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class RetryPolicy:
    """Retries of transient errors: at most ``attempts`` tries within ``max_seconds``, with
    exponential backoff and jitter between ``initial_backoff_s`` and ``max_backoff_s``."""

    attempts: int = 5
    max_seconds: float = 120.0
    initial_backoff_s: float = 0.2
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {self.attempts}")


def make_retrying(
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool],
    sleep: Sleep,
    describe: Callable[[], str],
    before_retry: Callable[[BaseException], None] | None = None,
) -> AsyncRetrying:
    def log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None and before_retry is not None:
            before_retry(exc)
        log.warning(
            "%s: attempt %d failed (%s: %s); retrying",
            describe(),
            state.attempt_number,
            type(exc).__name__,
            exc,
        )

    return AsyncRetrying(
        stop=stop_after_attempt(policy.attempts) | stop_after_delay(policy.max_seconds),
        wait=wait_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s)
        + wait_random(0, policy.initial_backoff_s),
        retry=retry_if_exception(transient),
        reraise=True,
        sleep=sleep,
        before_sleep=log_retry,
    )


__all__ = ["RetryPolicy", "Sleep", "make_retrying"]
