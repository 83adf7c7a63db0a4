"""The Kafka source's lag report: every ``lag_interval_s``, the log end offsets and the group's
committed offsets of *all* partitions of the topic, exported as the gauges of
``rowbatch/consumer/observe/lag.py`` (lag, backlog rows), and handed to the scaling signal
(``rowbatch/consumer/observe/scaling.py``) as the group's backlog and write rate (the committed
offsets' progress): the fleet's ``rowbatch_desired_replicas``."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from rowbatch.consumer.observe.lag import LagGauges, partition_lag
from rowbatch.consumer.observe.read_staleness import ReadStaleness
from rowbatch.consumer.observe.scaling import ScalingGauges, ScalingSignal, SignalSettings, Window
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.timing import Clock, Sleep

_LOG = logging.getLogger(__name__)


def standalone_signal(config: KafkaSettings, registry: CollectorRegistry) -> ScalingSignal:
    """A scaling signal of the source's own, with its gauges in ``registry``, for a source
    used without the consumer's pipeline (which otherwise shares one with it)."""
    settings = SignalSettings("fleet", config.target_latency_s, config)
    return ScalingSignal(settings, ScalingGauges(registry))


class LagMonitor:
    """Measures the topic's lag into the gauges of ``registry`` and the figure of ``signal``.

    ``rows_per_record()``: the mean rows per record seen (to turn records into rows)."""

    def __init__(
        self,
        config: KafkaSettings,
        registry: CollectorRegistry,
        *,
        rows_per_record: Callable[[], float],
        signal: ScalingSignal,
        clock: Clock = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._config = config
        self._wall = wall
        self._sleep = sleep
        self._gauges = LagGauges(registry)
        self._health = ReadStaleness(
            f"the Kafka lag of {config.topic}",
            self.stale_after_s,
            withdrawn="the scaling figures",
            log=_LOG,
        )
        self._rows_per_record = rows_per_record
        self.signal = signal
        self._clock = clock
        self._committed: dict[int, int] = {}
        self._done_records = 0.0
        """Records the group committed since this monitor started (its progress)."""
        self._done = Window(signal.settings.rate_window_s)

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
        rows_per_record = self._rows_per_record()
        backlog_rows = sum(lags.values()) * rows_per_record
        mine = {tp.partition for tp in consumer.assignment() if tp.topic == config.topic}
        self.signal.fleet(
            backlog_rows,
            self._group_rows_per_s(done) * rows_per_record,
            partitions=len(tps),
            own_backlog_rows=sum(lags.get(p, 0) for p in mine) * rows_per_record,
        )
        self._gauges.update(config.topic, lags, backlog_rows, now=self._wall())
        return lags

    @property
    def stale_after_s(self) -> float:
        """How long reads may fail before the figures are withdrawn: three intervals, at
        least 30 s (a broker restart or one slow read does not blank the signal)."""
        return max(3 * self._config.lag_interval_s, 30.0)

    async def read_once(self, refresh: Callable[[], Awaitable[object]]) -> bool:
        """One ``refresh()``, bounded in time; a failure is counted and logged (a warning at
        once and then at most once a minute, saying for how long the signal has been stale),
        and past ``stale_after_s`` the scaling figures become NaN until a read succeeds (said
        in a warning too).
        Returns whether it succeeded."""
        now = self._clock()
        try:
            async with asyncio.timeout(max(self._config.lag_interval_s, 5.0)):
                await refresh()
        except Exception as exc:  # noqa: BLE001 - lag is informative; consuming goes on
            self._failed(now, exc)
            return False
        self._health.succeeded(now)
        return True

    @property
    def stale(self) -> bool:
        """No successful read for ``stale_after_s``: the scaling figures are NaN."""
        return self._health.stale

    def _failed(self, now: float, exc: BaseException) -> None:
        self._gauges.read_failures.labels(self._config.topic).inc()
        if self._health.failed(now, exc):
            self.signal.unknown()

    def _group_rows_per_s(self, committed: dict[int, int | None]) -> float:
        """Records/s the group committed over the rate window (every member's writes)."""
        for partition, offset in committed.items():
            if offset is None:
                continue
            before = self._committed.get(partition)
            if before is not None and offset > before:
                self._done_records += offset - before
            self._committed[partition] = offset
        self._done.add(self._clock(), (self._done_records,))
        seconds, (records,) = self._done.change()
        return records / seconds if seconds > 0 else 0.0

    async def run(self, refresh: Callable[[], Awaitable[object]]) -> None:
        """Call ``refresh()`` every ``lag_interval_s``, forever; failures are logged."""
        while True:
            await self.read_once(refresh)
            await self._sleep(self._config.lag_interval_s)


__all__ = ["LagMonitor", "standalone_signal"]
