"""After a lane: what is in the result table and in the dead-letter topic (read with the
brokers' own clients), against what was published, as one :class:`FaultRow`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from aiokafka import AIOKafkaConsumer, TopicPartition
from google.api_core import exceptions as gexc
from psycopg import sql

from bench.chaos_lane import BUDGET_BYTES, RSS_ALLOWANCE, Lane, MiB
from rowbatch.wire.headers.fields import H_CHUNK_ID, H_PARENT_CHUNK_ID

A_REASON = "rowbatch-dlq-reason"
A_CODE = "rowbatch-dlq-code"


@dataclass
class FaultRow:
    fault: str
    broker: str
    topic: str
    table: str
    messages_published: int
    rows_published: int
    rows_expected_written: int
    rows_written: int
    duplicated: int
    """Rows written twice (same id), dead letters repeated, rows both written and
    dead-lettered."""
    missing: int
    """Rows neither written nor dead-lettered (good rows not written; poison lost)."""
    dead_letters_expected: dict[str, int]
    dead_letters_actual: dict[str, int]
    codes_expected: dict[str, int]
    codes_actual: dict[str, int]
    """Only dead letters that carry ``rowbatch-dlq-code``."""
    wrongly_dead_lettered: int
    """Good rows that ended in the dead-letter topic."""
    wrong_reason: int
    """Poison messages dead-lettered with another reason (or code, when one is given)."""
    poison_written: int
    """Poison messages whose rows were written instead of dead-lettered."""
    messages_received: int
    redeliveries: int
    recovery_s: list[float | None]
    marks: list[str]
    exits: list[dict[str, Any]]
    unexpected_exits: int
    peak_rss_mib: float
    rss_limit_mib: float
    completed: bool
    elapsed_s: float
    publish_error: str = ""
    error: str = ""
    failures: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def table_by_chunk(dsn: str, table: str) -> tuple[dict[str, int], int]:
    """Rows per chunk id, and rows whose ``id`` appears more than once."""
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return {}, 0
        ident = sql.Identifier(table)
        rows = conn.execute(
            sql.SQL("SELECT chunk_id, count(*) FROM {} GROUP BY chunk_id").format(ident)
        ).fetchall()
        dup = conn.execute(
            sql.SQL("SELECT count(*) - count(DISTINCT id) FROM {}").format(ident)
        ).fetchone()
    return {str(c): int(n) for c, n in rows}, int(dup[0]) if dup else 0


def read_dlq(lane: Lane) -> list[dict[str, str]]:
    """Every dead-letter record's attributes/headers."""
    if lane.broker == "kafka":
        return asyncio.run(_kafka_dlq(lane.stack.kafka.bootstrap_servers, lane.feed.dlq))
    out: list[dict[str, str]] = []
    subscriber = lane.stack.pubsub.subscriber()
    try:
        empty = 0
        while empty < 2:
            try:
                answer = subscriber.pull(
                    request={"subscription": lane.dlq_subscription, "max_messages": 1000},
                    timeout=3,
                )
            except (gexc.DeadlineExceeded, gexc.RetryError):
                empty += 1
                continue
            if not answer.received_messages:
                empty += 1
                continue
            out += [dict(m.message.attributes) for m in answer.received_messages]
            subscriber.acknowledge(
                request={
                    "subscription": lane.dlq_subscription,
                    "ack_ids": [m.ack_id for m in answer.received_messages],
                }
            )
    finally:
        subscriber.close()
    return out


async def _kafka_dlq(bootstrap: str, topic: str) -> list[dict[str, str]]:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    await consumer.start()
    out: list[dict[str, str]] = []
    try:
        part = TopicPartition(topic, 0)
        consumer.assign([part])
        await consumer.seek_to_beginning(part)
        end = (await consumer.end_offsets([part]))[part]
        deadline = time.monotonic() + 30
        while await consumer.position(part) < end and time.monotonic() < deadline:
            batch = await consumer.getmany(part, timeout_ms=1000)
            for record in batch.get(part, []):
                out.append(
                    {k: (v or b"").decode("utf-8", "replace") for k, v in record.headers or ()}
                )
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()
    return out


def _message_of(letter: dict[str, str]) -> str:
    return letter.get(H_PARENT_CHUNK_ID) or letter.get(H_CHUNK_ID, "?")


