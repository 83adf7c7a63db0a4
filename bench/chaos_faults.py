"""The faults of the chaos campaign. Faults on a lane's own resources (kill -9 of its consumer,
a slow result table, poison on its topic) run side by side; faults on the shared services
(Triton, PostgreSQL) run one at a time, every broker's lane riding through the same outage."""

from __future__ import annotations

import random
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from bench.chaos_audit import FaultRow, audit
from bench.chaos_lane import Lane
from bench.chaos_poison import (
    BYTES_BINDING,
    POISON_BINDING,
    SCORER_BINDING,
    Planned,
    bytes_plan,
    numeric_stream,
    poison_plan,
)
from bench.stack import Broker
from harness.faults import FaultStack
from rowbatch.wire.chunks.decode import decode_chunk

LOCAL_FAULTS = ("kill-9", "slow-sink", "poison", "bytes-column")
SHARED_FAULTS = ("triton-sigterm", "triton-sigkill", "postgres-restart")
FAULTS = (*LOCAL_FAULTS, *SHARED_FAULTS)


@dataclass(frozen=True)
class Sizes:
    kills: int
    triton_repeats: int
    triton_down_s: float
    postgres_down_s: float
    lock_s: float
    poison_each: int
    poison_good: int
    bytes_messages: int
    stall_s: float
    """A lane is finished when nothing moved this long after publishing ended..."""
    deadline_s: float
    """... or this long after publishing ended, whatever happens."""
    per_s: float = 20.0
    """Messages a second per lane (100 rows each: 2,000 rows/s)."""
    chunk_rows: int = 100


# The Pub/Sub emulator keeps a killed consumer's streaming pull registered and hands it messages
# in ~10 s rounds with even odds each (see tests/integration/test_consumer_process.py), so a
# drain after kill -9 may stand still for several rounds: the stall limit allows six.
SHORT = Sizes(2, 1, 1.0, 3.0, 2.0, 1, 24, 8, stall_s=60.0, deadline_s=180.0)
FULL = Sizes(10, 3, 3.0, 10.0, 8.0, 3, 100, 30, stall_s=60.0, deadline_s=300.0)


@dataclass
class Campaign:
    fs: FaultStack
    workdir: Path
    sizes: Sizes
    seed: int

    def lane(self, fault: str, broker: Broker, model: str, binding: dict[str, Any]) -> Lane:
        table = f"chaos_{fault.replace('-', '_')}_{broker}_{uuid.uuid4().hex[:6]}"
        return Lane(self.fs.endpoints, self.workdir / fault, fault, broker, model, binding, table)

    def rng(self, *parts: str) -> random.Random:
        return random.Random("-".join([str(self.seed), *parts]))  # noqa: S311 - not crypto

    def drain(self, lane: Lane) -> None:
        lane.wait_done(self.sizes.stall_s, self.sizes.deadline_s)


Script = Callable[[Lane], None]


