"""The Pull calls of the unary-pull source and the flow control that sizes them.

``pull_concurrency`` tasks each call Pull for up to ``pull_max_messages`` messages, at most
their share (``max_messages / pull_concurrency``) and only once room for half that share is
free (so a full window refills in a few large pulls, not one per ack). The messages held
(received, not yet acked/nacked, plus those asked for by pulls in flight) stay within
``max_messages``; no pull starts while the bytes held reach ``max_bytes`` (one response may
overshoot by its own size), while more than ``max_messages`` acks/nacks are unconfirmed, or
while the source is paused or closing. Once the pipeline shares its byte budget
(``share``), what is received and not yet yielded (``HeldDeliveries.ahead_bytes``) is held in
it as read-ahead, at most ``READ_AHEAD_SHARE`` of it, and a pull asks for no more messages than
the room left holds at the mean cost seen so far (64 before any was seen). Pull long-polls
when the subscription is empty; an empty answer that comes back at once is followed by a
short growing wait (10..250 ms)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.base import READ_AHEAD_SHARE, SharedBudget
from rowbatch.consumer.sources.pubsub.errors import PubSubPullError
from rowbatch.consumer.sources.pubsub.held import HeldDeliveries
from rowbatch.consumer.sources.pubsub.id_batcher import TRANSIENT_ERRORS
from rowbatch.consumer.sources.pubsub.pull_rpc import PullRpc, ReceivedMessage
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.timing import Backoff, Clock, Sleep

_LOG = logging.getLogger(__name__)

_FAST_EMPTY_S = 0.5
"""An empty answer sooner than this did not long-poll: wait a little before the next Pull."""
_IDLE_WAIT = Backoff(0.01, 0.25, jitter=0.0)
"""The waits after empty answers in a row that came back at once (reset by messages)."""
_BACKOFF = Backoff(0.1, 10.0, jitter=0.0)
"""The waits after a Pull failing transiently (reset by an answer)."""
_FIRST_PULL = 64
"""With a shared budget, the most messages a pull asks for before any cost was seen."""


class PullFlow:
    """Flow control: how many messages the next Pull may ask for (``size``), and the event
    the pull tasks wait on for room (``room``)."""

    def __init__(
        self,
        config: PubSubSettings,
        held: HeldDeliveries,
        unconfirmed: Callable[[], int],
    ) -> None:
        self._config = config
        self._held = held
        self._unconfirmed = unconfirmed
        self.paused = False
        self.closing = False
        self.reserved = 0
        """Messages asked for by pulls in flight."""
        self.room = asyncio.Event()
        """Flow control may have room again (or pause/close changed)."""
        self.budget: SharedBudget | None = None

    def share(self, budget: SharedBudget) -> None:
        """Hold the read-ahead in the pipeline's ``budget``; pullers wake when it frees room."""
        self.budget = budget
        budget.watch(self.room.set)
        self.report()

    def report(self) -> None:
        """Tell the shared budget what the read-ahead costs now (after it changed); a
        smaller read-ahead may make room for a pull."""
        if self.budget is not None:
            self.budget.set_ahead(self._held.ahead_bytes)
            self.room.set()

    def size(self) -> int:
        """How many messages the next Pull asks for; 0: none now. A pull waits until room
        for at least half its share (``max_messages / pull_concurrency``) is free, so that
        a full window refills in a few large pulls rather than one per ack."""
        config = self._config
        if self.paused or self.closing or self._held.bytes >= config.max_bytes:
            return 0
        if self._unconfirmed() >= config.max_messages:
            return 0
        room = config.max_messages - len(self._held) - self.reserved
        share = min(config.pull_max_messages, -(-config.max_messages // config.pull_concurrency))
        budget = self.budget
        if budget is not None:
            limit = int(budget.limit * READ_AHEAD_SHARE)
            free = min(budget.room, limit - self._held.ahead_bytes)
            mean = self._held.mean_cost
            if mean is None:  # nothing received yet: a small pull tells the cost
                room = min(room, _FIRST_PULL if free > 0 else 0)
                share = min(share, _FIRST_PULL)
            else:
                fits = free // mean - self.reserved
                if fits < 1 and free > 0 and not self._held.ahead_bytes and not self.reserved:
                    fits = 1  # messages larger than the share still come, one at a time
                room = min(room, fits)
                share = min(share, max(1, limit // mean // config.pull_concurrency))
        if room < max(1, share // 2):
            return 0
        return min(room, share)


async def pull_loop(
    api: PullRpc,
    flow: PullFlow,
    receive: Callable[[Sequence[ReceivedMessage], float], None],
    *,
    subscription: str,
    host: str,
    clock: Clock,
    sleep: Sleep,
) -> None:
    """One pull task: Pull whenever ``flow`` has room and hand each answer to ``receive``
    (with when the call was sent), until the source closes. Transient failures are retried
    with backoff; ``PubSubPullError`` when Pull fails for good."""
    empties = 0
    failures = 0
    while not flow.closing:
        size = flow.size()
        if size <= 0:
            flow.room.clear()
            await flow.room.wait()
            continue
        flow.reserved += size
        sent_at = clock()
        failed: Exception | None = None
        try:
            received = await api.pull(size)
        except gexc.DeadlineExceeded:
            received = ()
        except TRANSIENT_ERRORS as exc:
            received, failed = (), exc
        except gexc.GoogleAPICallError as exc:
            raise PubSubPullError(f"pull on {subscription} ({host}) failed: {exc}") from exc
        finally:
            flow.reserved -= size
        if failed is not None:
            failures += 1
            backoff = _BACKOFF.wait(failures)
            _LOG.warning("pull on %s failed (%s); retrying in %g s", subscription, failed, backoff)
            await sleep(backoff)
            continue
        failures = 0
        if received:
            empties = 0
            receive(received, sent_at)
        elif clock() - sent_at < _FAST_EMPTY_S:
            empties += 1
            await sleep(_IDLE_WAIT.wait(empties))
