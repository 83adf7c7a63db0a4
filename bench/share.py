"""``python -m bench share``: a Kafka share group (``[source] kind = "kafka-share"``, KIP-932,
docs/kafka-share.md) scaling past the partition count, against the classic consumer group on
the same topic. On fresh ONE-partition topics, each with the same backlog (150,000 rows as
1,500 records of 100 rows, in producer batches of 4 records: the broker hands a share group's
members whole producer batches), five configurations drain into PostgreSQL, rotated round by
round: the share group with 1, 2 and 4 consumer processes, the classic group (``kind =
"kafka"``) with 1 and 4. The consumers are real ``rowbatch-consumer`` processes, started and
ready (every member in its group) before the backlog is produced at once.

The consumers are latency-bound, as replicas limited per replica would be: each sends 200-row
requests, one at a time (``model.max_in_flight = 1``, ``adapt`` off), to a ``fixed_latency``
model of 50 ms per execution on 8 instances, so one process drains at most 4,000 rows/s and
the server (32,000 rows/s) has room for every process. N processes should then drain about N
times as fast as one until this machine's CPUs run out: the machine has 2 cores, shared with
the broker, Triton, PostgreSQL and the runner. A CPU-bound consumer could not show scale-out
here at all.

Per run: the drain's time and rows/s (from the start of production to the last row in the
table), each process's share of the rows (``rowbatch_rows_written_total`` on its
``/metrics``) and when it wrote its first, the consumers' CPU per row, the machine's and the
model's busy share, and every row checked exactly once in the table (count and distinct ids;
a run that loses or duplicates rows fails the bench). Services of its own (a Kafka 4.4.0
broker, Triton, PostgreSQL) under ``.stack/share/``; every process is stopped by its pid.

    python -m bench share [--repeat 3] [--rows N] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg import sql

from bench import machine
from bench.help_text import description
from bench.procs import ConsumerProcess, consumers, wait_ready
from bench.run_start import (
    Log,
    error_text,
    header,
    machine_ticks,
    open_log,
    stop_cleanly_on_signals,
    write_record,
)
from bench.share_report import (
    CLASSIC_ONE,
    SHARE_ONE,
    Config,
    Failed,
    Params,
    Process,
    Run,
    Sample,
    ShareBench,
    first_rows,
    middle_rate,
    order,
)
from bench.stack import NOOP_NUMERIC_BINDING, backlog
from bench.triton import ServerStats, server_stats
from harness.kafka import KafkaEndpoint, KafkaService, create_topic
from harness.kafka.share import share_kafka_service
from harness.model_repository import FixedLatency, fixed_latency_repository
from harness.postgres import PostgresEndpoint, PostgresService
from harness.service import REPO_ROOT, RunDir
from harness.triton import TritonService
from rowbatch.producer.publishers.messages import Message

MODEL = "share_fixed"
VARIANT = FixedLatency(base_ms=50.0, per_row_us=0.0, max_batch_size=256, instances=8)
BATCH_ROWS = 200
"""``model.batch_size``: two records a request."""
IN_FLIGHT = 1
MAX_WAIT_MS = 20.0
RECORD_ROWS = 100
DEFAULT_ROWS = 150_000
PRODUCER_BATCH = 4
"""``batch.num.messages`` of the backlog's producer: records per producer batch."""
MEMBERS = 2
"""``source.members`` of a share-group process (the default)."""
MAX_POLL_RECORDS = 8
"""``source.max_poll_records``: 800 rows a poll, a small part of the backlog, so the records
spread over the members as they ask for more."""
LOCK_S = 30.0
SETTLE_S = 3.0
"""After every process is ready, before the backlog is produced: a share member has its
assignment within about a heartbeat (1 s on this broker), the classic group has rebalanced."""
SAMPLE_S = 0.2
READY_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 300.0
TABLE_WAIT_S = 30.0
"""After the processes' counters reach the backlog, the most to wait for the table to hold
every id (a row written twice counts twice in the counters)."""
STOP_TIMEOUT_S = 30.0
WARM_UP_ROWS = 5_000
"""A drain by one share-group and one classic process before the first round, not recorded:
the broker's first share group and first consumer group create its internal topics' state."""
RESULTS = REPO_ROOT / "bench" / "results"
"""Where a run is recorded by default (``bench.cli.RESULTS_DIR``: docs cite only these)."""

SHARE_RECORDS = "rowbatch_kafka_share_records_total"
SHARE_REDELIVERED = "rowbatch_kafka_share_redelivered_records_total"
SHARE_REFUSED = "rowbatch_kafka_share_refused_acknowledgements_total"
DEAD_LETTERED = "rowbatch_messages_dead_lettered_total"


