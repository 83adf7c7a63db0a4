"""Section ``table``: the offline table mode beside the streaming path, on ``fixed_latency``
(every execution a fixed wall time asleep, one instance: its ceiling does not move with this
machine's CPU). The same rows (numeric: 16 float32 + int64, ``bench.stack.backlog``) go through
the same model and binding into PostgreSQL, three ways, one after the other in one stack:

- ``table``: one ``rowbatch-consumer table`` process over a Parquet file of those rows (chunks
  of the same 500 rows as the messages);
- ``kafka`` / ``pubsub``: one ``rowbatch-consumer run`` process draining a backlog of the same
  rows as 500-row messages (published before it starts).

Per way: rows/s from the first row written to the last (the table process measures its own
window, the first write acked to the last; the streaming ones are polled on ``/metrics``, as in
the saturation section), the share of the measured ceiling (a direct client probed first),
Triton's mean executed batch and busy fraction, and the consumer's CPU per row over the
window (reading and encoding the file included for the table) and peak RSS. Target: the table
mode reaches >= 95 % of the measured ceiling."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from bench.procs import consumers
from bench.report import Table, rate, ratio
from bench.saturation_run import watch_backlog
from bench.saturation_server import (
    MODEL,
    ModelTiming,
    ServerWindow,
    model_timing,
    probe,
    snapshot,
)
from bench.stack import (
    BROKERS,
    NOOP_NUMERIC_BINDING,
    Bench,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    sink_config,
    unique,
)
from harness.consumer_process import ConsumerProcess, to_toml
from harness.proc import free_port
from rowbatch.consumer.section import MiB

ROWS = 200_000
QUICK_ROWS = 10_000
CHUNK_ROWS = 500
MAX_WAIT_MS = 100.0
BUDGET = 256 * MiB
RUN_TIMEOUT_S = 600.0
TABLE_SHARE_TARGET = 0.95


@dataclass(frozen=True)
class Way:
    """One run of the rows into PostgreSQL."""

    way: str
    """``table``, ``kafka`` or ``pubsub``."""
    rows: int
    """Rows in the measured window."""
    seconds: float
    rows_per_s: float
    of_measured: float
    mean_batch: float
    busy: float
    cpu_us_per_row: float
    peak_rss_mib: float
    rows_in_sink: int
    rows_expected: int


@dataclass(frozen=True)
class TableModeResult:
    model: str
    timing: ModelTiming
    measured_ceiling: float
    rows: int
    chunk_rows: int
    ways: tuple[Way, ...]

    def find(self, way: str) -> Way | None:
        return next((w for w in self.ways if w.way == way), None)

    def table(self) -> Table:
        t = self.timing
        rows = tuple(
            (
                w.way,
                f"{w.rows_expected:,}",
                rate(w.rows_per_s),
                ratio(w.of_measured),
                f"{w.mean_batch:.0f}",
                ratio(w.busy),
                f"{w.cpu_us_per_row:.1f}",
                f"{w.peak_rss_mib:.0f}",
                "ok" if w.rows_in_sink == w.rows_expected else f"{w.rows_in_sink:,}!",
            )
            for w in self.ways
        )
        table = self.find("table")
        return Table(
            f"9. Table mode vs streaming: {self.model} ({t.base_ms:g} ms + {t.per_row_us:g} us/row "
            f"per execution), measured ceiling {rate(self.measured_ceiling)} rows/s",
            (
                "way",
                "rows",
                "rows/s",
                "of measured",
                "batch",
                "busy",
                "CPU us/row",
                "RSS MiB",
                "in sink",
            ),
            rows,
            (
                f"The same {self.rows:,} numeric rows into PostgreSQL each way: table = one "
                f"rowbatch-consumer table process over a Parquet file ({self.chunk_rows}-row "
                "chunks); kafka / pubsub = one consumer draining a backlog of "
                f"{self.chunk_rows}-row messages. rows/s from the first row written to the "
                "last; busy = Triton's compute_infer / that window (the table's window starts "
                "at its first write, so its first execution is inside busy: a few % over 100 "
                "is possible); CPU: the consumer process's user+sys over the window, per row.",
                f"Target: table >= {TABLE_SHARE_TARGET:.0%} of the measured ceiling: "
                + (
                    "not run"
                    if table is None
                    else f"{table.of_measured:.0%} "
                    + ("(met)" if table.of_measured >= TABLE_SHARE_TARGET else "(MISSED)")
                ),
            ),
        )


def _parquet_of(rows: int, path: Path) -> int:
    """The rows of the streaming backlog as one Parquet file; returns its row count."""
    tables = [
        pa.ipc.open_stream(message.payload).read_all()
        for message in backlog("numeric", rows, CHUNK_ROWS, prefix=unique("table"))
    ]
    whole = pa.concat_tables(tables)
    pq.write_table(whole, path, row_group_size=50_000)
    return int(whole.num_rows)


def _table_way(bench: Bench, timing: ModelTiming, measured: float, rows: int) -> Way:
    workdir = bench.dir("table_mode")
    data = workdir / "rows.parquet"
    total = _parquet_of(rows, data)
    name = unique("table_mode_table")
    config = {
        "source": {
            "kind": "table",
            "input": str(data),
            "state": str(workdir / f"{name}-state"),
            "chunk_rows": CHUNK_ROWS,
        },
        "model": {
            "url": bench.stack.triton.grpc_url,
            "name": timing.model,
            "max_wait_ms": MAX_WAIT_MS,
        },
        "binding": dict(NOOP_NUMERIC_BINDING),
        "sink": sink_config(bench, "postgres", name),
        "budget_bytes": BUDGET,
        "log_format": "text",
        "log_level": "WARNING",
        "server": {"host": "127.0.0.1", "port": free_port()},
    }
    path = workdir / f"{name}.toml"
    path.write_text(to_toml(config))
    summary_path = workdir / f"{name}-summary.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    proc = ConsumerProcess(
        name,
        path,
        workdir / f"{name}.log",
        config["server"]["port"],  # type: ignore[index]
        env,
        command=("table", "--summary", str(summary_path)),
    )
    before = snapshot(bench.stack.triton.grpc_url, timing.model)
    try:
        proc.start()
        code = proc.wait(RUN_TIMEOUT_S)
    finally:
        proc.stop()
    if code != 0:
        raise RuntimeError(f"the table run exited with {code}:\n{proc.log()}")
    after = snapshot(bench.stack.triton.grpc_url, timing.model)
    summary = json.loads(summary_path.read_text())
    window = float(summary["window_s"])
    server = ServerWindow(
        window,
        after.executions - before.executions,
        after.rows - before.rows,
        (after.infer_ns - before.infer_ns) / 1e9,
        timing.instances,
    )
    in_sink = count_rows(bench, "postgres", name)
    remove_table(bench, "postgres", name)
    per_s = float(summary["window_rows_per_s"])
    return Way(
        "table",
        int(summary["window_rows"]),
        round(window, 2),
        per_s,
        per_s / measured if measured else 0.0,
        server.mean_batch,
        server.busy,
        float(summary["window_cpu_s"]) / max(int(summary["window_rows"]), 1) * 1e6,
        float(summary["peak_rss_mib"]),
        in_sink,
        total,
    )


def _streaming_way(
    bench: Bench, timing: ModelTiming, measured: float, rows: int, broker: str
) -> Way:
    feed = create_feed(bench.stack, broker)  # type: ignore[arg-type]
    publish(bench.stack, feed, backlog("numeric", rows, CHUNK_ROWS, prefix=unique("tm")))
    name = unique(f"table_mode_{broker}")
    config = consumer_config(
        bench.stack,
        feed,
        timing.model,
        NOOP_NUMERIC_BINDING,
        sink_config(bench, "postgres", name),
        model_extra={"max_wait_ms": MAX_WAIT_MS},
        budget_bytes=BUDGET,
    )
    started = time.monotonic()
    with consumers(bench.dir("table_mode"), name, config) as procs:
        observed = watch_backlog(
            procs[0], bench.stack.triton.grpc_url, timing, total=rows, started=started
        )
        procs[0].terminate()
    in_sink = count_rows(bench, "postgres", name)
    remove_table(bench, "postgres", name)
    return Way(
        broker,
        observed.rows,
        round(observed.seconds, 2),
        observed.rows_per_s,
        observed.rows_per_s / measured if measured else 0.0,
        observed.server.mean_batch,
        observed.server.busy,
        observed.cpu_us_per_row,
        observed.peak_rss_mib,
        in_sink,
        rows,
    )


def run(bench: Bench) -> TableModeResult:
    url = bench.stack.triton.grpc_url
    timing = model_timing(url)
    rows = QUICK_ROWS if bench.quick else ROWS
    found = probe(url, timing, 0.5 if bench.quick else 1.5)
    ways = [_table_way(bench, timing, found.rows_per_s, rows)]
    ways += [_streaming_way(bench, timing, found.rows_per_s, rows, b) for b in BROKERS]
    return TableModeResult(MODEL, timing, found.rows_per_s, rows, CHUNK_ROWS, tuple(ways))


__all__ = ["TableModeResult", "Way", "run"]
