"""Issue 6's targets, checked against whatever sections ran."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bench.baseline import NaiveResult
from bench.e2e import E2eResult
from bench.latency import LatencyResult
from bench.memory import MemoryResult
from bench.overhead import TARGET_US, OverheadResult
from bench.report import Target
from bench.stack import BROKERS


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
            if one is not None and one.speedup is not None:
                found.append(
                    Target(
                        f"speed-up over naive, 1-row messages, {broker}",
                        ">= 10x",
                        f"{one.speedup:.1f}x",
                        one.speedup >= 10,
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
    return found
