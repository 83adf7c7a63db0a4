"""The concurrency window of one model-server endpoint: how many requests this consumer may
have in flight there. A server runs as many requests as it has slots (a continuous-batching
LLM server's sequences; a Triton model's instances times what its dynamic batcher merges) and
queues the rest: too few requests in flight leave slots empty, too many build a queue that
only adds latency there (and memory here), and with several consumers on one server, the
queue grows with every consumer added.

The window starts at the configured size and moves:

- a 429 / 503 / RESOURCE_EXHAUSTED (the server's queue is full) halves it, at most once per
  ``cooldown_s`` (one overload answers many requests at once); then it grows back by one per
  window's worth of answers, up to where it started;
- with a reading of the server's own queue, every few hundred milliseconds, it follows that
  queue (:meth:`Window.follow`): shrinks by this consumer's share of the excess over the
  target, grows one place a reading while the queue is below it and every place was taken,
  up to its ceiling. The readings come from vLLM's, SGLang's or llama.cpp's gauges
  (:meth:`Window.server_queue`, :mod:`rowbatch.consumer.model.openai.client`) or from
  Triton's statistics (:mod:`rowbatch.consumer.model.admission`).

Several consumers that share a server each see the same queue and each gives back its share
of the excess, so the sum of their windows settles at the server's slots plus the target
without a coordinator; one that joins takes places as the queue allows, one that leaves frees
its places to the others' growth.

No clock of its own: the caller passes ``now`` (tests drive it)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

BAND = 0.25
"""The window holds while the queue's average is within this share of the target (at least
half a request) around it: several consumers each moving one place at a time would otherwise
step over a narrow band and back for ever."""


@dataclass
class Window:
    """One endpoint's window: ``limit`` requests may be in flight, ``in_use`` are."""

    initial: int
    ceiling: int
    cooldown_s: float = 1.0
    target_waiting: float = 1.0
    """Requests the server's gauge may show waiting, on average: what arrived since its last
    step, about to fill the slots that step freed (the window holds while the average is
    within a half of it)."""
    smoothing: float = 0.3
    """Weight of each reading in the moving average of the server's queue."""
    on_change: Callable[[int], None] = lambda _: None
    """Called with the new limit (the window gauge)."""
    on_room: Callable[[], None] = lambda: None
    """Called when a place frees or the limit grows (waiting requests look again)."""
    rng: random.Random = field(default_factory=random.Random)
    """Rounds this consumer's share of a step (tests seed it)."""
    limit: int = field(init=False)
    in_use: int = field(default=0, init=False)
    _last_cut: float = field(default=-math.inf, init=False)
    _answers: int = field(default=0, init=False)
    _step: int = field(default=1, init=False)
    _waiting_avg: float | None = field(default=None, init=False)
    _shrunk: bool = field(default=False, init=False)
    _peak: int = field(default=0, init=False)
    """The most requests in flight since the last reading."""
    _target: float = field(default=0.0, init=False)
    slots: int = field(default=0, init=False)
    """The most requests the server was seen running (its slots, once it was seen full)."""

    def __post_init__(self) -> None:
        if not 1 <= self.initial <= self.ceiling:
            raise ValueError(f"need 1 <= initial <= ceiling: {self.initial}, {self.ceiling}")
        self.limit = self.initial
        self.on_change(self.limit)

    def reset(self, limit: int) -> None:
        """Start again at ``limit`` (initial and ceiling: a limit that is also the most the
        window may grow to), as if new; requests in flight stay counted."""
        if limit < 1:
            raise ValueError(f"need a limit of at least 1: {limit}")
        self.initial = self.ceiling = limit
        self._answers, self._step, self._shrunk = 0, 1, False
        self._waiting_avg = None
        self._set(limit)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.in_use)

    def take(self) -> None:
        self.in_use += 1
        self._peak = max(self._peak, self.in_use)

    @property
    def queue(self) -> float | None:
        """The moving average of the server's queue (None before the first reading)."""
        return self._waiting_avg

    @property
    def saturated(self) -> bool:
        """The server's queue stood at its target or above at the last readings: requests
        sent there would wait (the server, not this consumer, is what limits the flow)."""
        avg = self._waiting_avg
        return avg is not None and avg >= max(self._target - max(0.5, BAND * self._target), 0.5)

    def give(self) -> None:
        self.in_use -= 1
        self.on_room()

    def answered(self) -> None:
        """A request succeeded: after an overload, one more place per window's worth; not
        once the server's queue is read (the readings move the window then: growing back on
        answers would undo every cut the queue called for)."""
        if self.limit >= self.initial or self._waiting_avg is not None:
            return
        self._answers += 1
        if self._answers >= self.limit:
            self._answers = 0
            self._set(self.limit + 1)

    def overloaded(self, now: float) -> None:
        """The server answered 429/503: halve (once per ``cooldown_s``)."""
        if now - self._last_cut < self.cooldown_s:
            return
        self._last_cut = now
        self._answers = 0
        self._step = 1
        self._shrunk = True
        self._set(max(1, self.limit // 2))

    def server_queue(self, waiting: float, running: float, now: float) -> None:
        """What a server's gauges say: ``waiting`` requests queued, ``running`` in slots.

        ``slots`` is the most the server was seen running. Its queue is what waits beyond
        the slots free now: a gauge also counts as waiting the requests that arrived since
        the server's last step, about to take the slots it freed (a cohort that finished
        together is replaced all at once). Then :meth:`follow`, toward ``target_waiting``."""
        self.slots = max(self.slots, int(running))
        queued = max(0.0, waiting - max(0.0, self.slots - running))
        share_of = min(1.0, self.in_use / max(running + waiting, 1.0))
        self.follow(queued, share_of, now, self.target_waiting)

    def follow(self, queued: float, share_of: float, now: float, target: float) -> None:
        """One reading of the server's queue: ``queued`` requests waiting there (on average
        since the last reading, or now), this consumer's share of the server's requests
        (``share_of``, 0..1) and the queue aimed at (``target`` requests).

        The window follows the queue's moving average (``smoothing``): above ``target`` plus
        the band (:data:`BAND`), now and on average, once the last cut took effect, it
        shrinks by this consumer's share of the excess (several consumers share a server:
        each gives back its part); below it less the band, with every place taken since the
        last reading, it grows one place a reading, or
        1, 2, 4... while nothing is queued and it never had to shrink (slow start: a window
        started far below the slots gets there fast)."""
        peak, self._peak = max(self._peak, self.in_use), self.in_use
        self._target = target
        band = max(0.5, BAND * target)
        avg = self._waiting_avg
        avg = queued if avg is None else avg + self.smoothing * (queued - avg)
        self._waiting_avg = avg
        over = min(avg, queued)  # a cut that took effect shows at once; the average lags
        share_of = min(1.0, max(0.0, share_of))
        if over > target + band:
            # The last cut has not taken effect yet (requests over the limit still out), or
            # may not show in the readings yet (a server counts a request's queue time once
            # it ran): cutting again would count the same excess twice.
            if self.in_use > self.limit or now - self._last_cut < self.cooldown_s:
                return
            # This consumer's share of the excess, rounded at random (up with the odds of
            # its fraction): the fleet gives back the excess on average, and consumers that
            # read the same queue at once do not all step together.
            share = (over - target) * share_of
            cut = math.floor(share) + (self.rng.random() < share - math.floor(share))
            if cut:
                self._shrunk = True
                self._step = 1
                self._last_cut = now  # what the cut did shows only in later readings
                self._set(max(1, self.limit - cut))
            return
        if avg >= target - band or peak < self.limit or now - self._last_cut < self.cooldown_s:
            return
        if share_of < 1.0 and self.rng.random() >= share_of:
            return  # each consumer grows with the odds of its share: the fleet by about one
        if queued < 1 and not self._shrunk:
            self._set(min(self.ceiling, self.limit + self._step))
            self._step = min(2 * self._step, max(1, self.limit // 4))
        else:
            self._set(min(self.ceiling, self.limit + 1))

    def _set(self, limit: int) -> None:
        if limit != self.limit:
            grew = limit > self.limit
            self.limit = limit
            self.on_change(limit)
            if grew:
                self.on_room()
