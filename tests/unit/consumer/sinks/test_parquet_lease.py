"""The Parquet dataset's writer lease: a second writer (another host, or another key index on
the same dataset) is refused while the first one's lease is fresh, takes over once it lapsed,
and the first one then stops at its next write instead of writing on. Clocks are injected."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from rowbatch.consumer.sinks.base import ResultRows, SinkError, SinkUnavailable
from rowbatch.consumer.sinks.parquet.lease import LEASE_FILE, LEASE_S, RENEW_S, WriterLease
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from tests.sink_data import make_rows, spec


def rows(first: int, n: int) -> ResultRows:
    return make_rows(list(range(first, first + n)))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


Sinks = Callable[..., Awaitable[ParquetSink]]


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def sinks(tmp_path: Path, clock: Clock) -> AsyncIterator[Sinks]:
    """Sinks on one dataset, each with the key index ``index`` names (another host's)."""
    opened: list[ParquetSink] = []

    async def make(index: str, **kwargs: Any) -> ParquetSink:
        sink = ParquetSink(
            str(tmp_path / "data"),
            index_path=tmp_path / index / "keys.sqlite",
            lease_clock=clock,
            **kwargs,
        )
        await sink.open(spec())
        opened.append(sink)
        return sink

    yield make
    for sink in opened:
        await sink.close()


async def test_a_second_writer_is_refused_while_the_first_ones_lease_is_fresh(
    sinks: Sinks, clock: Clock
) -> None:
    first = await sinks("a")
    clock.now += LEASE_S - 1
    with pytest.raises(SinkUnavailable, match=r"being written by .*a/keys\.sqlite"):
        await sinks("b")
    del first


async def test_a_lapsed_lease_is_taken_over_and_its_old_writer_stops_at_its_next_write(
    sinks: Sinks, clock: Clock
) -> None:
    first = await sinks("a")
    clock.now += LEASE_S + 1  # the first one wrote nothing meanwhile: its lease lapsed
    second = await sinks("b")
    assert await second.write(rows(0, 10)) == 10
    with pytest.raises(SinkError, match=r"lease was taken by .*b/keys\.sqlite"):
        await first.write(rows(10, 10))


async def test_the_same_writer_restarting_gets_its_lease_back_at_once(
    tmp_path: Path, sinks: Sinks, clock: Clock
) -> None:
    # What a crash leaves: a fresh lease of this host and index, its process gone.
    left = WriterLease(
        pafs.LocalFileSystem(), str(tmp_path / "data"), tmp_path / "a" / "keys.sqlite", clock=clock
    )
    left.acquire()
    assert (tmp_path / "data" / LEASE_FILE).exists()
    again = await sinks("a")
    assert await again.write(rows(0, 5)) == 5
    with pytest.raises(SinkUnavailable):  # and it is this writer's again
        await sinks("b")


async def test_closing_gives_the_lease_up_and_a_writer_renews_it_as_it_writes(
    tmp_path: Path, sinks: Sinks, clock: Clock
) -> None:
    first = await sinks("a")
    for n in range(4):  # writing keeps the lease fresh well past LEASE_S
        clock.now += RENEW_S + 1
        await first.write(rows(n * 10, 10))
    with pytest.raises(SinkUnavailable):
        await sinks("b")
    await first.close()
    assert not (tmp_path / "data" / LEASE_FILE).exists()
    second = await sinks("b")
    assert await second.write(rows(100, 10)) == 10
