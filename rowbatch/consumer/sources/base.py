"""The ``Source`` seam: a broker adapter yields ``Delivery`` values and settles each one exactly
once, by ``ack``, ``nack`` or ``dead_letter``. The values themselves (``Delivery``,
``DeadLetterReason``) are in :mod:`rowbatch.consumer.sources.delivery`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Protocol, Self, runtime_checkable

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery

__all__ = [
    "VECTOR_MAX",
    "AcksVectors",
    "BoundsReadAhead",
    "DeadLetterFailed",
    "DeliversVectors",
    "DeliveryIterator",
    "KeepsRowProgress",
    "SharedBudget",
    "SharesBudget",
    "Source",
    "SourceConfigError",
    "SourceError",
    "SourceUnreachable",
    "VectorIterator",
    "Withdraw",
    "WithdrawsDeliveries",
    "WorkBound",
    "WrittenRows",
    "package_version",
]


def package_version() -> str:
    """rowbatch's installed version, written into dead-letter records."""
    try:
        return metadata.version("rowbatch")
    except metadata.PackageNotFoundError:
        return "unknown"


class SourceError(Exception):
    """Base class for errors a source raises."""


class SourceConfigError(SourceError, ValueError):
    """The configuration, or the subscription/topic it names, cannot work."""


class SourceUnreachable(SourceError):
    """The broker did not answer (or refused the connection/authentication)."""


class DeadLetterFailed(SourceError):
    """The dead-letter publish was not confirmed; the delivery is still unsettled and the
    caller should nack it."""


class DeliveryIterator:
    """What a source's ``deliveries()`` returns: each ``__anext__`` awaits ``next_delivery``
    (which raises ``StopAsyncIteration`` once the source is closed)."""

    def __init__(self, next_delivery: Callable[[], Awaitable[Delivery]]) -> None:
        self._next = next_delivery

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Delivery:
        return await self._next()


class Source(Protocol):
    """A broker adapter. ``deliveries`` yields messages until ``close``; every delivery must be
    settled by exactly one of ``ack``, ``nack`` or ``dead_letter``."""

    async def check(self) -> None:
        """Start-up check: the broker answers, the subscription/topic and the dead-letter
        topic exist. Raises an error naming what is missing."""

    def deliveries(self) -> AsyncIterator[Delivery]: ...

    async def ack(self, delivery: Delivery) -> None:
        """Done: every row is durably written (or the message was dead-lettered)."""

    async def nack(self, delivery: Delivery) -> None:
        """Give it back for redelivery (shutdown before it finished, or a failed dead-letter)."""

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        """Publish the original payload and attributes plus the reason to the dead-letter
        topic, wait for the broker's confirmation, then ack. Raises if the publish failed
        (the caller then nacks)."""

    def pause(self) -> None:
        """Stop fetching new messages (held ones stay leased)."""

    def resume(self) -> None: ...

    async def close(self) -> None:
        """Stop fetching and release the broker connection; unsettled deliveries are nacked."""


VECTOR_MAX = 512
"""The most deliveries one vector holds (see :class:`DeliversVectors`)."""


@runtime_checkable
class DeliversVectors(Protocol):
    """Optional part of :class:`Source`: a source that receives messages in runs (a Kafka
    fetch, a Pub/Sub Pull response) yields them as vectors, lists of at most ``VECTOR_MAX``
    deliveries taken together, so the pipeline pays its per-message glue (awaits, metric
    updates, budget and flow bookkeeping) once per run. The pipeline then reads ``vectors()``
    instead of ``deliveries()``; each delivery in a vector is settled on its own as usual."""

    def vectors(self) -> AsyncIterator[Sequence[Delivery]]: ...


@runtime_checkable
class SaturatesItself(Protocol):
    """Optional part of :class:`Source`: a source that bounds what it hands out by itself (a
    share group's members each hold one poll until it is acknowledged) can be the limit of a
    replica's rate without work ever waiting for room in the pipeline. ``at_capacity()``: it
    hands out all it can now (every member holds records), so the replica's rate is its
    capacity, as when the pipeline is full (the scaling signal's measured
    ``rows_per_s_per_replica``)."""

    def at_capacity(self) -> bool: ...


@runtime_checkable
class AcksVectors(Protocol):
    """Optional part of :class:`Source`: ``ack`` of many deliveries at once (the messages of
    one sink write), with the bookkeeping done once."""

    async def ack_many(self, deliveries: Sequence[Delivery]) -> None: ...


WrittenRows = tuple[Delivery, int, int]
"""Rows ``[start, stop)`` of a delivery's message (indexes inside the message), durably
written."""


