"""What the Kafka source does when a rebalance revokes partitions: drop their read-ahead, take
back from the pipeline their records not yet sent to the model, wait ``revoke_grace_s`` for the
ones already sent, commit, forget the partitions.

Taking back (``WithdrawsDeliveries``): the pipeline drops those records at once (out of its
batcher and ledger, budget released, neither acked nor nacked) and the source forgets them
without settling them, so the committed offset stays below them and the partition's next owner
(often this member again: aiokafka's rebalances are eager) reads them again. Only records in an
inference request or being written are waited for, which takes a batch time or two, so a
rebalance neither stalls the group for the whole grace period nor has the same rows inferred
by two members. They are counted in ``rowbatch_kafka_records_withdrawn_total{topic}``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter

from rowbatch.consumer.sources.base import Withdraw
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.consumer.sources.kafka.partitions import Partitions, show_tps
from rowbatch.consumer.sources.kafka.readahead import ReadAhead
from rowbatch.consumer.sources.kafka.records import Held

_LOG = logging.getLogger(__name__)


class Revoker:
    """Runs revokes for one source: ``partitions``, its ``ahead`` buffer and its ``unsettled``
    map (yielded, not yet settled; shared with the source, which it updates), ``commit(tps,
    why)``, and ``closed()``."""

    def __init__(
        self,
        *,
        topic: str,
        grace_s: float,
        registry: CollectorRegistry,
        partitions: Partitions,
        ahead: ReadAhead,
        unsettled: dict[Delivery, Held],
        commit: Callable[[set[TopicPartition], str], Awaitable[None]],
        closed: Callable[[], bool],
    ) -> None:
        self._topic = topic
        self._grace_s = grace_s
        self._partitions = partitions
        self._ahead = ahead
        self._unsettled = unsettled
        self._commit = commit
        self._closed = closed
        self._withdraw: Withdraw | None = None
        self.withdrawn = 0
        """Records taken back from the pipeline at revokes, in all."""
        self._counter = Counter(
            "rowbatch_kafka_records_withdrawn",
            "Records of revoked partitions taken back from the pipeline before they were "
            "sent to the model (their next owner reads them again)",
            ["topic"],
            registry=registry,
        )

    def register(self, withdraw: Withdraw) -> None:
        """The pipeline's ``withdraw`` (see ``WithdrawsDeliveries``)."""
        self._withdraw = withdraw

    async def revoke(self, revoked: set[TopicPartition]) -> None:
        tps = self._partitions.revoking(revoked)
        if not tps:
            return
        try:
            self._ahead.purge(tps)
            self.take_back(tps)
            await self._partitions.drain(tps, self._grace_s, self._closed)
            await self._commit(tps, "revoke")
        finally:
            self._partitions.forget(tps)

    def take_back(self, tps: set[TopicPartition]) -> int:
        """Have the pipeline drop the yielded, unsettled records of ``tps`` it has not sent to
        the model, and forget those; returns how many."""
        if self._withdraw is None:
            return 0
        partitions = self._partitions
        mine = [d for d, h in self._unsettled.items() if h.tp in tps and partitions.is_assigned(h)]
        if not mine:
            return 0
        try:
            dropped = self._withdraw(mine)
        except Exception:  # noqa: BLE001 - the revoke must still wait, commit and forget
            _LOG.exception("revoke: the pipeline failed to withdraw records; waiting for them")
            return 0
        count = 0
        for delivery in dropped:
            held = self._unsettled.pop(delivery, None)
            if held is not None:
                partitions.returned(held)
                count += 1
        if count:
            self.withdrawn += count
            self._counter.labels(self._topic).inc(count)
            _LOG.info(
                "revoke: withdrew %d record(s) of %s not yet sent to the model (%d still in "
                "flight); the next owner reads them again",
                count,
                show_tps(tps),
                len(mine) - count,
            )
        return count


__all__ = ["Revoker"]
