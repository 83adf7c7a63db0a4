"""A consumer process that was told to stop always exits: the event loop's teardown is bounded,
threads a library leaves stuck do not hold the process, and a watchdog ends a shutdown that
hangs past its allowance. Leaving early loses nothing: what was not settled is redelivered."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from rowbatch.timing import Clock

log = logging.getLogger(__name__)

T = TypeVar("T")

TEARDOWN_S = 2.0
"""How long the loop's teardown (cancelled tasks, the default executor) and then stuck threads
are waited for, each, once the consumer has closed everything it opened."""

SOURCE_CLOSE_S = 20.0
"""Longest wait for the source's close (it stops pulling and confirms its acks and nacks)."""

CLOSE_STEP_S = 10.0
"""Longest wait for closing each of the sink, the health server and the inference client."""

CLOSE_MARGIN_S = 60.0
"""Allowance on top of ``shutdown_grace_s`` before the watchdog ends the process: the close
steps (at most 50 s together) plus the bounded teardown. Kubernetes'
``terminationGracePeriodSeconds`` should exceed ``shutdown_grace_s`` plus this."""

HUNG_EXIT_CODE = 1


class Timer(Protocol):
    daemon: bool

    def start(self) -> None: ...

    def cancel(self) -> None: ...


class Watchdog:
    """Once armed, ends the process ``limit_s`` later unless it has exited by then: logs why,
    dumps every thread's stack to stderr (so the hang can be diagnosed) and exits with
    :data:`HUNG_EXIT_CODE`. A safety net for a close that never returns."""

    def __init__(
        self,
        limit_s: float,
        *,
        expire: Callable[[float], None] | None = None,
        timer: Callable[[float, Callable[[], None]], Timer] = threading.Timer,
    ) -> None:
        self.limit_s = limit_s
        self._expire = expire or _exit_hung
        self._make_timer = timer
        self._timer: Timer | None = None

    @property
    def armed(self) -> bool:
        return self._timer is not None

    def arm(self) -> None:
        if self._timer is not None:
            return
        self._timer = self._make_timer(self.limit_s, lambda: self._expire(self.limit_s))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _exit_hung(limit_s: float) -> None:
    log.error(
        "shutdown did not finish within %.0f s of the stop signal: exiting now (whatever was "
        "not settled is redelivered by the broker); thread stacks follow on stderr",
        limit_s,
    )
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    _flush_and_exit(HUNG_EXIT_CODE)


def _flush_and_exit(code: int) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def close_bounded(what: str, closing: Awaitable[object], timeout_s: float) -> None:
    """Await ``closing``, giving up after ``timeout_s`` with a warning naming ``what``: one
    part that does not close must not keep the others open or the process alive. Errors are
    logged, not raised, for the same reason."""
    try:
        await asyncio.wait_for(closing, timeout_s)
    except TimeoutError:
        log.warning("closing the %s took over %.0f s; going on without it", what, timeout_s)
    except Exception:
        log.exception("closing the %s failed; going on", what)


class StoppedDuringStartup(Exception):
    """The stop signal came while start-up was still waiting (for the model server, the sink):
    nothing was consumed, so the consumer just exits."""


async def unless_stopped(step: Awaitable[T], stop: asyncio.Event) -> T:
    """``await step``, unless ``stop`` is set first: then ``step`` is cancelled and
    :class:`StoppedDuringStartup` raised, so a SIGTERM during a long start-up wait ends the
    process at once instead of after the wait."""
    task = asyncio.ensure_future(step)
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopped), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise StoppedDuringStartup


async def watch_stop(stop: asyncio.Event, watchdog: Watchdog) -> None:
    """Arm ``watchdog`` when ``stop`` is set (run as a task beside the consumer)."""
    await stop.wait()
    watchdog.arm()


def run_bounded(main: Coroutine[Any, Any, None], *, teardown_s: float = TEARDOWN_S) -> None:
    """``asyncio.run(main)``, except that the teardown never waits forever: leftover tasks get
    ``teardown_s`` to finish cancelling, and the default executor is shut down without waiting
    for threads still busy (``asyncio.run`` joins them with no limit, and a thread a library
    leaves stuck then holds a stopped consumer alive). Threads left running are dealt with by
    :func:`exit_past_stuck_threads`."""
    loop = asyncio.new_event_loop()
    executor = ThreadPoolExecutor(thread_name_prefix="rowbatch-executor")
    loop.set_default_executor(executor)
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(main)
    finally:
        try:
            _cancel_leftover_tasks(loop, teardown_s)
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            executor.shutdown(wait=False, cancel_futures=True)
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_leftover_tasks(loop: asyncio.AbstractEventLoop, teardown_s: float) -> None:
    tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    _, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=teardown_s))
    if pending:
        log.warning(
            "%d task(s) ignored cancellation at exit: %s",
            len(pending),
            ", ".join(sorted(task.get_name() for task in pending)),
        )


def exit_past_stuck_threads(
    code: int,
    *,
    wait_s: float = TEARDOWN_S,
    threads: Callable[[], Iterable[threading.Thread]] = threading.enumerate,
    exit_now: Callable[[int], None] = _flush_and_exit,
    clock: Clock = time.monotonic,
) -> int:
    """``code``, once every thread that would hold the interpreter open (alive, not a
    daemon) has ended; if some are still running ``wait_s`` later, log them and exit at once
    with ``code`` instead of waiting for them forever."""
    main = threading.main_thread()
    current = threading.current_thread()
    deadline = clock() + wait_s
    stuck: list[threading.Thread] = []
    for thread in threads():
        if thread in (main, current) or thread.daemon or not thread.is_alive():
            continue
        thread.join(max(0.0, deadline - clock()))
        if thread.is_alive():
            stuck.append(thread)
    if stuck:
        log.warning(
            "exiting without waiting for %d stuck thread(s): %s",
            len(stuck),
            ", ".join(thread.name for thread in stuck),
        )
        exit_now(code)
    return code
