"""A clock and a sleep that advances it, for unit tests of pacing and retries: no real time
passes."""

from __future__ import annotations

import asyncio


class VirtualTime:
    """``clock()`` reads ``now``; ``sleep(s)`` records ``s`` in ``slept``, advances ``now`` by it
    and yields to the event loop once."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)
