"""Section 4, overhead: the consumer process's own CPU per row against models that do no work
(``noop_text``, ``noop_numeric``), for JSON and Arrow chunks of text and numeric rows (Kafka,
PostgreSQL sink); then a py-spy profile of two of those cases broken down by stage."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bench.procs import CpuTimes, consumers, drain, wait_ready
from bench.profile import STAGES, Profile, breakdown, recording
from bench.report import Table
from bench.stack import (
    NOOP_NUMERIC_BINDING,
    TEXT_BINDING,
    Bench,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    unique,
)
from harness.service import REPO_ROOT
from rowbatch.producer.loadgen.spec import LoadKind
from rowbatch.wire.headers.fields import Encoding

CHUNK_ROWS = 1000
IDLE_S = 1.0
CASES: tuple[tuple[str, LoadKind], ...] = (
    ("json", "text"),
    ("arrow", "text"),
    ("json", "numeric"),
    ("arrow", "numeric"),
)
PROFILED: tuple[tuple[str, LoadKind], ...] = (("json", "text"), ("arrow", "numeric"))
TARGET_US = {("arrow", "numeric"): 20.0, ("json", "text"): 40.0}


@dataclass(frozen=True)
class CpuPerRow:
    encoding: str
    kind: str
    rows: int
    user_s: float
    sys_s: float
    seconds: float
    us_per_row: float
    """(user + sys) CPU of the consumer process while it consumed, per row."""
    idle_us_per_row: float
    """The part of it the process would have spent idle over the same time (measured
    before publishing): timers, lag polls, metrics."""
    rows_per_s: float


@dataclass(frozen=True)
class OverheadResult:
    broker: str
    sink: str
    chunk_rows: int
    cases: tuple[CpuPerRow, ...]
    profiles: tuple[Profile, ...]

    def find(self, encoding: str, kind: str) -> CpuPerRow | None:
        return next((c for c in self.cases if (c.encoding, c.kind) == (encoding, kind)), None)

    def table(self) -> Table:
        rows = [
            (
                f"{c.encoding} {c.kind}",
                f"{c.rows:,}",
                f"{c.us_per_row:.1f}",
                f"{c.idle_us_per_row:.1f}",
                f"{c.user_s:.2f} / {c.sys_s:.2f}",
                f"{c.rows_per_s:,.0f}",
                f"<= {TARGET_US[(c.encoding, c.kind)]:g}"
                if (c.encoding, c.kind) in TARGET_US
                else "",
            )
            for c in self.cases
        ]
        notes = [
            f"Kafka -> {self.sink}, no-op models, chunks of {self.chunk_rows} rows; CPU = "
            "user+sys of the consumer process (/proc/<pid>/stat) from just before the backlog "
            "was published until its last row was written.",
        ]
        for p in self.profiles:
            if p.error:
                notes.append(f"profile {p.case}: unavailable ({p.error})")
                continue
            shares = "  ".join(f"{s} {p.share.get(s, 0.0):.0%}" for s in STAGES)
            notes.append(f"profile {p.case} ({p.samples} samples): {shares}")
        return Table(
            "4. Overhead: consumer CPU per row, model doing no work",
            ("chunks", "rows", "us/row", "of it idle", "user/sys s", "rows/s", "target"),
            tuple(rows),
            tuple(notes),
        )


def _case(
    bench: Bench, encoding: str, kind: LoadKind, rows: int, profile_to: str | None
) -> tuple[CpuPerRow, Profile | None]:
    feed = create_feed(bench.stack, "kafka")
    table = unique(f"overhead_{encoding}_{kind}")
    model, binding = (
        ("noop_text", TEXT_BINDING) if kind == "text" else ("noop_numeric", NOOP_NUMERIC_BINDING)
    )
    sink: Mapping[str, Any] = {"kind": "postgres", "dsn": bench.stack.postgres.dsn, "table": table}
    config = consumer_config(bench.stack, feed, model, binding, sink)
    messages = backlog(kind, rows, CHUNK_ROWS, Encoding.parse(encoding), prefix=unique("ovh"))
    profile: Profile | None = None
    with consumers(bench.dir("overhead"), table, config) as procs:
        wait_ready(procs)
        proc = procs[0]
        idle0 = proc.cpu()
        time.sleep(IDLE_S)
        idle = proc.cpu().total_s - idle0.total_s
        cpu0, started = proc.cpu(), time.monotonic()
        if profile_to is None:
            publish(bench.stack, feed, messages)
            drained = drain(procs, rows, started)
        else:
            out = bench.dir("profile") / f"{table}.txt"
            with recording(proc.pid, out) as errors:
                publish(bench.stack, feed, messages)
                drained = drain(procs, rows, started)
            profile = _profile(profile_to, out, errors)
        cpu1, elapsed = proc.cpu(), time.monotonic() - started
        proc.terminate()
    written = count_rows(bench, "postgres", table)
    remove_table(bench, "postgres", table)
    if written != rows:
        raise RuntimeError(f"overhead {encoding} {kind}: {written} of {rows} rows in the sink")
    used = CpuTimes(cpu1.user_s - cpu0.user_s, cpu1.sys_s - cpu0.sys_s)
    return (
        CpuPerRow(
            encoding,
            kind,
            rows,
            round(used.user_s, 3),
            round(used.sys_s, 3),
            round(elapsed, 2),
            used.total_s / rows * 1e6,
            idle / IDLE_S * elapsed / rows * 1e6,
            drained.rows_per_s,
        ),
        profile,
    )


def _profile(case: str, out: Any, errors: list[str]) -> Profile:
    if errors:
        return Profile(case, 0, {}, "; ".join(errors))
    counts = breakdown(out.read_text(), str(REPO_ROOT))
    total = sum(counts.values())
    share = {k: v / total for k, v in counts.items()} if total else {}
    return Profile(case, total, share)


def run(bench: Bench, profile: bool = True) -> OverheadResult:
    rows = 5_000 if bench.quick else 100_000
    cases, profiles = [], []
    for encoding, kind in CASES:
        cases.append(_case(bench, encoding, kind, rows, None)[0])
    if profile:
        for encoding, kind in PROFILED:
            _, found = _case(bench, encoding, kind, rows, f"{encoding} {kind}")
            if found is not None:
                profiles.append(found)
    return OverheadResult("kafka", "postgres", CHUNK_ROWS, tuple(cases), tuple(profiles))
