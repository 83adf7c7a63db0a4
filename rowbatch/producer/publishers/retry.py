"""Retrying transient broker errors: the bounds (:class:`PublishRetry`) and the tenacity loop
both publishers run a send in, which logs each failed attempt."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_after_delay,
)

from rowbatch.timing import Backoff, BackoffWait, Sleep

log = logging.getLogger(__name__)


PUBLISH_BACKOFF = Backoff(0.2, 5.0, jitter=0.5)
"""The waits between publish attempts unless given."""


@dataclass(frozen=True)
class PublishRetry:
    """Retries of transient errors: at most ``attempts`` tries within ``max_seconds``, waiting
    ``backoff`` (exponential, with jitter) between them."""

    attempts: int = 5
    max_seconds: float = 120.0
    backoff: Backoff = PUBLISH_BACKOFF

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, not {self.attempts}")


def make_retrying(
    policy: PublishRetry,
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
        wait=BackoffWait(policy.backoff, random.Random()),  # noqa: S311 (jitter, not secrets)
        retry=retry_if_exception(transient),
        reraise=True,
        sleep=sleep,
        before_sleep=log_retry,
    )


__all__ = ["PublishRetry", "make_retrying"]
