"""Section 2, end to end: a backlog published before the consumer starts, drained by one
consumer process (``python -m rowbatch.consumer run``) into each sink, on Pub/Sub and on Kafka;
rows/s from the first row written to the last, and the ratio to the model's ceiling."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.ceiling import CeilingResult, probe
from bench.procs import consumers, drain
from bench.report import Table, rate, ratio
from bench.stack import (
    BROKERS,
    SCORER_BINDING,
    SINKS,
    TEXT_BINDING,
    Bench,
    Broker,
    Feed,
    SinkKind,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    sink_config,
    unique,
)

TEXT_CHUNK_ROWS = 500
NUMERIC_CHUNK_ROWS = 1000


@dataclass(frozen=True)
class E2eRun:
    broker: Broker
    sink: SinkKind
    model: str
    rows: int
    rows_per_s: float
    drain_s: float
    startup_s: float
    rows_in_sink: int
    ceiling_nearby: float
    """The model's ceiling probed right before and after this run (mean rows/s)."""
    ceiling_ratio: float
    """rows_per_s / ceiling_nearby."""


@dataclass(frozen=True)
class E2eResult:
    rows: int
    text_chunk_rows: int
    numeric_chunk_rows: int
    publish_s: dict[str, float]
    runs: tuple[E2eRun, ...]

    def find(self, broker: Broker, sink: SinkKind, model: str = "embedder") -> E2eRun | None:
        return next(
            (r for r in self.runs if (r.broker, r.sink, r.model) == (broker, sink, model)), None
        )

    def table(self) -> Table:
        rows = tuple(
            (
                f"{r.broker} -> {r.sink}",
                r.model,
                f"{r.rows:,}",
                rate(r.rows_per_s),
                f"{r.drain_s:.1f} s",
                f"{r.startup_s:.1f} s",
                rate(r.ceiling_nearby),
                ratio(r.ceiling_ratio),
                "ok" if r.rows_in_sink == r.rows else f"{r.rows_in_sink:,}!",
            )
            for r in self.runs
        )
        return Table(
            "2. End to end: one consumer process drains a pre-published backlog",
            (
                "broker -> sink",
                "model",
                "rows",
                "rows/s",
                "drain",
                "start-up",
                "ceiling then",
                "of ceiling",
                "in sink",
            ),
            rows,
            (
                f"Text rows (64 chars) in Arrow chunks of {self.text_chunk_rows}, numeric rows "
                f"in chunks of {self.numeric_chunk_rows}; rows/s from the first row written "
                "to the last (start-up: process start to first row, not counted). Ceiling "
                "then: the mean of the model's ceiling probed just before and after the run "
                "(each probe the best 1.5 s window at concurrency 1 and at the sweep's best), "
                "since the server's own rate drifts on a shared machine.",
            ),
        )


@dataclass
class _Prober:
    """Ceiling probes around the runs; a run's probe after is the next run's probe before
    when that run uses the same model (one probe saved per run)."""

    bench: Bench
    ceiling: CeilingResult | None
    last: tuple[str, float] | None = None

    def before(self, model: str) -> float:
        if self.last is not None and self.last[0] == model:
            return self.last[1]
        return probe(self.bench, model, self.ceiling)

    def after(self, model: str) -> float:
        value = probe(self.bench, model, self.ceiling)
        self.last = (model, value)
        return value


def run(bench: Bench, rows: int, ceiling: CeilingResult | None) -> E2eResult:
    prober = _Prober(bench, ceiling)
    runs: list[E2eRun] = []
    publish_s: dict[str, float] = {}
    numeric_rows = rows
    for broker in BROKERS:
        text = create_feed(bench.stack, broker, readers=len(SINKS))
        published = publish(
            bench.stack, text, backlog("text", rows, TEXT_CHUNK_ROWS, prefix=unique("e2e"))
        )
        publish_s[f"{broker} text"] = round(published.seconds, 2)
        for i, sink in enumerate(SINKS):
            runs.append(
                _run(
                    bench,
                    text,
                    i,
                    model="embedder",
                    binding=dict(TEXT_BINDING),
                    sink=sink,
                    rows=rows,
                    prober=prober,
                )
            )
        numeric = create_feed(bench.stack, broker, readers=1)
        published = publish(
            bench.stack,
            numeric,
            backlog("numeric", numeric_rows, NUMERIC_CHUNK_ROWS, prefix=unique("e2e")),
        )
        publish_s[f"{broker} numeric"] = round(published.seconds, 2)
        runs.append(
            _run(
                bench,
                numeric,
                0,
                model="scorer",
                binding=dict(SCORER_BINDING),
                sink="postgres",
                rows=numeric_rows,
                prober=prober,
            )
        )
    return E2eResult(rows, TEXT_CHUNK_ROWS, NUMERIC_CHUNK_ROWS, publish_s, tuple(runs))


def _run(
    bench: Bench,
    feed: Feed,
    reader: int,
    *,
    model: str,
    binding: dict[str, object],
    sink: SinkKind,
    rows: int,
    prober: _Prober,
) -> E2eRun:
    table = unique(f"e2e_{feed.broker}_{sink}_{model}")
    before = prober.before(model)
    config = consumer_config(
        bench.stack, feed, model, binding, sink_config(bench, sink, table), reader=reader
    )
    started = time.monotonic()
    with consumers(bench.dir("e2e"), table, config) as procs:
        drained = drain(procs, rows, started)
        procs[0].terminate()
    nearby = (before + prober.after(model)) / 2
    in_sink = count_rows(bench, sink, table)
    remove_table(bench, sink, table)
    return E2eRun(
        feed.broker,
        sink,
        model,
        rows,
        drained.rows_per_s,
        drained.seconds,
        drained.startup_s,
        in_sink,
        nearby,
        drained.rows_per_s / nearby,
    )