def params(rows: int, repeat: int, cores: int) -> Params:
    return Params(
        rows=rows,
        record_rows=RECORD_ROWS,
        producer_batch_records=PRODUCER_BATCH,
        model=MODEL,
        base_ms=VARIANT.base_ms,
        instances=VARIANT.instances,
        batch_rows=BATCH_ROWS,
        max_in_flight=IN_FLIGHT,
        max_wait_ms=MAX_WAIT_MS,
        members=MEMBERS,
        max_poll_records=MAX_POLL_RECORDS,
        lock_s=LOCK_S,
        settle_s=SETTLE_S,
        sample_s=SAMPLE_S,
        repeat=repeat,
        cores=cores,
    )


@dataclass(frozen=True)
class Rig:
    kafka: KafkaEndpoint
    postgres: PostgresEndpoint
    triton_url: str
    workdir: Path


def source_config(rig: Rig, kind: str, topic: str, group: str) -> dict[str, Any]:
    """``[source]`` of each group kind: the share group with :data:`MEMBERS` members polling
    :data:`MAX_POLL_RECORDS` records; the classic group with its defaults."""
    source: dict[str, Any] = {
        "kind": "kafka-share" if kind == "share" else "kafka",
        "bootstrap_servers": rig.kafka.bootstrap_servers,
        "topic": topic,
        "group_id": group,
        "dead_letter_topic": f"{topic}.dlq",
    }
    if kind == "share":
        source |= {
            "members": MEMBERS,
            "max_poll_records": MAX_POLL_RECORDS,
            "lock_duration_s": LOCK_S,
        }
    return source


def consumer_config(rig: Rig, kind: str, topic: str, group: str, table: str) -> dict[str, Any]:
    """A consumer process's configuration (the dict form of its TOML file)."""
    return {
        "source": source_config(rig, kind, topic, group),
        "model": {
            "url": rig.triton_url,
            "name": MODEL,
            "batch_size": BATCH_ROWS,
            "max_in_flight": IN_FLIGHT,
            "adapt": False,
            "max_wait_ms": MAX_WAIT_MS,
        },
        "binding": dict(NOOP_NUMERIC_BINDING),
        "sink": {"kind": "postgres", "dsn": rig.postgres.dsn, "table": table},
        "log_format": "text",
        "log_level": "WARNING",
    }


# --- the backlog and the table ---------------------------------------------------------------


def produce(endpoint: KafkaEndpoint, topic: str, messages: Sequence[Message]) -> float:
    """Every message as a record in producer batches of :data:`PRODUCER_BATCH` records; the
    seconds until the broker acknowledged the last."""
    producer = Producer(
        {
            "bootstrap.servers": endpoint.bootstrap_servers,
            "acks": "all",
            "batch.num.messages": PRODUCER_BATCH,
            "linger.ms": 5,
        }
    )
    started = time.monotonic()
    for m in messages:
        while True:
            try:
                producer.produce(topic, value=m.payload, headers=list(m.attributes.items()))
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
        producer.poll(0)
    left = producer.flush(60)
    if left:
        raise RuntimeError(f"{left} records of the backlog not acknowledged by the broker")
    return time.monotonic() - started


@dataclass(frozen=True)
class TableCount:
    rows: int
    distinct: int


def table_count(dsn: str, table: str, expected: int) -> TableCount:
    """Rows in ``table`` and distinct ids among 0..expected-1 (0, 0 before it exists)."""
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return TableCount(0, 0)
        query = sql.SQL(
            "SELECT count(*), count(DISTINCT id) FILTER (WHERE id >= 0 AND id < %s) FROM {}"
        ).format(sql.Identifier(table))
        row = conn.execute(query, (expected,)).fetchone()
    return TableCount(int(row[0]), int(row[1])) if row else TableCount(0, 0)


def drop_table(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))


# --- a run -----------------------------------------------------------------------------------


def _metric(proc: ConsumerProcess, name: str) -> int:
    return int(proc.metric(name) or 0)


def _stop_all(procs: Sequence[ConsumerProcess]) -> None:
    """SIGTERM to every process at once, then wait for each (the ``consumers`` block kills
    by pid whatever is left)."""
    for proc in procs:
        if proc.returncode() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))


@dataclass
class Drained:
    samples: list[Sample]
    done_at: float
    """Seconds after production began that the table was seen to hold every id."""
    cpu_end: list[float]
    ticks_end: tuple[int, int]
    stats_end: ServerStats


