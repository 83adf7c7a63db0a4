"""One lane of the chaos campaign: a topic (with its dead-letter topic) on one broker, a
PostgreSQL result table, a paced publisher thread, and a supervised ``rowbatch-consumer run``
process (restarted when it exits, the exit recorded), watched from the outside: ``/metrics``,
``/proc/<pid>`` and the table's row count, every quarter second."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from google.pubsub_v1 import types as pstypes
from psycopg import sql

from bench.chaos_poison import Planned
from bench.procs import ConsumerProcess, memory_kib
from bench.stack import Broker, Feed, consumer_config, create_feed, publisher
from harness.consumer_process import to_toml
from harness.proc import free_port
from harness.stack import StackEndpoints
from rowbatch.producer.publishers.messages import PublishedChunk
from rowbatch.producer.publishers.window import PublishWindow

MiB = 1024 * 1024
BUDGET_BYTES = 64 * MiB
RSS_ALLOWANCE = 150_000_000
"""Peak RSS may reach ``budget_bytes`` plus this (the README's bound)."""
_SAMPLE_S = 0.25
_RESTART_DELAY_S = 1.0


@dataclass
class Exit:
    code: int | None
    at_s: float
    """Seconds since the lane started."""
    expected: bool
    """Caused by the fault (kill -9), not by the consumer."""
    phase: str


@dataclass
class _Proc:
    proc: ConsumerProcess
    received: float = 0.0
    dead_lettered: float = 0.0
    """Messages dead-lettered whole, and rows dead-lettered as row parts (each row-level
    poison message of the plan has one bad row: one part)."""
    peak_rss: int = 0


@dataclass
class Lane:
    """See the module docstring. ``start`` it, publish, inject, ``wait_done``, ``stop``."""

    stack: StackEndpoints
    workdir: Path
    fault: str
    broker: Broker
    model: str
    binding: dict[str, Any]
    table: str
    feed: Feed = field(init=False)
    dlq_subscription: str = ""
    published: list[Planned] = field(default_factory=list)
    publish_error: str = ""
    error: str = ""
    """What went wrong driving the lane (a timeout waiting for the consumer, ...)."""
    notes: dict[str, Any] = field(default_factory=dict)
    exits: list[Exit] = field(default_factory=list)
    marks: list[tuple[str, float, int]] = field(default_factory=list)
    """(what, monotonic time, rows in the table then): fault events for recovery times."""
    history: list[tuple[float, int]] = field(default_factory=list)
    phase: str = "start"
    completed: bool = False
    _procs: list[_Proc] = field(default_factory=list)
    _lock: threading.RLock = field(default_factory=threading.RLock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _publishing: threading.Event = field(default_factory=threading.Event)
    """Set while the publisher thread runs (until its last message is confirmed)."""
    _halt: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _started: float = field(default_factory=time.monotonic)
    _count: int = 0
    _conn: psycopg.Connection[Any] | None = None

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.feed = create_feed(self.stack, self.broker)
        if self.broker == "pubsub":
            self.dlq_subscription = self.feed.dlq.replace("/topics/", "/subscriptions/") + "-a"
            subscriber = self.stack.pubsub.subscriber()
            try:
                # The emulator hands a killed consumer's dead stream messages that come back
                # only when the subscription's ack deadline runs out (see
                # tests/integration/test_consumer_process.py): 10 s, not create_feed's 60 s.
                try:
                    subscriber.update_subscription(
                        request={
                            "subscription": {
                                "name": self.feed.readers[0],
                                "ack_deadline_seconds": 10,
                            },
                            "update_mask": {"paths": ["ack_deadline_seconds"]},
                        }
                    )
                    self.notes["subscription_ack_deadline_s"] = 10
                except Exception as exc:  # noqa: BLE001 - an emulator without the RPC: 60 s
                    self.notes["subscription_ack_deadline_s"] = f"60 (update failed: {exc})"
                subscriber.create_subscription(
                    request=pstypes.Subscription(
                        name=self.dlq_subscription, topic=self.feed.dlq, ack_deadline_seconds=60
                    )
                )
            finally:
                subscriber.close()

    @property
    def name(self) -> str:
        return f"{self.fault}/{self.broker}"

    def elapsed(self) -> float:
        return time.monotonic() - self._started

    # --- the consumer ----------------------------------------------------------------------

    def config(self) -> dict[str, Any]:
        sink = {"kind": "postgres", "dsn": self.stack.postgres.dsn, "table": self.table}
        config = consumer_config(
            self.stack,
            self.feed,
            self.model,
            self.binding,
            sink,
            model_extra={"max_wait_ms": 50},
            budget_bytes=BUDGET_BYTES,
            shutdown_grace_s=10.0,
        )
        if self.broker == "pubsub":
            config["source"]["max_lease_extension_s"] = 10
        return config

    def _spawn(self) -> None:
        port = free_port()
        label = f"{self.fault}-{self.broker}-{len(self._procs)}"
        path = self.workdir / f"{label}.toml"
        path.write_text(to_toml({**self.config(), "server": {"host": "127.0.0.1", "port": port}}))
        proc = ConsumerProcess(label, path, self.workdir / f"{label}.log", port)
        proc.start()
        self._procs.append(_Proc(proc))

    @property
    def current(self) -> ConsumerProcess:
        return self._procs[-1].proc

    def start(self) -> None:
        with self._lock:
            self._spawn()
        sampler = threading.Thread(target=self._sample_loop, name=f"{self.name}-sampler")
        sampler.start()
        self._threads.append(sampler)

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.current.ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name}: consumer not ready after {timeout_s:.0f} s")
            time.sleep(0.1)

    def kill9(self) -> None:
        """kill -9 the consumer, then start a new one at once (an expected exit)."""
        with self._lock:
            proc = self.current
            if proc.returncode() is None:
                proc.send(signal.SIGKILL)
                code = proc.wait(30)
                self.exits.append(Exit(code, self.elapsed(), True, self.phase))
                proc.stop()
            self.mark("kill -9")
            self._spawn()

    def _watch_exit(self) -> None:
        with self._lock:
            proc = self.current
            code = proc.returncode()
            if code is None:
                return
            self.exits.append(Exit(code, self.elapsed(), False, self.phase))
            proc.stop()
        time.sleep(_RESTART_DELAY_S)  # as a process supervisor would
        with self._lock:
            if not self._stop.is_set():
                self._spawn()

    def _sample_loop(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            self._sample()
            self._watch_exit()

    def _sample(self) -> None:
        with self._lock:
            entries = list(self._procs)
        for entry in entries[-2:]:
            proc = entry.proc
            if proc.proc is None or proc.returncode() is not None:
                continue
            metrics = proc.metrics()
            if metrics is not None:
                entry.received = metrics.get("rowbatch_messages_received_total", entry.received)
                whole = metrics.get("rowbatch_messages_dead_lettered_total")
                rows = metrics.get("rowbatch_rows_dead_lettered_total")
                if whole is not None:
                    entry.dead_lettered = whole + (rows or 0.0)
            with contextlib.suppress(OSError, KeyError):
                entry.peak_rss = max(entry.peak_rss, memory_kib(proc.pid)["VmHWM"] * 1024)
        count = self.count()
        self.history.append((time.monotonic(), count))

    def count(self) -> int:
        """Rows in the result table now (the last known count while PostgreSQL is away)."""
        query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(self.table))
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.stack.postgres.dsn, autocommit=True, connect_timeout=2
                )
            exists = self._conn.execute("SELECT to_regclass(%s)", (self.table,)).fetchone()
            if exists is not None and exists[0] is not None:
                row = self._conn.execute(query).fetchone()
                self._count = int(row[0]) if row else 0
        except psycopg.Error:
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    self._conn.close()
            self._conn = None
        return self._count

    def mark(self, what: str) -> None:
        """A fault event: the recovery time is measured from here to the next row written."""
        self.marks.append((what, time.monotonic(), self.count()))

    def recovery_s(self) -> list[float | None]:
        out: list[float | None] = []
        for _, at, rows in self.marks:
            later = [t for t, c in self.history if t > at and c > rows]
            out.append(round(later[0] - at, 2) if later else None)
        return out

    def received(self) -> float:
        return sum(p.received for p in self._procs)

    def dead_lettered(self) -> float:
        return sum(p.dead_lettered for p in self._procs)

    def peak_rss(self) -> int:
        return max((p.peak_rss for p in self._procs), default=0)

    # --- publishing ------------------------------------------------------------------------

    def publish(self, messages: Iterable[Planned], per_s: float, limit_s: float | None) -> None:
        """Publish ``messages`` at ``per_s`` messages a second in a thread, until they run out,
        ``limit_s`` passes, or :meth:`stop_publishing`."""
        self._publishing.set()
        thread = threading.Thread(
            target=lambda: asyncio.run(self._publish(iter(messages), per_s, limit_s)),
            name=f"{self.name}-publisher",
        )
        thread.start()
        self._threads.append(thread)

    async def _publish(
        self, messages: Iterator[Planned], per_s: float, limit_s: float | None
    ) -> None:
        by_id: dict[str, Planned] = {}

        def done(chunk: PublishedChunk) -> None:
            self.published.append(by_id[chunk.chunk_id])

        started = time.monotonic()
        try:
            async with publisher(self.stack, self.feed) as pub:
                window = PublishWindow(pub, max_in_flight=32, on_done=done)
                for i, planned in enumerate(messages):
                    now = time.monotonic() - started
                    if self._halt.is_set() or (limit_s is not None and now > limit_s):
                        break
                    await asyncio.sleep(max(0.0, i / per_s - now))
                    by_id[planned.chunk_id] = planned
                    await window.submit(planned.message, rows=planned.rows)
                await window.drain()
                await pub.flush()
        except Exception as exc:  # noqa: BLE001 - reported, the lane goes on
            self.publish_error = f"{type(exc).__name__}: {exc}"
        finally:
            self._publishing.clear()

    def stop_publishing(self) -> None:
        """Publish nothing more; what is in flight is still confirmed (see ``publishing``)."""
        self._halt.set()

    def publishing(self) -> bool:
        return self._publishing.is_set()

    # --- the end ---------------------------------------------------------------------------

    def wait_done(self, stall_s: float, deadline_s: float) -> None:
        """Until every good row published is in the table and every poison message is dead-
        lettered, whole or its bad row as a row part (by the consumers' counters), or nothing
        moved for ``stall_s`` once publishing ended, or ``deadline_s`` passed."""
        while self.publishing():
            time.sleep(0.1)
        want_rows = sum(p.rows - p.bad_rows for p in self.published)
        want_dlq = sum(1 for p in self.published if p.kind != "good")  # one letter each
        deadline = time.monotonic() + deadline_s
        last, since = (-1, -1.0), time.monotonic()
        self.phase = "drain"
        while time.monotonic() < deadline:
            now = (self.count(), int(self.dead_lettered()))
            if now[0] >= want_rows and now[1] >= want_dlq:
                self.completed = True
                break
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since > stall_s:
                break
            time.sleep(0.25)
        time.sleep(1.0)  # anything late (a duplicate, a stray dead letter) lands now

    def stop(self) -> None:
        """SIGTERM the consumer (a non-zero exit is recorded), stop the threads."""
        self.stop_publishing()
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        with self._lock:
            proc = self.current
            if proc.returncode() is None:
                code = proc.terminate(30)
                if code != 0:
                    self.exits.append(Exit(code, self.elapsed(), False, "final SIGTERM"))
            for entry in self._procs:
                entry.proc.stop()
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
