"""The benchmark targets (end to end against the ceiling, speed-up over the naive consumer on the
same backlog, CPU per row, latency, memory, saturation), checked against whatever sections
ran. Every ratio compares two consumers that did the same work in the same run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.bad_rows import BadRowsResult
from bench.baseline import NaiveResult
from bench.e2e import E2eResult
from bench.generative import GenerativeResult
from bench.latency import LatencyResult
from bench.memory import MemoryResult
from bench.overhead import TARGET_US, OverheadResult
from bench.per_message import PerMessageResult
from bench.queued import QueuedResult
from bench.report import Target, times
from bench.saturation import STEADY, SaturationResult
from bench.saturation_server import BATCHED_MODEL, MODEL
from bench.stack import BROKERS, Broker, SinkKind
from bench.table_mode import TABLE_SHARE_TARGET, TableModeResult


def check_targets(sections: Mapping[str, Any]) -> list[Target]:
    found: list[Target] = []
    e2e = sections.get("e2e")
    if isinstance(e2e, E2eResult):
        for broker in BROKERS:
            run = e2e.find(broker, "postgres")
            if run is not None:
                found.append(
                    Target(
                        f"e2e {broker} -> postgres vs embedder ceiling",
                        ">= 90%",
                        f"{run.ceiling_ratio:.0%} ({run.rows_per_s:,.0f} rows/s)",
                        run.ceiling_ratio >= 0.9,
                    )
                )
    naive = sections.get("naive")
    if isinstance(naive, NaiveResult):
        for broker in BROKERS:
            one = naive.find(broker, 1)
            if one is not None:
                found.append(
                    Target(
                        f"speed-up over naive, same 1-row backlog, {broker}",
                        ">= 10x",
                        times(one.speedup, exact=True),
                        (one.speedup or 0.0) >= 10,
                    )
                )
    over = sections.get("overhead")
    if isinstance(over, OverheadResult):
        for (encoding, kind), limit in TARGET_US.items():
            case = over.find(encoding, kind)
            if case is not None:
                found.append(
                    Target(
                        f"consumer CPU per row, {encoding} {kind}",
                        f"<= {limit:g} us",
                        f"{case.us_per_row:.1f} us",
                        case.us_per_row <= limit,
                    )
                )
    lat = sections.get("latency")
    if isinstance(lat, LatencyResult):
        half = lat.find(0.5)
        if half is not None:
            found.append(
                Target(
                    "p99 at 50% load",
                    f"<= max_wait + 3 x batch = {half.p99_bound_ms:,.0f} ms",
                    f"{half.p99_ms:,.0f} ms",
                    half.p99_ms <= half.p99_bound_ms,
                )
            )
    mem = sections.get("memory")
    if isinstance(mem, MemoryResult):
        found.append(
            Target(
                "peak RSS",
                f"<= budget + 150 MB = {mem.limit_mib:,.0f} MiB",
                f"{mem.peak_rss_mib:,.0f} MiB",
                mem.peak_rss_mib <= mem.limit_mib,
            )
        )
        anon = mem.worst_anon
        found.append(
            Target(
                "peak allocated (RssAnon)",
                f"<= budget + 150 MB = {anon.limit_mib:,.0f} MiB",
                f"{anon.peak_anon_mib:,.0f} MiB",
                anon.peak_anon_mib <= anon.limit_mib,
            )
        )
    queued = sections.get("queued")
    per_message = sections.get("per_message")
    bad_rows = sections.get("bad_rows")
    generative = sections.get("generative")
    return (
        found
        + (bad_rows.targets() if isinstance(bad_rows, BadRowsResult) else [])
        + (generative.targets() if isinstance(generative, GenerativeResult) else [])
        + (per_message.targets() if isinstance(per_message, PerMessageResult) else [])
        + saturation_targets(sections.get("saturation"))
        + table_targets(sections.get("table"))
        + (queued.targets() if isinstance(queued, QueuedResult) else [])
    )


def _full_targets(sat: SaturationResult, broker: Broker) -> list[Target]:
    """16- and 500-row backlogs: the share of the ceiling and the server busy (no target against
    the reference: with the server the bottleneck for both, the ratio is ~1x whatever rowbatch
    does; the share of the ceiling is what measures rowbatch)."""
    found = []
    for size, sink, model in FULL_CASES:
        full = sat.find(broker, size, sink, model=model)
        if full is not None:
            found.append(
                Target(
                    f"saturation {size}-row {broker} -> {sink}, {model}: of ceiling, busy",
                    f">= {FULL_SHARE:.0%}, busy >= {FULL_SHARE:.0%}",
                    f"{full.of_measured:.0%}, busy {full.busy:.0%}",
                    full.of_measured >= FULL_SHARE and full.busy >= FULL_SHARE,
                )
            )
    return found


def _small_targets(sat: SaturationResult, broker: Broker) -> list[Target]:
    """1-row backlogs: the share of the ceiling, the CPU per message, against the reference."""
    found = []
    one = sat.find(broker, 1)
    if one is not None:
        share = SMALL_MESSAGE_SHARE[broker]
        found += [
            Target(
                f"saturation 1-row {broker}: of ceiling",
                f">= {share:.0%}",
                f"{one.of_measured:.0%}",
                one.of_measured >= share,
            ),
            Target(
                f"saturation 1-row {broker}: consumer CPU per message",
                f"<= {SMALL_MESSAGE_CPU_US:g} us",
                f"{one.cpu_us_per_row:,.1f} us",
                one.cpu_us_per_row <= SMALL_MESSAGE_CPU_US,
            ),
        ]
    for size, want in BATCHED_REFERENCE_SPEEDUP.items():
        case = sat.find(broker, size, model=BATCHED_MODEL)
        if case is not None:
            found.append(
                Target(
                    f"saturation {size}-row {broker} vs reference, {BATCHED_MODEL}",
                    f">= {want:g}x",
                    times(case.speedup, exact=True),
                    (case.speedup or 0.0) >= want,
                )
            )
    return found


def _steady_targets(sat: SaturationResult, broker: Broker) -> list[Target]:
    """Steady publishing at 80 % of the ceiling: kept up with, p99 within its bound."""
    found = []
    for size, load in STEADY:
        steady = sat.find(broker, size, load=load)
        if load < 0.8 or steady is None or steady.p99_ms is None:
            continue
        found.append(
            Target(
                f"saturation steady {load:.0%} {broker}, {size}-row: keeps up, p99",
                f"yes, <= max_wait + 3 x batch = {steady.p99_bound_ms or 0:,.0f} ms",
                f"{'yes' if steady.keeps_up else 'no'}, {steady.p99_ms:,.0f} ms",
                steady.keeps_up is True and steady.p99_ms <= (steady.p99_bound_ms or 0.0),
            )
        )
    return found


def table_targets(table: object) -> list[Target]:
    """The table mode's target (none when the section did not run)."""
    way = table.find("table") if isinstance(table, TableModeResult) else None
    if way is None:
        return []
    return [
        Target(
            "table mode: of measured ceiling (one process)",
            f">= {TABLE_SHARE_TARGET:.0%}",
            f"{way.of_measured:.0%}",
            way.of_measured >= TABLE_SHARE_TARGET,
        )
    ]