def watch(
    rig: Rig, procs: Sequence[ConsumerProcess], table: str, rows: int, started: float
) -> Drained:
    """Sample every process's rows written every :data:`SAMPLE_S` until the counters reach
    ``rows`` and the table holds every id; the CPU, the machine's ticks and the server's
    totals read at that moment."""
    samples: list[Sample] = []
    deadline = started + DRAIN_TIMEOUT_S
    counted_at: float | None = None
    next_count = 0.0
    while True:
        now = time.monotonic()
        sample = Sample(now - started, tuple(p.rows_written() for p in procs))
        samples.append(sample)
        if sample.total >= rows:
            counted_at = counted_at or now
            if now >= next_count:
                next_count = now + 0.5
                if table_count(rig.postgres.dsn, table, rows).distinct >= rows:
                    cpu = [p.cpu().total_s for p in procs]
                    return Drained(
                        samples,
                        now - started,
                        cpu,
                        machine_ticks(),
                        server_stats(rig.triton_url, MODEL),
                    )
            if now - counted_at > TABLE_WAIT_S:
                raise RuntimeError(
                    f"the processes wrote {sample.total:,.0f} rows but the table lacks ids "
                    f"{TABLE_WAIT_S:.0f} s later"
                )
        for proc in procs:
            proc.check_alive(f"{rows:,} rows written ({sample.total:,.0f} so far)")
        if now > deadline:
            raise TimeoutError(
                f"{sample.total:,.0f} of {rows:,} rows written after {DRAIN_TIMEOUT_S:.0f} s"
            )
        time.sleep(SAMPLE_S)


def one_run(rig: Rig, config: Config, index: int, position: int, rows: int) -> Run:
    tag = uuid.uuid4().hex[:8]
    topic = f"share-bench-{config.kind}-{config.processes}-{tag}"
    group = f"{topic}-group"
    table = f"share_{config.kind}_{config.processes}_{tag}"
    asyncio.run(create_topic(rig.kafka, topic, partitions=1))
    asyncio.run(create_topic(rig.kafka, f"{topic}.dlq", partitions=1))
    messages = backlog("numeric", rows, RECORD_ROWS, prefix=f"share-{tag}")
    cfg = consumer_config(rig, config.kind, topic, group, table)
    try:
        with (
            consumers(rig.workdir, table, cfg, config.processes) as procs,
            ThreadPoolExecutor(1) as pool,
        ):
            wait_ready(procs, READY_TIMEOUT_S)
            time.sleep(SETTLE_S)
            cpu_start = [p.cpu().total_s for p in procs]
            ticks_start = machine_ticks()
            stats_start = server_stats(rig.triton_url, MODEL)
            started = time.monotonic()
            producing = pool.submit(produce, rig.kafka, topic, messages)
            drained = watch(rig, procs, table, rows, started)
            produce_s = producing.result()
            final = [
                (
                    int(p.rows_written()),
                    _metric(p, SHARE_RECORDS),
                    _metric(p, SHARE_REDELIVERED),
                    _metric(p, SHARE_REFUSED),
                    _metric(p, DEAD_LETTERED),
                )
                for p in procs
            ]
            _stop_all(procs)
        count = table_count(rig.postgres.dsn, table, rows)
    finally:
        with contextlib.suppress(Exception):
            drop_table(rig.postgres.dsn, table)
    firsts = first_rows(drained.samples, config.processes)
    server = drained.stats_end.minus(stats_start)
    busy, total = (e - s for e, s in zip(drained.ticks_end, ticks_start, strict=True))
    return Run(
        kind=config.kind,
        processes=config.processes,
        index=index,
        position=position,
        rows=rows,
        produce_s=round(produce_s, 2),
        drain_s=round(drained.done_at, 2),
        middle_rows_per_s=middle_rate(drained.samples, rows),
        per_process=tuple(
            Process(
                rows=f[0],
                records=f[1],
                first_row_s=firsts[i],
                cpu_s=round(drained.cpu_end[i] - cpu_start[i], 2),
            )
            for i, f in enumerate(final)
        ),
        machine_busy=busy / total if total > 0 else 0.0,
        server_busy=server.compute_ns / 1e9 / (drained.done_at * VARIANT.instances),
        server_requests=server.requests,
        server_execution_ms=server.batch_ms,
        server_queue_ms=server.queue_ms,
        in_table=count.rows,
        distinct=count.distinct,
        redelivered=sum(f[2] for f in final),
        refused_acks=sum(f[3] for f in final),
        dead_letters=sum(f[4] for f in final),
    )


