"""Bookkeeping for the unary-pull Pub/Sub source (``pubsub_pull.py``): batched, confirmed
Acknowledge/ModifyAckDeadline calls (``IdBatcher``) and lease timing (``LeaseBook``).

Both take an injected clock (and the batcher an injected sleep) so that their timing is tested
without waiting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from google.api_core import exceptions as gexc

_LOG = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    gexc.Aborted,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.ResourceExhausted,
    gexc.ServiceUnavailable,
    gexc.Unknown,
)
"""gRPC outcomes worth retrying (the service or the network had a moment)."""

EXTEND_AT = 2 / 3
"""A lease is extended once this share of its ack deadline has passed."""


async def sleep_or_event(sleep: Sleep, delay: float, event: asyncio.Event) -> None:
    """Wait until ``delay`` has passed (by ``sleep``) or ``event`` is set, whichever is first."""
    if event.is_set():
        return
    sleeper = asyncio.ensure_future(sleep(delay))
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (sleeper, waiter):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task


class IdBatcher:
    """Collects ack ids and sends them with one call per batch: as soon as ``max_ids`` are
    pending, or once the oldest pending id has waited ``max_delay_s``. Every call is awaited
    (the server's answer confirms it); a call that fails transiently is retried with backoff
    for up to ``retry_s``, then given up with a warning, as is one that fails for good: the
    message then comes back after its ack deadline, which is harmless (result rows are
    idempotent) but logged. Calls are sent one at a time by ``run`` (plus those of
    ``flush``)."""

    def __init__(
        self,
        what: str,
        send: Callable[[list[str]], Awaitable[None]],
        *,
        max_ids: int,
        max_delay_s: float,
        retry_s: float,
        clock: Clock,
        sleep: Sleep,
        on_settled: Callable[[], None] | None = None,
    ) -> None:
        self.what = what
        self._send_call = send
        self._max_ids = max_ids
        self._max_delay_s = max_delay_s
        self._retry_s = retry_s
        self._clock = clock
        self._sleep = sleep
        self._on_settled = on_settled
        self._ids: list[str] = []
        self._first_at = 0.0
        self._sending = 0
        self._has_ids = asyncio.Event()
        self._full = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self.calls = 0
        """Calls the server answered."""
        self.confirmed = 0
        """Ids in those calls."""
        self.given_up = 0
        """Ids whose call failed for good."""

    @property
    def pending(self) -> int:
        """Ids added and not yet answered (queued or in a call)."""
        return len(self._ids) + self._sending

    def add(self, ack_id: str) -> None:
        ids = self._ids
        ids.append(ack_id)
        if len(ids) == 1:
            self._first_at = self._clock()
            self._has_ids.set()
        if len(ids) >= self._max_ids:
            self._full.set()

    def extend(self, ack_ids: Iterable[str]) -> None:
        for ack_id in ack_ids:
            self.add(ack_id)

    async def run(self) -> None:
        """Send batches until cancelled."""
        while True:
            await self._has_ids.wait()
            if len(self._ids) < self._max_ids:
                delay = self._first_at + self._max_delay_s - self._clock()
                if delay > 0:
                    self._full.clear()
                    await sleep_or_event(self._sleep, delay, self._full)
            batch = self._take()
            if batch:
                await self._send(batch)

    async def flush(self) -> None:
        """Send everything pending now and wait until every call is answered (or given up)."""
        while self._ids:
            await self._send(self._take())
        while self._sending:
            self._idle.clear()
            await self._idle.wait()

    def _take(self) -> list[str]:
        batch = self._ids[: self._max_ids]
        del self._ids[: self._max_ids]
        if self._ids:
            self._first_at = self._clock()
            if len(self._ids) < self._max_ids:
                self._full.clear()
        else:
            self._has_ids.clear()
            self._full.clear()
        return batch

    async def _send(self, batch: list[str]) -> None:
        self._sending += len(batch)
        try:
            await self._send_with_retry(batch)
        finally:
            self._sending -= len(batch)
            if not self._sending:
                self._idle.set()
            if self._on_settled is not None:
                self._on_settled()

    async def _send_with_retry(self, batch: list[str]) -> None:
        give_up_at = self._clock() + self._retry_s
        backoff = 0.1
        while True:
            try:
                await self._send_call(batch)
            except TRANSIENT_ERRORS as exc:
                if self._clock() + backoff > give_up_at:
                    self._give_up(batch, exc)
                    return
                _LOG.info("%s of %d message(s) failed (%s); retrying", self.what, len(batch), exc)
                await self._sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except gexc.GoogleAPICallError as exc:
                self._give_up(batch, exc)
                return
            self.calls += 1
            self.confirmed += len(batch)
            return

    def _give_up(self, batch: list[str], exc: Exception) -> None:
        self.given_up += len(batch)
        _LOG.warning(
            "%s of %d message(s) not confirmed (%s: %s): they come back after their ack "
            "deadline, which is harmless (result rows are idempotent)",
            self.what,
            len(batch),
            type(exc).__name__,
            exc,
        )


@dataclass(eq=False)
class Cohort:
    """Messages received by one Pull call: their leases run on the same clock."""

    received_at: float
    """When they arrived (``max_lease_duration_s`` counts from here)."""
    expires_at: float
    """Conservative: when Pub/Sub's ack deadline for them runs out (counted from when the
    call that set it was *sent*)."""
    due_at: float
    """When their next extension is due (``EXTEND_AT`` of the deadline)."""
    ack_ids: set[str] = field(default_factory=set)


class LeaseBook:
    """The ack deadline of every held message, grouped by the Pull call that received them (a
    pull of 1,000 messages is one cohort, so timing work is per call, not per message).

    A cohort is extended by ``extension_s`` once ``EXTEND_AT`` of its current deadline has
    passed, together with every cohort due within ``slack_s`` after it (so extensions go out
    in a few large ModifyAckDeadline calls). A cohort held longer than ``max_duration_s`` is
    dropped instead: no more extensions, Pub/Sub redelivers it when the last one runs out."""

    def __init__(self, *, extension_s: float, max_duration_s: float, slack_s: float) -> None:
        self.extension_s = extension_s
        self.max_duration_s = max_duration_s
        self.slack_s = slack_s
        self._cohorts: set[Cohort] = set()
        self._where: dict[str, Cohort] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, ack_id: object) -> bool:
        return ack_id in self._where

    def add(
        self, ack_ids: Iterable[str], *, received_at: float, started_at: float, deadline_s: float
    ) -> float:
        """Start leases of messages received at ``received_at`` whose ack deadline of
        ``deadline_s`` started (at the earliest) at ``started_at``. Returns when their first
        extension is due."""
        expires_at = started_at + deadline_s
        cohort = Cohort(received_at, expires_at, started_at + deadline_s * EXTEND_AT)
        cohort.ack_ids.update(ack_ids)
        if not cohort.ack_ids:
            return cohort.due_at
        for ack_id in cohort.ack_ids:
            self._where[ack_id] = cohort
        self._cohorts.add(cohort)
        return cohort.due_at

    def remove(self, ack_id: str) -> None:
        """Settled (acked or nacked): no more extensions."""
        cohort = self._where.pop(ack_id, None)
        if cohort is not None:
            cohort.ack_ids.discard(ack_id)
            if not cohort.ack_ids:
                self._cohorts.discard(cohort)

    def next_due(self) -> float | None:
        """When the earliest extension is due; ``None`` when nothing is held."""
        return min((c.due_at for c in self._cohorts), default=None)

    def expires_at(self, ack_id: str) -> float | None:
        cohort = self._where.get(ack_id)
        return None if cohort is None else cohort.expires_at

    def take_due(self, now: float) -> tuple[list[Cohort], list[str]]:
        """Cohorts to extend now (due by ``now + slack_s``), and the ack ids dropped because
        they have been held for ``max_duration_s`` (removed from the book)."""
        if not self._cohorts:
            return [], []
        if min(c.due_at for c in self._cohorts) > now:
            return [], []
        horizon = now + self.slack_s
        extend: list[Cohort] = []
        dropped: list[str] = []
        for cohort in [c for c in self._cohorts if c.due_at <= horizon]:
            if now - cohort.received_at >= self.max_duration_s:
                self._cohorts.discard(cohort)
                for ack_id in cohort.ack_ids:
                    del self._where[ack_id]
                dropped.extend(cohort.ack_ids)
            else:
                extend.append(cohort)
        return extend, dropped

    def extended(self, cohorts: Iterable[Cohort], *, sent_at: float) -> None:
        """The extension sent at ``sent_at`` was confirmed: the new deadline counts from
        then."""
        for cohort in cohorts:
            cohort.expires_at = sent_at + self.extension_s
            cohort.due_at = sent_at + self.extension_s * EXTEND_AT

    def postpone(self, cohorts: Iterable[Cohort], until: float) -> None:
        """The extension failed: try again at ``until``."""
        for cohort in cohorts:
            cohort.due_at = until

    def all_ids(self) -> list[str]:
        return list(self._where)
