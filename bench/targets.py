"""The benchmark targets (end to end against the ceiling, speed-up over the naive consumer on the
same backlog, CPU per row, latency, memory, saturation), checked against whatever sections
ran. Every ratio compares two consumers that did the same work in the same run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.baseline import NaiveResult
from bench.e2e import E2eResult
from bench.latency import LatencyResult
from bench.memory import MemoryResult
from bench.overhead import TARGET_US, OverheadResult
from bench.report import Target, times
from bench.saturation import STEADY_CHUNK_ROWS, SaturationResult
from bench.saturation_server import BATCHED_MODEL
from bench.stack import BROKERS
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
    return (
        found
        + saturation_targets(sections.get("saturation"))
        + table_targets(sections.get("table"))
    )


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


SMALL_MESSAGE_SHARE = {"kafka": 0.6, "pubsub": 0.4}
"""1-row messages: the least share of the measured ceiling, per broker."""
BATCHED_REFERENCE_SPEEDUP = {500: 1.5, 1: 3.0}
"""rowbatch over the reference consumer against the model as deployed (dynamic batching, two
instances), by rows per message. Against the one-instance model without dynamic batching the
1-row ratio is the model's (no one-request-per-message client passes ~125 rows/s), so it has no
target."""


def saturation_targets(sat: object) -> list[Target]:
    """The "keep the model server saturated" targets, against ``fixed_latency`` (none when the
    section did not run)."""
    found: list[Target] = []
    if not isinstance(sat, SaturationResult):
        return found
    for broker in BROKERS:
        for sink in ("postgres", "parquet"):
            big = sat.find(broker, 500, sink)
            if big is not None:
                found.append(
                    Target(
                        f"saturation 500-row {broker} -> {sink}: of ceiling, server busy",
                        ">= 90%, busy >= 90%",
                        f"{big.of_measured:.0%}, busy {big.busy:.0%}",
                        big.of_measured >= 0.9 and big.busy >= 0.9,
                    )
                )
            if big is not None and big.speedup is not None:
                found.append(
                    Target(
                        f"saturation 500-row {broker} -> {sink} vs reference",
                        ">= 1.5x",
                        times(big.speedup, exact=True),
                        big.speedup >= 1.5,
                    )
                )
        one = sat.find(broker, 1)
        if one is not None:
            share = SMALL_MESSAGE_SHARE[broker]
            found.append(
                Target(
                    f"saturation 1-row {broker}: of ceiling",
                    f">= {share:.0%}",
                    f"{one.of_measured:.0%}",
                    one.of_measured >= share,
                )
            )
        for size in (500, 1):
            case = sat.find(broker, size, model=BATCHED_MODEL)
            if case is not None:
                want = BATCHED_REFERENCE_SPEEDUP[size]
                found.append(
                    Target(
                        f"saturation {size}-row {broker} vs reference, {BATCHED_MODEL}",
                        f">= {want:g}x",
                        times(case.speedup, exact=True),
                        (case.speedup or 0.0) >= want,
                    )
                )
        steady = sat.find(broker, STEADY_CHUNK_ROWS, load=0.8)
        if steady is not None and steady.p99_ms is not None:
            found.append(
                Target(
                    f"saturation steady 80% {broker}, {STEADY_CHUNK_ROWS}-row: keeps up, p99",
                    f"yes, <= max_wait + 3 x batch = {steady.p99_bound_ms or 0:,.0f} ms",
                    f"{'yes' if steady.keeps_up else 'no'}, {steady.p99_ms:,.0f} ms",
                    steady.keeps_up is True and steady.p99_ms <= (steady.p99_bound_ms or 0.0),
                )
            )
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
