"""Lease keeping of the unary-pull source: the ack deadline of every held message
(``LeaseBook``) and the task that extends those due (``LeaseKeeper``).

A pulled message's ack deadline is the subscription's (``ack_deadline_seconds``, read by
``check()``; 10 s, the minimum, if it was not called), counted conservatively from when the
Pull was sent (or 2 s before the answer arrived, if the Pull waited longer for messages). At
2/3 of it, one ModifyAckDeadline per 1,000 ids extends every held message due within the next
``extension/6`` s to ``lease_extension_s``, again at 2/3, and so on for up to
``max_lease_duration_s`` from receipt; after that the lease is dropped (Pub/Sub redelivers). A
failed extension is retried a second later. Messages settled within 2/3 of the subscription's
deadline cost no extension at all."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.pubsub.settings import RPC_CHUNK
from rowbatch.consumer.sources.pubsub.tasks import sleep_or_event
from rowbatch.timing import Clock, Sleep

_LOG = logging.getLogger(__name__)

EXTEND_AT = 2 / 3
"""A lease is extended once this share of its ack deadline has passed."""
MIN_ACK_DEADLINE_S = 10.0
"""Pub/Sub's smallest subscription ack deadline: assumed when ``check()`` did not read it."""
_EXTENSION_RETRY_S = 1.0
_MAX_TRANSIT_S = 2.0
"""Longest a Pull's response is assumed to spend on the way (its deadline runs meanwhile)."""


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


class LeaseKeeper:
    """Keeps the leases of the messages a source holds: ``add`` starts those of one Pull's
    messages, ``remove`` ends one (settled), ``run`` (a task) extends every lease when it is
    due through ``modify_ack_deadline``."""

    def __init__(
        self,
        modify_ack_deadline: Callable[[list[str], int], Awaitable[None]],
        *,
        subscription: str,
        extension_s: float,
        max_duration_s: float,
        clock: Clock,
        sleep: Sleep,
    ) -> None:
        self._modify_ack_deadline = modify_ack_deadline
        self._sub = subscription
        self._extension_s = extension_s
        self._max_duration_s = max_duration_s
        self._clock = clock
        self._sleep = sleep
        self._book = LeaseBook(
            extension_s=extension_s, max_duration_s=max_duration_s, slack_s=extension_s / 6
        )
        self.receipt_deadline_s = MIN_ACK_DEADLINE_S
        """The subscription's ack deadline: what a Pull's messages get on receipt."""
        self._changed = asyncio.Event()
        self._plan: float | None = None
        """When ``run`` plans to extend next (``None``: nothing held)."""
        self.extension_calls = 0
        """ModifyAckDeadline calls that extended leases (for tests and the bench)."""

    def __len__(self) -> int:
        return len(self._book)

    def add(self, ack_ids: Iterable[str], *, received_at: float, sent_at: float) -> None:
        """Leases of messages received at ``received_at`` by a Pull sent at ``sent_at``."""
        # The deadline started when the server sent the response: after the Pull was sent,
        # and (for a long poll that waited for messages) long after; a response is assumed
        # to spend at most _MAX_TRANSIT_S on the way.
        started_at = max(sent_at, received_at - _MAX_TRANSIT_S)
        due = self._book.add(
            ack_ids,
            received_at=received_at,
            started_at=started_at,
            deadline_s=self.receipt_deadline_s,
        )
        if self._plan is None or due < self._plan:
            self._changed.set()

    def remove(self, ack_id: str) -> None:
        """Settled: no more extensions."""
        self._book.remove(ack_id)

    def clear(self) -> None:
        """Every message was given back (close): no more extensions for any."""
        for ack_id in self._book.all_ids():
            self._book.remove(ack_id)

    async def run(self) -> None:
        """Extend leases as they fall due, until cancelled."""
        while True:
            self._changed.clear()
            due = self._book.next_due()
            self._plan = due
            if due is None:
                await self._changed.wait()
                continue
            delay = due - self._clock()
            if delay > 0:
                await sleep_or_event(self._sleep, delay, self._changed)
                continue
            await self.extend_due()

    async def extend_due(self) -> int:
        """Extend every lease that is due; returns how many ack ids were extended. Messages
        held past ``max_duration_s`` are dropped instead."""
        now = self._clock()
        cohorts, dropped = self._book.take_due(now)
        if dropped:
            _LOG.warning(
                "%d message(s) on %s held past max_lease_duration_s=%g: their leases are no "
                "longer extended and Pub/Sub redelivers them",
                len(dropped),
                self._sub,
                self._max_duration_s,
            )
        if not cohorts:
            return 0
        ids = [ack_id for cohort in cohorts for ack_id in cohort.ack_ids]
        late = now - min(c.expires_at for c in cohorts)
        if late > 0:
            _LOG.warning(
                "lease extension on %s is %.1f s late: redelivery possible", self._sub, late
            )
        seconds = math.ceil(self._extension_s)
        try:
            for start in range(0, len(ids), RPC_CHUNK):
                await self._modify_ack_deadline(ids[start : start + RPC_CHUNK], seconds)
        except gexc.GoogleAPICallError as exc:
            _LOG.warning(
                "extending the leases of %d message(s) on %s failed (%s); retrying in %g s",
                len(ids),
                self._sub,
                exc,
                _EXTENSION_RETRY_S,
            )
            self._book.postpone(cohorts, now + _EXTENSION_RETRY_S)
            return 0
        self.extension_calls += 1
        self._book.extended(cohorts, sent_at=now)
        return len(ids)
