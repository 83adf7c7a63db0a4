"""Batched, confirmed Acknowledge and ModifyAckDeadline(0) calls of the unary-pull source
(``IdBatcher``; the pair a source uses: ``AckNackBatches``).

Acks and nacks are settled locally at once (flow control frees the room) and sent in
batches: one Acknowledge (or ModifyAckDeadline 0 for nacks) per ``ack_max_ids`` ids or
``ack_delay_s`` after the first, whichever comes first. Each call is awaited; transient
failures are retried for up to ``rpc_retry_s``, then given up and logged (the message comes
back after its ack deadline: the sink is idempotent). The clock and the sleep are injected so
that the timing is tested without waiting."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.pubsub.pull_rpc import PullRpc
from rowbatch.consumer.sources.pubsub.tasks import sleep_or_event
from rowbatch.timing import Backoff, Clock, Sleep

_LOG = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    gexc.Aborted,
    gexc.DeadlineExceeded,
    gexc.InternalServerError,
    gexc.ResourceExhausted,
    gexc.ServiceUnavailable,
    gexc.Unknown,
)
"""gRPC outcomes worth retrying (the service or the network had a moment)."""
_RETRY_BACKOFF = Backoff(0.1, 2.0, jitter=0.0)
"""The waits between tries of a call failing transiently."""


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
        failures = 0
        while True:
            try:
                await self._send_call(batch)
            except TRANSIENT_ERRORS as exc:
                failures += 1
                backoff = _RETRY_BACKOFF.wait(failures)
                if self._clock() + backoff > give_up_at:
                    self._give_up(batch, exc)
                    return
                _LOG.info("%s of %d message(s) failed (%s); retrying", self.what, len(batch), exc)
                await self._sleep(backoff)
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


class AckNackBatches:
    """A source's acks (Acknowledge) and nacks (ModifyAckDeadline 0), each batched by an
    ``IdBatcher``; calls go through the ``PullRpc`` that ``api`` returns when they are sent.
    ``on_settled`` is called whenever a call was answered or given up."""

    def __init__(
        self,
        api: Callable[[], PullRpc],
        *,
        max_ids: int,
        max_delay_s: float,
        retry_s: float,
        clock: Clock,
        sleep: Sleep,
        on_settled: Callable[[], None],
    ) -> None:
        self._api = api

        def batcher(what: str, send: Callable[[list[str]], Awaitable[None]]) -> IdBatcher:
            return IdBatcher(
                what,
                send,
                max_ids=max_ids,
                max_delay_s=max_delay_s,
                retry_s=retry_s,
                clock=clock,
                sleep=sleep,
                on_settled=on_settled,
            )

        self.acks = batcher("ack", self._send_acks)
        self.nacks = batcher("nack", self._send_nacks)

    @property
    def pending(self) -> int:
        """Acks and nacks not yet answered by the server."""
        return self.acks.pending + self.nacks.pending

    async def flush(self) -> None:
        """Send pending acks and nacks now and wait for the answers."""
        await asyncio.gather(self.acks.flush(), self.nacks.flush())

    async def _send_acks(self, ack_ids: list[str]) -> None:
        await self._api().acknowledge(ack_ids)

    async def _send_nacks(self, ack_ids: list[str]) -> None:
        await self._api().modify_ack_deadline(ack_ids, 0)
