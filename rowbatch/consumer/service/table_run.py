"""A table run as the operator sees it: a live bar on a terminal (a log line every
``progress_interval_s`` otherwise) while it runs, and a summary when it ends: rows planned,
skipped as already done, read, written, dead-lettered, wall time, rows/s and batch fill."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.sources.table.source import TableSource
from rowbatch.progress import Progress, format_duration

log = logging.getLogger("rowbatch.consumer")

BAR_INTERVAL_S = 0.5


@dataclass(frozen=True)
class TableSummary:
    """The end of a table run (one shard)."""

    complete: bool
    """Every row of the shard is written or dead-lettered."""
    planned_rows: int | None
    skipped_rows: int
    read_rows: int
    written_rows: int
    dead_lettered_rows: int
    wall_s: float
    rows_per_s: float
    batches: int
    mean_batch_rows: float
    target_batch_size: int
    in_flight: int
    """Inference requests kept at the server at once."""
    state: str
    window_s: float
    """From the first write acked to the last: the steady part of the run."""
    window_rows: int
    """Rows written in that window (after the first write)."""
    cpu_s: float
    """User + system CPU of the process, start-up included."""
    window_cpu_s: float
    """User + system CPU of the process from the first write to the last."""
    peak_rss_mib: float
    model_work_at_risk: int = 0
    """Most rows of model work a kill could have thrown away (answered, not yet durable)."""
    unreadable: tuple[str, ...] = ()
    """The parts of the input that could not be read, with where and why (the run is then
    not complete: a rerun reads them again)."""

    @property
    def window_rows_per_s(self) -> float:
        return self.window_rows / self.window_s if self.window_s > 0 else 0.0

    @property
    def batch_fill(self) -> float:
        return self.mean_batch_rows / self.target_batch_size if self.target_batch_size else 0.0

    def lines(self) -> list[str]:
        planned = "?" if self.planned_rows is None else f"{self.planned_rows:,}"
        if self.complete:
            head = "complete"
        elif self.unreadable:
            head = f"NOT complete ({len(self.unreadable)} part(s) of the input could not be read)"
        else:
            head = "NOT complete (stopped; a rerun resumes)"
        unreadable = [f"  unreadable: {what}" for what in self.unreadable]
        return [
            f"table run {head}",
            f"  rows: {planned} planned, {self.skipped_rows:,} skipped (settled by an earlier "
            f"run), {self.read_rows:,} read, {self.written_rows:,} written, "
            f"{self.dead_lettered_rows:,} dead-lettered",
            f"  {format_duration(self.wall_s)} wall, {self.rows_per_s:,.0f} rows/s settled "
            f"({self.window_rows_per_s:,.0f} rows/s from the first write to the last); "
            f"{self.batches:,} batches of {self.mean_batch_rows:,.1f} rows on average "
            f"({self.batch_fill:.0%} of the target {self.target_batch_size})",
            f"  progress and dead letters: {self.state}",
            *unreadable,
        ]

    def to_json(self) -> str:
        extra = {"batch_fill": self.batch_fill, "window_rows_per_s": self.window_rows_per_s}
        return json.dumps({**asdict(self), **extra}, indent=2)


def _histogram_totals(metrics: Metrics) -> tuple[float, float]:
    """Count and sum of ``rowbatch_batch_rows``."""
    count = total = 0.0
    for family in metrics.batch_size.collect():
        for sample in family.samples:
            if sample.name.endswith("_count"):
                count = sample.value
            elif sample.name.endswith("_sum"):
                total = sample.value
    return count, total


def summarize(
    source: TableSource,
    *,
    metrics: Metrics,
    target_batch_size: int,
    in_flight: int,
    wall_s: float,
    model_work_at_risk: int = 0,
) -> TableSummary:
    counts = source.counts
    batches, rows = _histogram_totals(metrics)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    first, last = counts.first_write_at, counts.last_write_at
    return TableSummary(
        complete=source.complete,
        planned_rows=counts.planned,
        skipped_rows=counts.skipped,
        read_rows=counts.read,
        written_rows=counts.written,
        dead_lettered_rows=counts.dead_lettered,
        wall_s=wall_s,
        rows_per_s=counts.settled / wall_s if wall_s > 0 else 0.0,
        batches=int(batches),
        mean_batch_rows=rows / batches if batches else 0.0,
        target_batch_size=target_batch_size,
        in_flight=in_flight,
        state=source.state_location,
        window_s=(last - first) if first is not None and last is not None else 0.0,
        window_rows=counts.written - counts.first_write_rows,
        cpu_s=usage.ru_utime + usage.ru_stime,
        window_cpu_s=counts.last_write_cpu - counts.first_write_cpu,
        peak_rss_mib=usage.ru_maxrss / 1024,
        model_work_at_risk=model_work_at_risk,
        unreadable=tuple(counts.unreadable),
    )


async def report_progress(source: TableSource, stream: TextIO, interval_s: float) -> None:
    """Draws the bar (terminal) or logs a line per interval until cancelled."""
    counts = source.counts
    remaining = None if counts.planned is None else max(counts.planned - counts.skipped, 0)
    bar = Progress(stream, mode="auto", total_rows=remaining, interval_s=BAR_INTERVAL_S)
    drawn = (0, 0, 0)
    try:
        while True:
            await asyncio.sleep(BAR_INTERVAL_S if bar.mode == "bar" else interval_s)
            now = (counts.settled, counts.chunks, counts.bytes)
            rows, chunks, nbytes = (a - b for a, b in zip(now, drawn, strict=True))
            if bar.mode == "bar":
                bar.add(rows=rows, chunks=chunks, nbytes=nbytes)
            else:
                bar.rows, bar.chunks, bar.bytes = now
                log.info("table progress: %s", bar.render())
            drawn = now
    finally:
        if bar.mode == "bar":
            bar.rows, bar.chunks, bar.bytes = counts.settled, counts.chunks, counts.bytes
            bar.finish()


def write_summary(summary: TableSummary, path: Path | None, stream: TextIO) -> None:
    for line in summary.lines():
        print(line, file=stream)
    if path is not None:
        path.write_text(summary.to_json() + "\n")


__all__ = ["TableSummary", "report_progress", "summarize", "write_summary"]
