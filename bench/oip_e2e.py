"""``python -m bench oip_e2e``: rows/s end to end (Kafka -> consumer -> model server ->
PostgreSQL) with the ``scorer`` formula on MLServer (adaptive batching on, as
deploy/oip_models/mlserver/scorer/model-settings.json sets it, and off) and on KServe, with
``model.max_in_flight`` 2, 4, 8 and unset (the server kind's default), side by side in one run:
the end-to-end figures behind each server's default (rowbatch/consumer/model/server_kind.py).

Kafka, PostgreSQL and the three servers start once, side by side. One backlog of numeric rows
(``--rows``, in messages of ``--rows-per-message``) is published to a 6-partition topic before any
consumer starts, so the consumer is the only bound; each run is a fresh consumer process (its own
group id, so it reads the whole topic from the start, and its own table) run until every row is
written, then stopped. Runs go in ``--rounds`` interleaved rounds (each round every server at
every setting, the order reversed every other round: drift on a shared machine hits every case
alike); the median round is reported. Per run: rows/s from the first batch answered to the last
(``processed_at`` in the table), every row exactly once (``count(*)`` and ``count(DISTINCT id)``),
the peak ``rowbatch_endpoint_inflight_batches`` seen on ``/metrics``, rows per request and the
consumer's CPU per row.

    python -m bench oip_e2e [--rows 300000] [--rows-per-message 100] [--rounds 3]
        [--servers mlserver,mlserver-unbatched,kserve] [--in-flight 2,4,8,default] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import psycopg
from psycopg import sql

from bench.help_text import description
from bench.procs import ConsumerProcess, consumers, wait_for
from bench.report import Table, rate
from bench.stack import KAFKA_PARTITIONS, SCORER_BINDING, backlog, unique
from harness.kafka import KafkaEndpoint, KafkaService, create_topic
from harness.kserve import KSERVE_VERSION, KServeService
from harness.mlserver import MLSERVER_VERSION, MLServerService
from harness.postgres import PostgresEndpoint, PostgresService
from harness.service import REPO_ROOT, ManagedService, RunDir
from rowbatch.producer.publishers.kafka import KafkaPublisher
from rowbatch.producer.publishers.window import PublishWindow

ROWS = 300_000
ROWS_PER_MESSAGE = 100
ROUNDS = 3
SETTINGS: tuple[int | None, ...] = (2, 4, 8, None)
"""``model.max_in_flight`` per run; None leaves it unset (the server kind's default)."""
RUN_TIMEOUT_S = 180.0
POLL_S = 0.05
RESULTS_DIR = REPO_ROOT / "bench-results"


class _GrpcEndpoint(Protocol):
    @property
    def grpc_url(self) -> str: ...


@dataclass(frozen=True)
class ServerCase:
    """One model server setup to run the consumer against."""

    name: str
    server: str
    setup: str
    default_in_flight: int
    """What server_kind.py gives this kind when ``model.max_in_flight`` is unset."""
    make: Callable[[RunDir], ManagedService[Any]]


CASES: dict[str, ServerCase] = {
    case.name: case
    for case in (
        ServerCase(
            "mlserver",
            f"MLServer {MLSERVER_VERSION}",
            "adaptive batching: up to 8 requests, 2 ms",
            8,
            lambda run: MLServerService(run, name="mlserver-batched"),
        ),
        ServerCase(
            "mlserver-unbatched",
            f"MLServer {MLSERVER_VERSION}",
            "adaptive batching off (max_batch_size 1)",
            8,
            lambda run: MLServerService(
                run, name="mlserver-unbatched", model_overrides={"scorer": {"max_batch_size": 1}}
            ),
        ),
        ServerCase(
            "kserve",
            f"KServe {KSERVE_VERSION}",
            "no batching: one request at a time",
            4,
            lambda run: KServeService(run, log_level="WARNING"),
        ),
    )
}


def setting_label(in_flight: int | None) -> str:
    return "default" if in_flight is None else str(in_flight)


@dataclass(frozen=True)
class Run:
    """One consumer process draining the whole backlog."""

    case: str
    in_flight: int | None
    round: int
    rows_per_s: float
    """From the first batch answered to the last (``processed_at``), rows after the first."""
    seconds: float
    metrics_rows_per_s: float
    """The same from polling ``rowbatch_rows_written_total`` (first poll with rows to the end)."""
    startup_s: float
    """Process start to the first row written (imports, discovery, group join)."""
    in_table: int
    distinct_ids: int
    expected: int
    requests: int
    peak_in_flight: int
    cpu_us_per_row: float
    dead_lettered: int

    @property
    def once(self) -> bool:
        return self.in_table == self.distinct_ids == self.expected and not self.dead_lettered


@dataclass(frozen=True)
class Cell:
    """One server at one setting: the median of its rounds."""

    case: str
    server: str
    setup: str
    in_flight: int | None
    rows_per_s: float
    rounds_rows_per_s: tuple[float, ...]
    peak_in_flight: int
    rows_per_request: float
    cpu_us_per_row: float
    every_row_once: bool


@dataclass(frozen=True)
class OipE2eResult:
    rows: int
    rows_per_message: int
    rounds: int
    cpu_count: int
    publish_s: float
    startup_s: dict[str, float]
    runs: tuple[Run, ...]
    cells: tuple[Cell, ...]

    def table(self) -> Table:
        settings = list(dict.fromkeys(c.in_flight for c in self.cells))
        by = {(c.case, c.in_flight): c for c in self.cells}
        rows = []
        for name in dict.fromkeys(c.case for c in self.cells):
            first = by[(name, settings[0])]
            cells = [by[(name, s)] for s in settings]
            best = max(cells, key=lambda c: c.rows_per_s)
            rows.append(
                (
                    f"{first.server}: {first.setup}",
                    *(
                        f"{rate(c.rows_per_s)} ({c.rows_per_request:.0f} r/req)"
                        if c.in_flight is not None
                        else f"{rate(c.rows_per_s)} (={c.peak_in_flight})"
                        for c in cells
                    ),
                    setting_label(best.in_flight),
                    "yes" if all(c.every_row_once for c in cells) else "NO",
                )
            )
        return Table(
            f"rows/s end to end, Kafka -> consumer -> server -> PostgreSQL, by model.max_in_flight "
            f"({self.rows:,} scorer rows in {self.rows_per_message}-row messages)",
            ("server", *(f"{setting_label(s)} in flight" for s in settings), "best", "once"),
            tuple(rows),
            (
                "r/req: rows per inference request; default: max_in_flight unset, (=N) the "
                "peak rowbatch_endpoint_inflight_batches seen.",
                "rows/s from the first batch answered to the last (processed_at); backlog "
                "published before each consumer starts; once: count(*) = count(DISTINCT id) = "
                "rows, nothing dead-lettered, in every run.",
                f"median of {self.rounds} interleaved rounds; {self.cpu_count} CPUs shared by the "
                "consumer, the server, Kafka and PostgreSQL. Rounds: "
                + "; ".join(
                    f"{c.case}@{setting_label(c.in_flight)} "
                    + "/".join(rate(r) for r in c.rounds_rows_per_s)
                    for c in self.cells
                ),
            ),
        )


# --- the stack and the backlog -----------------------------------------------------------------


@dataclass(frozen=True)
class _Stack:
    kafka: KafkaEndpoint
    postgres: PostgresEndpoint
    servers: dict[str, str]
    """Case name -> gRPC URL."""
    startup_s: dict[str, float]


@contextlib.contextmanager
def _stack(run: RunDir, cases: Sequence[ServerCase]) -> Iterator[_Stack]:
    """Kafka, PostgreSQL and every server, started side by side; all stopped when the block
    ends, even on failure."""
    services: dict[str, ManagedService[Any]] = {
        "kafka": KafkaService(run),
        "postgres": PostgresService(run),
        **{case.name: case.make(run) for case in cases},
    }

    def timed(service: ManagedService[Any]) -> tuple[Any, float]:
        started = time.monotonic()
        endpoint = service.start()
        return endpoint, time.monotonic() - started

    try:
        with ThreadPoolExecutor(max_workers=len(services)) as pool:
            futures = {name: pool.submit(timed, svc) for name, svc in services.items()}
            results = {name: future.result() for name, future in futures.items()}
        servers: dict[str, str] = {}
        for case in cases:
            endpoint: _GrpcEndpoint = results[case.name][0]
            servers[case.name] = endpoint.grpc_url
        yield _Stack(
            results["kafka"][0],
            results["postgres"][0],
            servers,
            {name: round(seconds, 1) for name, (_, seconds) in results.items()},
        )
    finally:
        for service in services.values():
            service.stop()


async def _publish_backlog(kafka: KafkaEndpoint, topic: str, rows: int, per_message: int) -> None:
    await create_topic(kafka, topic, KAFKA_PARTITIONS)
    await create_topic(kafka, f"{topic}.dlq", 1)
    publisher = KafkaPublisher(kafka.bootstrap_servers, topic)
    await publisher.start()
    try:
        window = PublishWindow(publisher, max_in_flight=256)
        for message in backlog("numeric", rows, per_message, prefix=unique("oip")):
            await window.submit(message)
        await window.drain()
        await publisher.flush()
    finally:
        await publisher.close()


# --- one run -----------------------------------------------------------------------------------


def _config(stack: _Stack, case: str, topic: str, table: str, in_flight: int | None) -> Any:
    model: dict[str, Any] = {"url": stack.servers[case], "name": "scorer"}
    if in_flight is not None:
        model["max_in_flight"] = in_flight
    return {
        "source": {
            "kind": "kafka",
            "bootstrap_servers": stack.kafka.bootstrap_servers,
            "topic": topic,
            "group_id": table,
            "dead_letter_topic": f"{topic}.dlq",
        },
        "model": model,
        "binding": dict(SCORER_BINDING),
        "sink": {"kind": "postgres", "dsn": stack.postgres.dsn, "table": table},
        "log_format": "text",
        "log_level": "WARNING",
    }


def _table_figures(dsn: str, table: str) -> tuple[int, int, float, int]:
    """Rows, distinct ids, seconds from the first ``processed_at`` to the last, and rows at the
    first; then the table is dropped."""
    t = sql.Identifier(table)
    query = sql.SQL(
        "SELECT count(*), count(DISTINCT id), "
        "coalesce(extract(epoch FROM max(processed_at) - min(processed_at)), 0), "
        "count(*) FILTER (WHERE processed_at = (SELECT min(processed_at) FROM {t})) FROM {t}"
    ).format(t=t)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(t))
    assert row is not None
    return int(row[0]), int(row[1]), float(row[2]), int(row[3])


