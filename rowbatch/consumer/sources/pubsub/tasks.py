"""asyncio helpers of the unary-pull source's background tasks: waiting for a delay or an
event, whichever comes first, and stopping tasks within a bounded time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from rowbatch.timing import Sleep

_LOG = logging.getLogger(__name__)


async def sleep_or_event(sleep: Sleep, delay: float, event: asyncio.Event) -> None:
    """Wait until ``delay`` has passed (by ``sleep``) or ``event`` is set, whichever is first.

    A cancellation of the caller always propagates, also one that arrives while the helper
    tasks are being cancelled: suppressing ``CancelledError`` around awaiting them would
    swallow it, leaving the caller running and a ``close`` that waits for it hanging."""
    if event.is_set():
        return
    sleeper = asyncio.ensure_future(sleep(delay))
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = {task for task in (sleeper, waiter) if not task.done()}
        for task in pending:
            task.cancel()
        if pending:  # asyncio.wait raises no error of theirs, only the caller's cancellation
            await asyncio.wait(pending)


async def stop_tasks(tasks: Sequence[asyncio.Task[None]], timeout_s: float, *, where: str) -> None:
    """Cancel ``tasks`` and wait for them to end, at most ``timeout_s``; one still running
    then is logged (naming ``where``) and left behind. The errors of those that ended are
    retrieved and dropped: an error of a task being stopped is no news."""
    for task in tasks:
        task.cancel()
    if not tasks:
        return
    done, late = await asyncio.wait(tasks, timeout=timeout_s)
    for task in done:
        if not task.cancelled():
            task.exception()
    if late:
        _LOG.warning(
            "%s on %s did not stop within %g s of being cancelled",
            ", ".join(sorted(task.get_name() for task in late)),
            where,
            timeout_s,
        )