def _run(jobs: list[tuple[Lane, Script]]) -> list[FaultRow]:
    """Each lane's script in its own thread; then stop and audit every lane."""
    rows: dict[int, FaultRow] = {}

    def one(i: int, lane: Lane, script: Script) -> None:
        started = time.monotonic()
        try:
            script(lane)
        except Exception as exc:  # noqa: BLE001 - the lane is still audited
            lane.error = f"{type(exc).__name__}: {exc}"
            traceback.print_exc()
        finally:
            lane.stop()
        rows[i] = audit(lane, time.monotonic() - started)

    threads = [
        threading.Thread(target=one, args=(i, lane, script), name=lane.name)
        for i, (lane, script) in enumerate(jobs)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [rows[i] for i in sorted(rows)]


def _flowing(lane: Lane, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while lane.count() == 0:
        lane.current.check_alive("its first rows")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{lane.name}: no rows written after {timeout_s:.0f} s")
        time.sleep(0.1)


def _numeric(c: Campaign, lane: Lane) -> None:
    prefix = f"{lane.fault}-{lane.broker}-{uuid.uuid4().hex[:6]}"
    lane.publish(numeric_stream(prefix, c.sizes.chunk_rows), c.sizes.per_s, None)


# --- faults on a lane's own resources ----------------------------------------------------------


def kill9(c: Campaign, broker: Broker) -> tuple[Lane, Script]:
    rng = c.rng("kill-9", broker)

    def script(lane: Lane) -> None:
        lane.start()
        lane.wait_ready()
        _numeric(c, lane)
        for k in range(c.sizes.kills):
            lane.phase = f"kill {k + 1}"
            lane.wait_ready()
            time.sleep(rng.uniform(0.2, 2.5))
            lane.kill9()
        lane.phase = "after the kills"
        lane.wait_ready()
        time.sleep(2.0)  # rows published after the last restart too
        lane.stop_publishing()
        c.drain(lane)

    return c.lane("kill-9", broker, "scorer", SCORER_BINDING), script


def slow_sink(c: Campaign, broker: Broker) -> tuple[Lane, Script]:
    def script(lane: Lane) -> None:
        lane.start()
        lane.wait_ready()
        _numeric(c, lane)
        _flowing(lane)
        dsn = lane.stack.postgres.dsn
        table = sql.Identifier(lane.table)
        func = sql.Identifier(f"{lane.table}_slow")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE FUNCTION {}() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$"
                ).format(func)
            )
            conn.execute(
                sql.SQL(
                    "CREATE TRIGGER slow BEFORE INSERT ON {} FOR EACH STATEMENT "
                    "EXECUTE FUNCTION {}()"
                ).format(table, func)
            )
        lane.phase = "slow trigger"
        time.sleep(3.0)
        with psycopg.connect(dsn) as conn:
            conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))
            lane.phase = "table locked"
            time.sleep(c.sizes.lock_s)
        lane.mark("lock released")
        lane.phase = "slow trigger"
        lane.notes["slow_sink"] = {"pg_sleep_per_statement_s": 0.05, "lock_s": c.sizes.lock_s}
        time.sleep(3.0)
        lane.stop_publishing()
        c.drain(lane)

    return c.lane("slow-sink", broker, "scorer", SCORER_BINDING), script


def poison(c: Campaign, broker: Broker) -> tuple[Lane, Script]:
    def script(lane: Lane) -> None:
        lane.start()
        lane.wait_ready()
        prefix = f"poison-{broker}-{uuid.uuid4().hex[:6]}"
        plan = poison_plan(prefix, c.sizes.poison_good, c.sizes.poison_each, 50, c.seed)
        lane.publish(plan, c.sizes.per_s / 2, None)
        c.drain(lane)

    return c.lane("poison", broker, "chaos", POISON_BINDING), script


def bytes_column(c: Campaign, broker: Broker) -> tuple[Lane, Script]:
    def script(lane: Lane) -> None:
        lane.start()
        lane.wait_ready()
        prefix = f"bytes-{broker}-{uuid.uuid4().hex[:6]}"
        plan = bytes_plan(prefix, c.sizes.bytes_messages, 50, c.seed)
        lane.publish(plan, c.sizes.per_s, None)
        c.drain(lane)
        _check_bytes(lane, plan)

    return c.lane("bytes-column", broker, "embedder", BYTES_BINDING), script