@dataclass
class _Watch:
    """What polling one consumer's ``/metrics`` saw."""

    first_at: float | None = None
    first_rows: float = 0.0
    done_at: float = 0.0
    peak_in_flight: float = 0.0
    last: dict[str, float] | None = None


def _watch(proc: ConsumerProcess, rows: int) -> _Watch:
    seen = _Watch()

    def done() -> bool:
        metrics = proc.metrics() or {}
        written = metrics.get("rowbatch_rows_written_total", 0.0)
        now = time.monotonic()
        seen.peak_in_flight = max(
            seen.peak_in_flight, metrics.get("rowbatch_endpoint_inflight_batches", 0.0)
        )
        if written > 0 and seen.first_at is None:
            seen.first_at, seen.first_rows = now, written
        seen.last, seen.done_at = metrics, now
        return written >= rows

    wait_for(done, RUN_TIMEOUT_S, f"{rows:,} rows written", [proc], every_s=POLL_S)
    return seen


def _one_run(
    stack: _Stack,
    workdir: Path,
    topic: str,
    *,
    rows: int,
    case: str,
    in_flight: int | None,
    rnd: int,
) -> Run:
    table = unique(f"oip_{case.replace('-', '_')}_{setting_label(in_flight)}")
    config = _config(stack, case, topic, table, in_flight)
    started = time.monotonic()
    with consumers(workdir, table, config) as procs:
        proc = procs[0]
        cpu_before = proc.cpu()
        seen = _watch(proc, rows)
        cpu = proc.cpu().total_s - cpu_before.total_s
        proc.terminate()
    in_table, distinct, seconds, at_first = _table_figures(stack.postgres.dsn, table)
    metrics = seen.last or {}
    first_at = seen.first_at if seen.first_at is not None else seen.done_at
    polled_s = seen.done_at - first_at
    return Run(
        case=case,
        in_flight=in_flight,
        round=rnd,
        rows_per_s=round((in_table - at_first) / seconds, 1) if seconds > 0 else 0.0,
        seconds=round(seconds, 3),
        metrics_rows_per_s=round((rows - seen.first_rows) / polled_s, 1) if polled_s else 0.0,
        startup_s=round(first_at - started, 2),
        in_table=in_table,
        distinct_ids=distinct,
        expected=rows,
        requests=int(metrics.get("rowbatch_endpoint_requests_total", 0.0)),
        peak_in_flight=int(seen.peak_in_flight),
        cpu_us_per_row=round(cpu * 1e6 / rows, 2),
        dead_lettered=int(metrics.get("rowbatch_messages_dead_lettered_total", 0.0)),
    )