SMALL_MESSAGE_SHARE = {"kafka": 0.9, "pubsub": 0.6}
"""1-row messages: the least share of the measured ceiling, per broker (issue 24)."""
SMALL_MESSAGE_CPU_US = 30.0
"""1-row messages: the most consumer CPU (user + system, all threads) per message (issue 24)."""
FULL_SHARE = 0.95
"""16- and 500-row messages: the least share of the measured ceiling, and of the server busy."""
BATCHED_REFERENCE_SPEEDUP = {1: 3.0}
"""rowbatch over the reference consumer against the model as deployed (dynamic batching, two
instances), by rows per message: 1-row messages only. No target where the ratio cannot say
anything about rowbatch: against the one-instance model without dynamic batching the 1-row
ratio is the model's (a one-request-per-message client cannot pass ~125 rows/s, so any batching
consumer is >= 10x), and with 500-row messages the server is the bottleneck for both consumers
(~1x, so a ">= 1.5x" could never be met); the share of the ceiling and the CPU per message are
the targets that measure rowbatch there."""


FULL_CASES: tuple[tuple[int, SinkKind, str], ...] = (
    (500, "postgres", MODEL),
    (500, "parquet", MODEL),
    (16, "postgres", MODEL),
    (500, "postgres", BATCHED_MODEL),
)
"""(rows per message, sink, model) of the backlogs that should keep the server busy."""


def saturation_targets(sat: object) -> list[Target]:
    """The "keep the model server saturated" targets, against ``fixed_latency`` (none when the
    section did not run)."""
    found: list[Target] = []
    if not isinstance(sat, SaturationResult):
        return found
    for broker in BROKERS:
        found += _full_targets(sat, broker)
        found += _small_targets(sat, broker)
        found += _steady_targets(sat, broker)
    if sat.cases:
        peak = max(c.peak_rss_mib for c in sat.cases)
        found.append(
            Target(
                "saturation peak RSS (all cases)",
                f"<= budget + 150 MB = {sat.rss_limit_mib:,.0f} MiB",
                f"{peak:,.0f} MiB",
                peak <= sat.rss_limit_mib,
            )
        )
    return found
