"""The memory budget: bytes held by everything in flight, counting what a held message really
costs (its delivery, payload and attributes, the decoded inputs, the outputs the model will
return for them, and a measured per-message overhead for the objects that keep it: see
:func:`message_cost`), plus what a source has read ahead of the pipeline. When it is full,
intake stops taking messages and the source stops reading ahead."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from numpy.typing import NDArray

MESSAGE_OVERHEAD_BYTES = 1600
"""Measured (tests/unit/consumer/engine/test_memory_accounting.py), charged once per held
message on top of its byte sizes: the ``Delivery`` and its strings, the source's record of it
(Kafka: the ``ConsumerRecord``, its ``_Held``, the unsettled-map and offset-tracker slots), the
ledger ``Entry`` and the batcher's pending entry, and the ``MessageRows`` with its dicts."""
ATTRIBUTE_OVERHEAD_BYTES = 250
"""Per attribute/header, on top of twice its name and value lengths: it is held as bytes
(the broker's record) and as ``str`` (``Delivery.attributes``), each an object and a slot."""
ARRAY_OVERHEAD_BYTES = 170
"""Per numpy array object a message's decoded columns hold (header, shape, strides and the
allocation of its data), counting every array in a view's ``base`` chain."""
FOREIGN_BUFFER_OVERHEAD_BYTES = 900
"""Per column whose array is a zero-copy view of memory numpy does not own (Arrow): the
pyarrow array and buffer objects it keeps alive. Not charged for a view of the payload's own
``bytes`` (Arrow columns read in place, ``rowbatch.wire.codec_arrow``): that keeps only the
payload alive, which is counted already."""


def _array_overhead(values: NDArray[Any]) -> int:
    cost = 0
    base: Any = values
    while isinstance(base, np.ndarray):
        cost += ARRAY_OVERHEAD_BYTES
        base = base.base
    # A view of a bytes object (a payload read in place) keeps nothing but the payload alive.
    return cost if base is None or type(base) is bytes else cost + FOREIGN_BUFFER_OVERHEAD_BYTES


def message_cost(
    payload_bytes: int,
    attributes: Mapping[str, str],
    arrays: Iterable[NDArray[Any]],
    decoded_bytes: int,
    output_bytes: int,
) -> int:
    """What holding one message costs, in bytes: ``payload_bytes`` (the raw payload, held
    until the ack), its ``attributes``, the numpy ``arrays`` of its decoded columns and null
    masks (their objects; their data is ``decoded_bytes``), the ``output_bytes`` the model
    will return for its rows, and ``MESSAGE_OVERHEAD_BYTES``."""
    return held_cost(
        payload_bytes,
        attribute_bytes=attributes_bytes(attributes),
        attribute_count=len(attributes),
        array_overhead=arrays_overhead(arrays),
        decoded_bytes=decoded_bytes,
        output_bytes=output_bytes,
    )


def attributes_bytes(attributes: Mapping[str, str]) -> int:
    """The lengths of the attributes' names and values, summed."""
    return sum(map(len, attributes)) + sum(map(len, attributes.values()))


def arrays_overhead(arrays: Iterable[NDArray[Any]]) -> int:
    """What ``arrays`` cost beyond their data (see ``ARRAY_OVERHEAD_BYTES``)."""
    return sum(map(_array_overhead, arrays))


def held_cost(
    payload_bytes: int,
    *,
    attribute_bytes: int,
    attribute_count: int,
    array_overhead: int,
    decoded_bytes: int,
    output_bytes: int,
) -> int:
    """:func:`message_cost` from its parts, where the caller knows them already (the decoder
    measures a message's attributes for its size check, and knows the arrays' overhead of an
    Arrow layout seen before)."""
    return (
        MESSAGE_OVERHEAD_BYTES
        + payload_bytes
        + 2 * attribute_bytes
        + ATTRIBUTE_OVERHEAD_BYTES * attribute_count
        + array_overhead
        + decoded_bytes
        + output_bytes
    )


class ByteBudget:
    """An async byte semaphore. A single request larger than the whole budget is admitted when
    nothing else is held (so one huge message cannot deadlock the consumer), and is the only
    way ``used`` can exceed ``limit``.

    ``ahead`` is what a source holds read ahead of the pipeline (set by the source, never
    waited for): it takes room from ``acquire`` like ``used`` does. A source reads ahead only
    while there is ``room`` (``watch`` tells it when a release makes some).

    ``aside`` is set aside for what the pipeline itself holds on top of the messages' costs
    (answers being decoded, sink writes' joined batches and encode buffers: see
    :meth:`set_aside`); it takes room like ``used`` does, so ``used + ahead + aside`` stays
    within ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"memory budget must be > 0 bytes, got {limit}")
        self.limit = limit
        self._used = 0
        self._ahead = 0
        self._aside = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._watchers: list[Callable[[], None]] = []

    @property
    def used(self) -> int:
        """Bytes held by messages taken into the pipeline."""
        return self._used

    @property
    def ahead(self) -> int:
        """Bytes a source holds read ahead of the pipeline."""
        return self._ahead

    @property
    def aside(self) -> int:
        """Bytes set aside for the pipeline's own buffers (:meth:`set_aside`)."""
        return self._aside

    @property
    def room(self) -> int:
        """What is left for the pipeline and read-ahead together (negative: overdrawn)."""
        return self.limit - self._used - self._ahead - self._aside

    def fits(self, n: int) -> bool:
        return self._used + self._ahead + self._aside + n <= self.limit or self._used == 0

    def set_aside(self, n: int) -> None:
        """Hold ``n`` bytes back from messages and read-ahead, for buffers the pipeline holds
        on top of what each message is charged (at most half the budget)."""
        if not 0 <= n <= self.limit // 2:
            raise ValueError(f"can set aside 0 to half the budget ({self.limit}), not {n}")
        shrunk = n < self._aside
        self._aside = n
        if shrunk:
            self._wake()

    async def acquire(self, n: int) -> None:
        """Wait until ``n`` bytes fit, then hold them."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative amount ({n} bytes)")
        while not self.fits(n):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        self._used += n

    def take_now(self, n: int) -> None:
        """Hold ``n`` bytes now: ``acquire`` for a caller that has just seen them ``fits``."""
        if n < 0:
            raise ValueError(f"cannot reserve a negative amount ({n} bytes)")
        self._used += n

    async def release(self, n: int) -> None:
        self.release_now(n)

    def release_now(self, n: int) -> None:
        """``release``, synchronously (for callers that must not yield to the event loop)."""
        self._used = max(0, self._used - n)
        self._wake()
        for watcher in self._watchers:
            watcher()

    def set_ahead(self, n: int) -> None:
        """The source now holds ``n`` bytes read ahead (synchronous: called from its buffer
        bookkeeping)."""
        shrunk = n < self._ahead
        self._ahead = max(0, n)
        if shrunk:
            self._wake()

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every release (a source resumes reading ahead)."""
        self._watchers.append(callback)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
