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
        self._last_read: float | None = None
        """``clock()`` of the last successful read (None: none yet)."""
        self._failing_since: float | None = None
        self._last_warned: float | None = None
        self.stale = False
        """No successful read for ``stale_after_s``: the scaling figures are NaN."""
        self._gauges = LagGauges(registry)
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
        if self.stale or self._failing_since is not None:
            _LOG.warning(
                "Kafka lag of %s read again after %.0f s of failures; scaling signal current",
                self._config.topic,
                now - (self._failing_since or now),
            )
        self._last_read, self._failing_since, self._last_warned = now, None, None
        self.stale = False
        return True

    def _failed(self, now: float, exc: BaseException) -> None:
        topic = self._config.topic
        self._gauges.read_failures.labels(topic).inc()
        if self._failing_since is None:
            self._failing_since = now
        since = self._last_read if self._last_read is not None else self._failing_since
        age = now - since
        became_stale = not self.stale and age >= self.stale_after_s
        if became_stale:
            self.stale = True
            self.signal.unknown()
        if became_stale or self._last_warned is None or now - self._last_warned >= 60.0:
            self._last_warned = now
            what = (
                "the scaling figures are NaN (not known) until a read succeeds"
                if self.stale
                else f"the scaling figures are withdrawn after {self.stale_after_s:.0f} s"
            )
            _LOG.warning(
                "could not read the Kafka lag of %s for %.0f s (%s: %s); %s",
                topic,
                age,
                type(exc).__name__,
                exc,
                what,
            )

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