def _schedule(
    cases: Sequence[ServerCase], settings: Sequence[int | None], rounds: int
) -> list[tuple[int, ServerCase, int | None]]:
    """Every (server, setting) once a round; the order reversed every other round."""
    order = [(case, s) for s in settings for case in cases]
    out = []
    for rnd in range(rounds):
        this = order if rnd % 2 == 0 else order[::-1]
        out += [(rnd, case, s) for case, s in this]
    return out


def _cells(
    cases: Sequence[ServerCase], settings: Sequence[int | None], runs: Sequence[Run]
) -> tuple[Cell, ...]:
    cells = []
    for case in cases:
        for s in settings:
            mine = [r for r in runs if r.case == case.name and r.in_flight == s]
            requests = sum(r.requests for r in mine)
            cells.append(
                Cell(
                    case=case.name,
                    server=case.server,
                    setup=case.setup,
                    in_flight=s,
                    rows_per_s=round(statistics.median(r.rows_per_s for r in mine), 1),
                    rounds_rows_per_s=tuple(r.rows_per_s for r in mine),
                    peak_in_flight=max(r.peak_in_flight for r in mine),
                    rows_per_request=sum(r.in_table for r in mine) / requests if requests else 0,
                    cpu_us_per_row=round(statistics.median(r.cpu_us_per_row for r in mine), 2),
                    every_row_once=all(r.once for r in mine),
                )
            )
    return tuple(cells)


