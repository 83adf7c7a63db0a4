"""The concurrency window of one OpenAI-compatible endpoint: how many requests it may have in
flight. A continuous-batching server (vLLM, SGLang) runs as many sequences as it has slots and
queues the rest, so the knob is concurrency, not batch size: too few requests in flight leave
slots empty, too many build a queue that only adds latency (and memory here).

The window starts at the configured size (the server's slots) and moves:

- a 429 or 503 (the server's queue is full) halves it, at most once per ``cooldown_s`` (one
  overload answers many requests at once); then it grows back by one per window's worth of
  answers, up to where it started;
- with the server's metrics (``vllm:num_requests_waiting``...), read every few hundred
  milliseconds by the pool (:class:`rowbatch.consumer.model.openai.client.EndpointPool`), it
  follows the server's queue (see :meth:`Window.server_queue`), up to its ceiling.

No clock of its own: the caller passes ``now`` (tests drive it)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field


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
    limit: int = field(init=False)
    in_use: int = field(default=0, init=False)
    _last_cut: float = field(default=-math.inf, init=False)
    _answers: int = field(default=0, init=False)
    _step: int = field(default=1, init=False)
    _waiting_avg: float | None = field(default=None, init=False)
    _shrunk: bool = field(default=False, init=False)
    slots: int = field(default=0, init=False)
    """The most requests the server was seen running (its slots, once it was seen full)."""

    def __post_init__(self) -> None:
        if not 1 <= self.initial <= self.ceiling:
            raise ValueError(f"need 1 <= initial <= ceiling: {self.initial}, {self.ceiling}")
        self.limit = self.initial
        self.on_change(self.limit)

    @property
    def free(self) -> int:
        return max(0, self.limit - self.in_use)

    def take(self) -> None:
        self.in_use += 1

    def give(self) -> None:
        self.in_use -= 1
        self.on_room()

    def answered(self) -> None:
        """A request succeeded: after an overload, one more place per window's worth."""
        if self.limit >= self.initial:
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
        """What the server's metrics say: ``waiting`` requests queued, ``running`` in slots.

        ``slots`` is the most the server was seen running. Its queue is what waits beyond
        the slots free now: a gauge also counts as waiting the requests that arrived since
        the server's last step, about to take the slots it freed (a cohort that finished
        together is replaced all at once). The window follows the queue's moving average
        (``smoothing``): above ``target_waiting`` plus a half, once the last cut took effect,
        it shrinks by this consumer's share of the excess (several consumers share a server:
        each gives back its part); below it less a half, with every place taken, it grows one
        place a reading, or 1, 2, 4... while nothing is queued and it never had to shrink
        (slow start: a window started far below the slots gets there fast)."""
        self.slots = max(self.slots, int(running))
        # Waiting beyond the slots free now: those about to take free slots at the server's
        # next step are no queue (a cohort of requests that finished together is replaced
        # all at once).
        queued = max(0.0, waiting - max(0.0, self.slots - running))
        avg = self._waiting_avg
        avg = queued if avg is None else avg + self.smoothing * (queued - avg)
        self._waiting_avg = avg
        share_of = min(1.0, self.in_use / max(running + waiting, 1.0))
        if avg > self.target_waiting + 0.5:
            if self.in_use > self.limit:  # the last cut has not taken effect yet
                return
            self._shrunk = True
            self._step = 1
            cut = math.ceil((avg - self.target_waiting) * share_of)
            self._set(max(1, self.limit - cut))
            return
        if (
            avg >= self.target_waiting - 0.5
            or self.in_use < self.limit
            or now - self._last_cut < self.cooldown_s
        ):
            return
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