def _line(r: Run) -> str:
    shares = " / ".join(f"{s:.1%}" for s in r.shares)
    check = "ok" if r.clean else "ROW CHECK FAILED"
    return (
        f"  {r.rows_per_s:,.0f} rows/s (drain {r.drain_s:.1f} s, produce {r.produce_s:.1f} s), "
        f"CPU {r.cpu_us_per_row:.0f} us/row, machine {r.machine_busy:.0%} busy, server "
        f"{r.server_busy:.0%} busy ({r.server_execution_ms:.0f} ms/exec, queue "
        f"{r.server_queue_ms:.1f} ms); shares {shares}; {r.in_table:,} rows in the table, "
        f"{r.distinct:,} distinct, rewritten {r.rewritten:,}, redelivered {r.redelivered}, "
        f"dead letters {r.dead_letters}: {check}"
    )


def run_all(rig: Rig, repeat: int, rows: int, say: Log) -> tuple[list[Run], list[Failed]]:
    runs: list[Run] = []
    failed: list[Failed] = []
    for config in (SHARE_ONE, CLASSIC_ONE):
        say(f"[warm-up: {config.label}, {WARM_UP_ROWS:,} rows, not recorded] ...")
        try:
            warm = one_run(rig, config, 0, 0, WARM_UP_ROWS)
        except Exception as exc:  # noqa: BLE001 - the rounds still run
            traceback.print_exc()
            say(f"  FAILED: {error_text(exc)}")
        else:
            say(_line(warm))
            if not warm.clean:  # not a figure, but a lost or doubled row fails the bench
                failed.append(
                    Failed(
                        config.kind,
                        config.processes,
                        0,
                        f"warm-up: {warm.lost} rows lost, "
                        f"{warm.twice} twice, {warm.dead_letters} dead letters",
                    )
                )
    for index in range(1, repeat + 1):
        for position, config in enumerate(order(index), 1):
            say(f"[round {index} of {repeat}, {position}. {config.label}] ...")
            try:
                r = one_run(rig, config, index, position, rows)
            except Exception as exc:  # noqa: BLE001 - one failed run must not lose the rest
                traceback.print_exc()
                failed.append(Failed(config.kind, config.processes, index, error_text(exc)))
                say(f"  FAILED: {error_text(exc)}")
            else:
                runs.append(r)
                say(_line(r))
    return runs, failed


# --- services and the record -----------------------------------------------------------------


def repository(root: Path) -> Path:
    return fixed_latency_repository(root, {MODEL: VARIANT})


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench share", description=description(__doc__))
    parser.add_argument(
        "--repeat", type=int, default=3, help="rounds of every configuration, rotated (default 3)"
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=DEFAULT_ROWS,
        help=f"backlog rows per run, a multiple of {RECORD_ROWS} (default {DEFAULT_ROWS:,})",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON file to write, the printed tables beside it as .txt (default "
        "bench/results/share-DATE.json)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.rows < 10 * RECORD_ROWS or args.rows % RECORD_ROWS:
        parser.error(f"--rows must be a multiple of {RECORD_ROWS}, at least {10 * RECORD_ROWS}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    given = list(argv if argv is not None else sys.argv[2:])
    args = parse_args(given)
    stop_cleanly_on_signals()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = RunDir(REPO_ROOT / ".stack" / "share" / stamp)
    out: Path = args.out or RESULTS / f"share-{time.strftime('%Y-%m-%d')}.json"
    here = machine.describe()
    head = header("share", given, time.strftime("%Y-%m-%d %H:%M:%S %z"), here)
    say = open_log(
        "rowbatch share group vs classic group",
        head,
        here,
        run_dir.root,
        notes=["a shared machine: other work (integration tests) may run beside it"],
    )
    kafka_service: KafkaService = share_kafka_service(run_dir, name="kafka-share")
    postgres_service = PostgresService(run_dir)
    triton_service = TritonService(run_dir, repository(run_dir.data("models")), name="triton-share")
    started = time.monotonic()
    with contextlib.ExitStack() as stack:
        for service in (kafka_service, postgres_service, triton_service):
            stack.callback(service.stop)
        with ThreadPoolExecutor(3) as pool:
            kafka_f = pool.submit(kafka_service.start)
            postgres_f = pool.submit(postgres_service.start)
            triton_f = pool.submit(triton_service.start)
            kafka, postgres, triton = kafka_f.result(), postgres_f.result(), triton_f.result()
        say(f"  services  ready in {time.monotonic() - started:.0f} s")
        rig = Rig(kafka, postgres, triton.grpc_url, run_dir.data("consumers"))
        runs, failed = run_all(rig, args.repeat, args.rows, say)
    result = ShareBench(params(args.rows, args.repeat, here.cores), tuple(runs), tuple(failed))
    say(result.render())
    write_record(result.to_json, head, here, started, out, say)
    return 0 if result.clean else 1