def run(
    cases: Sequence[ServerCase],
    settings: Sequence[int | None] = SETTINGS,
    *,
    rows: int = ROWS,
    rows_per_message: int = ROWS_PER_MESSAGE,
    rounds: int = ROUNDS,
    run_dir: RunDir | None = None,
) -> OipE2eResult:
    run = run_dir or RunDir(REPO_ROOT / ".stack" / "oip-e2e" / time.strftime("%Y%m%d-%H%M%S"))
    run.root.mkdir(parents=True, exist_ok=True)
    print(f"Starting Kafka, PostgreSQL and the servers (logs under {run.root}) ...", flush=True)
    with _stack(run, cases) as stack:
        print(f"  ready: {stack.startup_s}", flush=True)
        topic = unique("oip-e2e").replace("_", "-")
        started = time.monotonic()
        asyncio.run(_publish_backlog(stack.kafka, topic, rows, rows_per_message))
        publish_s = round(time.monotonic() - started, 2)
        print(f"  published {rows:,} rows in {publish_s:.1f} s", flush=True)
        runs: list[Run] = []
        for rnd, case, s in _schedule(cases, settings, rounds):
            done = _one_run(
                stack, run.data("consumers"), topic, rows=rows, case=case.name, in_flight=s, rnd=rnd
            )
            runs.append(done)
            print(
                f"  round {rnd + 1} {case.name:<18} in flight {setting_label(s):<7} "
                f"{rate(done.rows_per_s):>8} rows/s (polled {rate(done.metrics_rows_per_s)}), "
                f"peak {done.peak_in_flight}, start-up {done.startup_s:.1f} s"
                f"{'' if done.once else ', NOT every row once'}",
                flush=True,
            )
    return OipE2eResult(
        rows,
        rows_per_message,
        rounds,
        os.cpu_count() or 1,
        publish_s,
        stack.startup_s,
        tuple(runs),
        _cells(cases, settings, runs),
    )


def _settings(text: str) -> list[int | None]:
    out: list[int | None] = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        if part == "default":
            out.append(None)
        elif part.isdigit() and int(part) >= 1:
            out.append(int(part))
        else:
            raise ValueError(part)
    if not out:
        raise ValueError(text)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench oip_e2e", description=description(__doc__)
    )
    parser.add_argument(
        "--servers",
        default=",".join(CASES),
        help=f"comma-separated servers (default all: {','.join(CASES)})",
    )
    parser.add_argument(
        "--in-flight",
        default="2,4,8,default",
        help="model.max_in_flight settings to compare ('default': unset)",
    )
    parser.add_argument("--rows", type=int, default=ROWS, help=f"backlog rows (default {ROWS:,})")
    parser.add_argument(
        "--rows-per-message",
        type=int,
        default=ROWS_PER_MESSAGE,
        help=f"rows per Kafka message (default {ROWS_PER_MESSAGE})",
    )
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"interleaved rounds (median; default {ROUNDS})"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = sorted(set(names) - set(CASES))
    if unknown or not names:
        parser.error(f"unknown servers {unknown}; choose from {', '.join(CASES)}")
    try:
        settings = _settings(args.in_flight)
    except ValueError as exc:
        parser.error(f"--in-flight: {exc} is not a number >= 1 or 'default'")
    if args.rows < 1 or args.rows_per_message < 1 or args.rounds < 1:
        parser.error("--rows, --rows-per-message and --rounds must be at least 1")
    result = run(
        [CASES[n] for n in names],
        settings,
        rows=args.rows,
        rows_per_message=args.rows_per_message,
        rounds=args.rounds,
    )
    print(result.table().render())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or RESULTS_DIR / f"oip-e2e-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    given = sys.argv[2:] if argv is None else argv
    record = {"command": shlex.join(["python", "-m", "bench", "oip_e2e", *given])}
    out.write_text(json.dumps(record | asdict(result), indent=2) + "\n")
    print(f"\nwritten {out}")
    return 0 if all(c.every_row_once for c in result.cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