@runtime_checkable
class DeadLettersRows(Protocol):
    """Optional part of :class:`Source`: dead-letter some rows of a delivery without settling
    it. ``dead_letter_rows`` publishes ``payload``/``attributes`` (a row part of the delivery's
    chunk: ``rowbatch.wire.chunks.row_parts``) with ``reason`` to the dead-letter topic as the
    delivery's dead letter would be published, waits for the broker's confirmation and leaves
    the delivery unsettled (the engine acks it once its other rows are written); raises
    :class:`DeadLetterFailed` when the publish is not confirmed. ``dead_letters_rows`` is False
    where the source has nowhere to publish them (the engine then dead-letters the whole
    message as before)."""

    @property
    def dead_letters_rows(self) -> bool: ...

    async def dead_letter_rows(
        self,
        delivery: Delivery,
        payload: bytes,
        attributes: Mapping[str, str],
        reason: DeadLetterReason,
    ) -> None: ...


@runtime_checkable
class KeepsRowProgress(Protocol):
    """Optional part of :class:`Source`, for a source that keeps its own progress per row (the
    table mode), so a restart redoes only rows not yet written:

    - ``rows_written`` is told, after each sink write (after the commit, for a sink that
      stages its writes), which rows of which messages it made durable, whole messages or
      not, before any of them is acked;
    - a dead letter of a message of several rows goes round again as parts with the same
      keys (``Delivery.row_offset``) until each bad row stands alone, so the engine deletes
      none of a dead-lettered message's written rows: they are good rows, and keyed as the
      parts will write them again."""

    async def rows_written(self, written: Sequence[WrittenRows]) -> None: ...


class VectorIterator:
    """What a source's ``vectors()`` returns: each ``__anext__`` awaits ``next_vector``
    (which raises ``StopAsyncIteration`` once the source is closed)."""

    def __init__(self, next_vector: Callable[[], Awaitable[Sequence[Delivery]]]) -> None:
        self._next = next_vector

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Sequence[Delivery]:
        return await self._next()


READ_AHEAD_SHARE = 0.25
"""The most of a shared budget a source's read-ahead may hold; the pipeline keeps the rest."""


class SharedBudget(Protocol):
    """The pipeline's byte budget as a source that reads ahead sees it
    (:class:`rowbatch.consumer.engine.budget.ByteBudget` is one)."""

    limit: int

    @property
    def room(self) -> int:
        """Bytes neither in use nor held as read-ahead."""
        ...

    def set_ahead(self, n: int) -> None:
        """Hold ``n`` bytes of read-ahead in the budget (replacing the previous figure)."""
        ...

    def watch(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever room is freed."""
        ...


@runtime_checkable
class SharesBudget(Protocol):
    """Optional part of :class:`Source`: a source that reads ahead (Kafka) holds what it has
    fetched but not yet yielded in the pipeline's budget, so memory stays inside one limit."""

    def share_budget(self, budget: SharedBudget) -> None: ...


@dataclass(frozen=True)
class WorkBound:
    """How much work the pipeline keeps queued ahead of the model server: ``rows`` (a small
    multiple of ``batch_rows`` x ``in_flight``). A source that reads ahead holds no more than
    this either, so what is in hand when it loses its messages (a Kafka rebalance) is a batch
    or two, not the backlog."""

    batch_rows: int
    """The model's target batch size."""
    in_flight: int
    """Inference requests the pipeline keeps at the server at once."""
    rows: int


@runtime_checkable
class BoundsReadAhead(Protocol):
    """Optional part of :class:`Source`: a source that reads ahead (Kafka) bounds what it has
    fetched and not yet yielded by rows of work (``bound.rows``) as well as by records and
    bytes (called by the pipeline when it starts)."""

    def bound_read_ahead(self, bound: WorkBound) -> None: ...


Withdraw = Callable[[Sequence[Delivery]], Collection[Delivery]]
"""The pipeline's side of :class:`WithdrawsDeliveries`: given deliveries the source takes
back, drop those none of whose rows has been sent to the model yet (out of the batcher and the
ledger, their budget released, neither acked nor nacked) and return them; the others finish as
usual."""


@runtime_checkable
class WithdrawsDeliveries(Protocol):
    """Optional part of :class:`Source`: a source whose deliveries can lose their owner before
    they are settled (a Kafka partition revoked in a rebalance) takes back, at once, those the
    pipeline has not yet sent to the model: it calls ``withdraw`` with them and forgets the
    ones returned (their next owner reads them again), so no row is inferred twice."""

    def on_withdraw(self, withdraw: Withdraw) -> None:
        """Register the pipeline's ``withdraw`` (called by the pipeline when it starts)."""
        ...