def _check_bytes(lane: Lane, plan: list[Planned]) -> None:
    """The ``blob`` column is ``bytea`` and holds exactly the bytes sent (nulls as NULL)."""
    sent: dict[int, bytes | None] = {}
    for planned in plan:
        chunk = decode_chunk(planned.message.payload, planned.message.attributes)
        blobs = chunk.columns["blob"].tolist()
        masks = chunk.null_masks.get("blob")
        for i, row_id in enumerate(chunk.columns["id"].tolist()):
            sent[int(row_id)] = None if masks is not None and masks[i] else blobs[i]
    with psycopg.connect(lane.stack.postgres.dsn) as conn:
        kind = conn.execute(
            "SELECT data_type FROM information_schema.columns "
            "WHERE table_name = %s AND column_name = 'blob'",
            (lane.table,),
        ).fetchone()
        if kind is None:
            lane.error = "no blob column in the result table"
            return
        stored = conn.execute(
            sql.SQL("SELECT id, blob FROM {}").format(sql.Identifier(lane.table))
        ).fetchall()
    wrong = sum(1 for row_id, blob in stored if sent.get(int(row_id)) != (
        None if blob is None else bytes(blob)))  # fmt: skip
    lane.notes["blob_column"] = {"type": kind[0], "rows_checked": len(stored), "differ": wrong}
    if kind[0] != "bytea" or wrong:
        lane.error = f"blob column is {kind[0]}; {wrong} of {len(stored)} values differ"


LOCAL: dict[str, Callable[[Campaign, Broker], tuple[Lane, Script]]] = {
    "kill-9": kill9,
    "slow-sink": slow_sink,
    "poison": poison,
    "bytes-column": bytes_column,
}


def run_local(c: Campaign, faults: tuple[str, ...], brokers: tuple[Broker, ...]) -> list[FaultRow]:
    return _run([LOCAL[f](c, b) for f in LOCAL_FAULTS if f in faults for b in brokers])


# --- faults on the shared services -------------------------------------------------------------


def run_shared(c: Campaign, fault: str, brokers: tuple[Broker, ...]) -> list[FaultRow]:
    """Every broker's lane through the same outage(s) of Triton or PostgreSQL."""
    lanes = [c.lane(fault, b, "scorer", SCORER_BINDING) for b in brokers]
    outages: list[dict[str, Any]] = []
    ready = threading.Barrier(len(lanes) + 1)
    gone = threading.Event()

    def script(lane: Lane) -> None:
        try:
            lane.start()
            lane.wait_ready()
            _numeric(c, lane)
            _flowing(lane)
        finally:
            ready.wait()
        gone.wait()
        lane.stop_publishing()
        c.drain(lane)

    def inject() -> None:
        ready.wait()
        try:
            repeats = 1 if fault == "postgres-restart" else c.sizes.triton_repeats
            for r in range(repeats):
                time.sleep(2.0)
                for lane in lanes:
                    lane.phase = f"outage {r + 1}"
                outages.append(_outage(c, fault))
                for lane in lanes:
                    lane.mark(f"{fault} {r + 1}: back")
                    lane.phase = "after the outage"
            time.sleep(3.0)  # rows published after the service is back
        finally:
            for lane in lanes:
                lane.notes["outages"] = outages
            gone.set()

    injector = threading.Thread(target=inject, name=f"{fault}-inject")
    injector.start()
    try:
        return _run([(lane, script) for lane in lanes])
    finally:
        injector.join()


def _outage(c: Campaign, fault: str) -> dict[str, Any]:
    if fault == "postgres-restart":
        stop_s = c.fs.postgres.interrupt(signal.SIGINT)
        time.sleep(c.sizes.postgres_down_s)
        start_s = c.fs.postgres.resume()
        return {"signal": "SIGINT", "stop_s": round(stop_s, 2), "down_s": c.sizes.postgres_down_s,
                "start_s": round(start_s, 2)}  # fmt: skip
    sig = signal.SIGTERM if fault == "triton-sigterm" else signal.SIGKILL
    stop_s = c.fs.triton.interrupt(sig)
    time.sleep(c.sizes.triton_down_s)
    start_s = c.fs.triton.resume()
    return {"signal": sig.name, "stop_s": round(stop_s, 2), "down_s": c.sizes.triton_down_s,
            "start_s": round(start_s, 2)}  # fmt: skip
