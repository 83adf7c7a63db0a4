"""The Kafka source's lag report: every ``lag_interval_s``, the log end offsets and the group's
committed offsets of *all* partitions of the topic, exported as the gauges of
``consumer/observe/lag.py`` (lag, backlog rows, throughput, desired replicas)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry

from consumer.observe.lag import LagGauges, ThroughputMeter, desired_replicas, partition_lag
from consumer.sources.kafka.config import KafkaSourceConfig

_LOG = logging.getLogger(__name__)


class LagMonitor:
    """Measures the topic's lag into the gauges of ``registry``.

    ``rows_per_record()``: the mean rows per record seen (to turn records into rows);
    ``busy()``: whether the source holds work (the throughput is measured while it does)."""

    def __init__(
        self,
        config: KafkaSourceConfig,
        registry: CollectorRegistry,
        *,
        rows_per_record: Callable[[], float],
        busy: Callable[[], bool],
    ) -> None:
        self._config = config
        self._gauges = LagGauges(registry)
        self._meter = ThroughputMeter()
        self._rows_per_record = rows_per_record
        self._busy = busy

    def done(self, rows: int) -> None:
        """``rows`` were settled (for the measured throughput)."""
        self._meter.done(rows)

    async def refresh(self, consumer: Any) -> dict[int, int]:
        """Read end offsets and the group's committed offsets of every partition of the
        topic through the started ``consumer``, update the gauges, and return the lag per
        partition."""
        config = self._config
        partitions = consumer.partitions_for_topic(config.topic) or set()
        tps = [TopicPartition(config.topic, p) for p in sorted(partitions)]
        if not tps:
            return {}
        end = await consumer.end_offsets(tps)
        committed = await asyncio.gather(*(consumer.committed(tp) for tp in tps))
        done = {tp.partition: c for tp, c in zip(tps, committed, strict=True)}
        start: dict[int, int] | None = None
        if config.auto_offset_reset == "earliest":
            unknown = [tp for tp in tps if done[tp.partition] is None]
            begin = await consumer.beginning_offsets(unknown) if unknown else {}
            start = {tp.partition: off for tp, off in begin.items()}
        lags = partition_lag({tp.partition: off for tp, off in end.items()}, done, start)
        backlog_rows = sum(lags.values()) * self._rows_per_record()
        measured = self._meter.sample(time.monotonic(), self._busy())
        rate = config.rows_per_s_per_replica or measured
        desired = (
            desired_replicas(backlog_rows, config.target_latency_s, rate, len(tps))
            if rate
            else None
        )
        self._gauges.update(config.topic, lags, backlog_rows, rate, desired)
        return lags

    async def run(self, refresh: Callable[[], Awaitable[object]]) -> None:
        """Call ``refresh()`` every ``lag_interval_s``, forever; failures are logged."""
        while True:
            try:
                async with asyncio.timeout(max(self._config.lag_interval_s, 5.0)):
                    await refresh()
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.debug("could not measure Kafka lag: %r", exc)
            except Exception:  # noqa: BLE001 - lag is informative; consuming goes on
                _LOG.warning("measuring Kafka lag failed", exc_info=True)
            await asyncio.sleep(self._config.lag_interval_s)


__all__ = ["LagMonitor"]
