"""The intake gate: open unless some part of the pipeline (inference or the sink) is backing
off; the intake stage waits on it before taking the next delivery."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Gate:
    """Open unless someone is backing off; intake waits on it. Counts nested closers."""

    def __init__(self, on_change: Callable[[bool], None]) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._closers = 0
        self._on_change = on_change

    def close(self) -> None:
        self._closers += 1
        if self._closers == 1:
            self._open.clear()
            self._on_change(False)

    def reopen(self) -> None:
        self._closers = max(0, self._closers - 1)
        if self._closers == 0 and not self._open.is_set():
            self._open.set()
            self._on_change(True)

    async def wait(self) -> None:
        await self._open.wait()

    @property
    def is_open(self) -> bool:
        return self._open.is_set()