def audit(lane: Lane, elapsed_s: float) -> FaultRow:
    published = {p.chunk_id: p for p in lane.published}
    written, dup_ids = table_by_chunk(lane.stack.postgres.dsn, lane.table)
    dlq = read_dlq(lane)
    # A row part names its message in rowbatch-parent-chunk-id; a whole message is its own.
    dlq_by_chunk: Counter[str] = Counter(_message_of(d) for d in dlq)
    good_rows = sum(p.rows - p.bad_rows for p in published.values())
    missing = dup = wrongly = wrong_reason = poison_written = 0
    for chunk_id, planned in published.items():
        rows_in = written.get(chunk_id, 0)
        in_dlq = dlq_by_chunk.get(chunk_id, 0)
        dup += max(0, in_dlq - 1)
        if planned.kind == "good":
            if in_dlq:
                wrongly += planned.rows
                dup += rows_in
            else:
                missing += max(0, planned.rows - rows_in)
            continue
        want_in = planned.rows - planned.bad_rows
        if rows_in > want_in:  # its bad rows written too
            poison_written += 1
        elif want_in and rows_in < want_in:
            missing += want_in - rows_in
        if not in_dlq:
            missing += planned.bad_rows
    unknown = [d for d in dlq if _message_of(d) not in published]
    dup += dup_ids
    expected = Counter(p.reason for p in published.values() if p.reason)
    actual = Counter(d.get(A_REASON, "?") for d in dlq)
    codes_expected = Counter(p.code for p in published.values() if p.code)
    codes_actual = Counter(d[A_CODE] for d in dlq if A_CODE in d)
    for d in dlq:
        planned_or_none = published.get(_message_of(d))
        if planned_or_none is None or planned_or_none.kind == "good":
            continue
        if d.get(A_REASON) != planned_or_none.reason or (
            A_CODE in d and d[A_CODE] != planned_or_none.code
        ):
            wrong_reason += 1
    received = int(lane.received())
    exits = [asdict(e) for e in lane.exits]
    unexpected = sum(1 for e in lane.exits if not e.expected)
    peak = lane.peak_rss()
    limit = BUDGET_BYTES + RSS_ALLOWANCE
    row = FaultRow(
        fault=lane.fault,
        broker=lane.broker,
        topic=lane.feed.topic,
        table=lane.table,
        messages_published=len(published),
        rows_published=sum(p.rows for p in published.values()),
        rows_expected_written=good_rows,
        rows_written=sum(written.values()),
        duplicated=dup,
        missing=missing,
        dead_letters_expected=dict(expected),
        dead_letters_actual=dict(actual),
        codes_expected=dict(codes_expected),
        codes_actual=dict(codes_actual),
        wrongly_dead_lettered=wrongly,
        wrong_reason=wrong_reason,
        poison_written=poison_written,
        messages_received=received,
        redeliveries=max(0, received - len(published)),
        recovery_s=lane.recovery_s(),
        marks=[m[0] for m in lane.marks],
        exits=exits,
        unexpected_exits=unexpected,
        peak_rss_mib=round(peak / MiB, 1),
        rss_limit_mib=round(limit / MiB, 1),
        completed=lane.completed,
        elapsed_s=round(elapsed_s, 1),
        publish_error=lane.publish_error,
        error=lane.error,
        details={
            **lane.notes,
            "dead_letters_unknown": len(unknown),
            "poison_kinds": dict(Counter(p.kind for p in published.values() if p.kind != "good")),
            "dead_letter_samples": [
                {k: v for k, v in d.items() if k.startswith("rowbatch-dlq-")} for d in dlq[:3]
            ],
        },
    )
    row.failures = failures(row)
    return row


def failures(row: FaultRow) -> list[str]:
    out = []
    if row.missing:
        out.append(f"{row.missing} rows missing")
    if row.duplicated:
        out.append(f"{row.duplicated} duplicated")
    if row.wrongly_dead_lettered:
        out.append(f"{row.wrongly_dead_lettered} good rows dead-lettered")
    if row.poison_written:
        out.append(f"{row.poison_written} poison messages written")
    if row.wrong_reason or row.dead_letters_expected != row.dead_letters_actual:
        out.append(
            f"dead letters {row.dead_letters_actual} (expected {row.dead_letters_expected}; "
            f"{row.wrong_reason} with the wrong reason/code)"
        )
    if row.unexpected_exits:
        codes = [e["code"] for e in row.exits if not e["expected"]]
        out.append(f"{row.unexpected_exits} consumer exit(s) not caused by the fault: {codes}")
    if row.peak_rss_mib > row.rss_limit_mib:
        out.append(f"peak RSS {row.peak_rss_mib} MiB over {row.rss_limit_mib} MiB")
    if row.publish_error:
        out.append(f"publishing failed: {row.publish_error}")
    if not row.completed and (row.missing or row.dead_letters_expected != row.dead_letters_actual):
        out.append(
            "the lane did not finish draining (nothing moved for the stall time, or the "
            "deadline passed): the missing rows may still be on the broker"
        )
    if row.error:
        out.append(row.error)
    if not row.messages_published:
        out.append("nothing was published")
    return out
