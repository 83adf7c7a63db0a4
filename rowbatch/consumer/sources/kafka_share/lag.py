"""The share group's lag as gauges: every ``lag_interval_s``, the group's coordinator is asked
where the group stands on each partition of the topic (DescribeShareGroupOffsets v1,
:mod:`.share_offsets`; Kafka >= 4.2), and the records not done yet by the group (available,
acquired, not yet delivered: KIP-1226's share-partition lag) are exported:

- ``rowbatch_kafka_share_lag{topic,partition}``: per partition; NaN where the broker does not
  know it (-1: the group has written no state for the partition yet, i.e. none of its records
  was acknowledged, released or kept past its lock so far, or the partition never had one);
- ``rowbatch_kafka_share_lag_total{topic}``: their sum over the partitions whose lag is known
  (NaN when none is);
- ``rowbatch_kafka_share_lag_updated_timestamp_seconds{topic}``: when they were last read;
- ``rowbatch_kafka_share_lag_read_failures_total{topic}``: reads that failed.

Each replica reads the whole group's view (every partition, every member's work): aggregate
across replicas with ``max by (topic, partition)``, not ``sum``. A failing read is counted and
logged (at once, then at most once a minute); once reads have failed for ``stale_after_s`` the
gauges are NaN until one succeeds, as the classic source's lag (``observe/read_staleness.py``)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

from rowbatch.consumer.observe.read_staleness import ReadStaleness
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.kafka_share.share_offsets import (
    ShareOffsetsError,
    ShareOffsetsReader,
    SharePartitionOffset,
)
from rowbatch.timing import Clock, Sleep, WallClock


class ShareLagGauges:
    """The share group's lag metrics (names in the module's docstring), in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lag = Gauge(
            "rowbatch_kafka_share_lag",
            "Kafka records the share group has not done yet per partition (available, acquired "
            "or not yet delivered; the broker's share-partition lag, KIP-1226); NaN where the "
            "broker does not know it yet",
            ["topic", "partition"],
            registry=registry,
        )
        self.lag_total = Gauge(
            "rowbatch_kafka_share_lag_total",
            "Sum of rowbatch_kafka_share_lag over the topic's partitions whose lag is known",
            ["topic"],
            registry=registry,
        )
        self.updated = Gauge(
            "rowbatch_kafka_share_lag_updated_timestamp_seconds",
            "Unix time of the last successful read of the share group's lag",
            ["topic"],
            registry=registry,
        )
        self.read_failures = Counter(
            "rowbatch_kafka_share_lag_read_failures",
            "Reads of the share group's lag (DescribeShareGroupOffsets) that failed",
            ["topic"],
            registry=registry,
        )
        self._partitions: dict[str, set[int]] = {}

    def update(
        self, topic: str, offsets: Mapping[int, SharePartitionOffset], *, now: float
    ) -> None:
        """A successful read at ``now`` (Unix seconds): the lag per partition (NaN where the
        broker answered -1), and the sum of the known ones (NaN if none is)."""
        known: list[int] = []
        for partition, offset in offsets.items():
            lag = offset.known_lag
            self.lag.labels(topic, str(partition)).set(math.nan if lag is None else lag)
            if lag is not None:
                known.append(lag)
        self._partitions.setdefault(topic, set()).update(offsets)
        self.lag_total.labels(topic).set(sum(known) if known else math.nan)
        self.updated.labels(topic).set(now)

    def withdraw(self, topic: str) -> None:
        """The figures are no longer current: every one of the topic's gauges is NaN (the
        update time stays, its age telling how old the last figures are)."""
        for partition in self._partitions.get(topic, ()):
            self.lag.labels(topic, str(partition)).set(math.nan)
        self.lag_total.labels(topic).set(math.nan)


class ShareLagMonitor:
    """Reads the share group's lag on ``settings.topic`` every ``settings.lag_interval_s``
    into the gauges of ``registry`` (:class:`ShareLagGauges`). Start ``run()`` as a task once
    the event loop runs; cancel it and ``await close()`` at the source's close.

    ``reader``: where the offsets come from (default: a :class:`ShareOffsetsReader` of the
    source's brokers, SASL and TLS); ``clock``/``wall``/``sleep``: time, injected by tests."""

    def __init__(
        self,
        settings: KafkaShareSettings,
        registry: CollectorRegistry,
        *,
        reader: ShareOffsetsReader | None = None,
        clock: Clock = time.monotonic,
        wall: WallClock = time.time,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._topic = settings.topic
        self._interval_s = settings.lag_interval_s
        self._reader = reader or ShareOffsetsReader.for_settings(
            settings, request_timeout_s=self.read_timeout_s
        )
        self._clock = clock
        self._wall = wall
        self._sleep = sleep
        self.gauges = ShareLagGauges(registry)
        self.gauges.read_failures.labels(self._topic)
        self._health = ReadStaleness(
            f"the share-group lag of {self._topic}",
            self.stale_after_s,
            withdrawn="the rowbatch_kafka_share_lag gauges",
        )

    @property
    def read_timeout_s(self) -> float:
        """How long one read may take: an interval, at least 5 s."""
        return max(self._interval_s, 5.0)

    @property
    def stale_after_s(self) -> float:
        """How long reads may fail before the gauges are withdrawn: three intervals, at least
        30 s (a coordinator moving or one slow read does not blank them)."""
        return max(3 * self._interval_s, 30.0)

    @property
    def stale(self) -> bool:
        return self._health.stale

    async def read(self) -> dict[int, SharePartitionOffset]:
        """The group's offsets on every partition of the topic (one read, no gauges)."""
        partitions = await self._reader.partitions(self._topic)
        offsets = await self._reader.read({self._topic: partitions})
        return {p: offset for (topic, p), offset in offsets.items() if topic == self._topic}

    async def read_once(self) -> bool:
        """One read, bounded by ``read_timeout_s``, into the gauges; a failure is counted,
        logged and, past ``stale_after_s``, withdraws the gauges. Returns whether it
        succeeded."""
        now = self._clock()
        failure: Exception | None = None
        try:
            async with asyncio.timeout(self.read_timeout_s):
                offsets = await self.read()
        except TimeoutError:
            failure = ShareOffsetsError(f"no answer within {self.read_timeout_s:g} s")
        except Exception as exc:  # noqa: BLE001 - the lag is informative; consuming goes on
            failure = exc
        if failure is not None:
            self.gauges.read_failures.labels(self._topic).inc()
            if self._health.failed(now, failure):
                self.gauges.withdraw(self._topic)
            return False
        self.gauges.update(self._topic, offsets, now=self._wall())
        self._health.succeeded(now)
        return True

    async def run(self) -> None:
        """Read every ``lag_interval_s``, forever (until cancelled); failures are logged."""
        while True:
            await self.read_once()
            await self._sleep(self._interval_s)

    async def close(self) -> None:
        """Close the reader's client (cancel ``run()`` first)."""
        await self._reader.close()


__all__ = ["ShareLagGauges", "ShareLagMonitor"]
