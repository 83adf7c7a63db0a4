"""The concurrency window of one OpenAI-compatible endpoint: how many requests it may have in
flight. A continuous-batching server (vLLM, SGLang) runs as many sequences as it has slots and
queues the rest, so the knob is concurrency, not batch size: too few requests in flight leave
slots empty, too many build a queue that only adds latency (and memory here).

The window starts at the configured size (the server's slots) and moves:

- a 429 or 503 (the server's queue is full) halves it, at most once per ``cooldown_s`` (one
  overload answers many requests at once); then it grows back by one per window's worth of
  answers, up to where it started;
- with the server's metrics (``vllm:num_requests_waiting``...), read every few hundred
  milliseconds by :class:`rowbatch.consumer.model.openai.server_queue.QueueWatch`, it grows by a
  quarter while the server's queue is empty and every place is taken (slots are free), and
  shrinks by this window's share of the requests waiting beyond ``target_waiting`` (several
  consumers share a server: each gives back its part), up to its ceiling.

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
    """Requests the server may keep waiting: one refills a slot the moment it frees."""
    on_change: Callable[[int], None] = lambda _: None
    """Called with the new limit (the window gauge)."""
    on_room: Callable[[], None] = lambda: None
    """Called when a place frees or the limit grows (waiting requests look again)."""
    limit: int = field(init=False)
    in_use: int = field(default=0, init=False)
    _last_cut: float = field(default=-math.inf, init=False)
    _answers: int = field(default=0, init=False)

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
        self._set(max(1, self.limit // 2))

    def server_queue(self, waiting: float, running: float, now: float) -> None:
        """What the server's metrics say: ``waiting`` requests queued, ``running`` in slots."""
        excess = waiting - self.target_waiting
        if excess > 0:
            load = max(running + waiting, 1.0)
            share = math.ceil(excess * min(1.0, self.in_use / load))
            if share > 0:
                self._set(max(1, self.limit - share))
            return
        if waiting <= 0 and self.in_use >= self.limit and now - self._last_cut >= self.cooldown_s:
            self._set(min(self.ceiling, self.limit + max(1, self.limit // 4)))

    def _set(self, limit: int) -> None:
        if limit != self.limit:
            grew = limit > self.limit
            self.limit = limit
            self.on_change(limit)
            if grew:
                self.on_room()
