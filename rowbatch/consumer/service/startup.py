"""Waiting for a dependency at start-up: an inference server or database that restarts along
with the consumer (a rollout, a node drain) is retried with backoff for a while, not a reason
to exit. Only "unavailable" errors are waited out; anything else (a wrong model name, a bad
certificate, a wrong table) fails at once."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rowbatch.timing import SYSTEM_CLOCKS, Backoff, Clocks

log = logging.getLogger(__name__)

T = TypeVar("T")


class StartupError(RuntimeError):
    """The consumer cannot start; the message says what to fix."""


class StillUnavailable(StartupError):
    """The dependency stayed unavailable for the whole start-up wait."""


async def wait_for(
    op: Callable[[], Awaitable[T]],
    *,
    what: str,
    unavailable: type[BaseException] | tuple[type[BaseException], ...],
    wait_s: float,
    backoff: Backoff,
    setting: str,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> T:
    """``op()``, retried with ``backoff`` while it raises ``unavailable``, for up to ``wait_s``
    seconds; then :class:`StillUnavailable` naming ``what``, the ``setting`` that bounds the
    wait, and the last error. ``clocks``: its monotonic clock, ``sleep`` and jitter ``rng``."""
    clock, sleep = clocks.monotonic, clocks.sleep
    jitter = clocks.rng or random.Random()  # noqa: S311 (jitter, not secrets)
    deadline = clock() + wait_s
    attempt = 0
    while True:
        try:
            return await op()
        except unavailable as exc:
            attempt += 1
            wait = backoff.wait(attempt, jitter)
            if clock() + wait > deadline:
                raise StillUnavailable(
                    f"{what} still unavailable after {wait_s:.0f} s ({setting}): {exc}"
                ) from exc
            log.warning(
                "%s unavailable at start-up (attempt %d), retrying in %.1f s: %s",
                what,
                attempt,
                wait,
                exc,
            )
            await sleep(wait)
