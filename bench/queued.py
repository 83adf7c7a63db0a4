"""Section ``queued``: a million 1-row messages queued on Kafka before one consumer starts
(issue 24's memory target): the source may read as far ahead as the broker lets it, and the
budget alone holds it back. One consumer (``scorer``, numeric rows in Arrow, SQLite, a 64 MiB
budget) drains the backlog; peak RSS (``VmHWM``, the libraries' pages included) against
budget + 150 MB, its RSS once ready, the in-flight gauge's peak and the pace.

Not part of the default run (publishing a million messages takes a few minutes):
``python -m bench --only queued``."""

from __future__ import annotations

from dataclasses import dataclass

from bench.memory import ALLOWANCE_MB, SmallMessagesResult, run_small_messages
from bench.report import Table, Target
from bench.stack import Bench
from rowbatch.consumer.section import MiB
from rowbatch.wire.headers.fields import Encoding

MESSAGES = 1_000_000
QUICK_MESSAGES = 20_000
BUDGET = 64 * MiB


@dataclass(frozen=True)
class QueuedResult:
    run: SmallMessagesResult

    @property
    def limit_mib(self) -> float:
        return self.run.budget_mib + ALLOWANCE_MB * 1e6 / MiB

    def table(self) -> Table:
        r = self.run
        return Table(
            "Queued: a backlog of 1-row messages on Kafka, drained by one consumer (MiB)",
            (
                "messages",
                "budget",
                "ready",
                "peak",
                "peak-ready",
                "limit",
                "peak<=limit",
                "in flight max",
                "msgs/s",
                "seconds",
            ),
            (
                (
                    f"{r.messages:,}",
                    f"{r.budget_mib:.0f}",
                    f"{r.baseline_rss_mib:.0f}",
                    f"{r.peak_rss_mib:.0f}",
                    f"{r.over_mib:.0f}",
                    f"{self.limit_mib:.0f}",
                    "yes" if r.peak_rss_mib <= self.limit_mib else "NO",
                    f"{r.peak_inflight_mib:.1f}",
                    f"{r.rows_per_s:,.0f}",
                    f"{r.seconds:,.0f}",
                ),
            ),
            (
                "Every message published (6 partitions, Arrow: an int64 and a float32[16] per "
                "row) before the consumer starts; model scorer, sink SQLite; peak: VmHWM; "
                "ready: VmRSS once /readyz; limit: budget + 150 MB; in flight max: highest "
                "rowbatch_inflight_bytes sampled (every 20 ms); msgs/s from the first row "
                "written to the last.",
            ),
        )

    def targets(self) -> list[Target]:
        r = self.run
        return [
            Target(
                f"{r.messages:,} queued 1-row messages ({r.broker}): peak RSS",
                f"<= budget + 150 MB = {self.limit_mib:,.0f} MiB",
                f"{r.peak_rss_mib:,.0f} MiB",
                r.peak_rss_mib <= self.limit_mib,
            )
        ]


def run(bench: Bench) -> QueuedResult:
    messages = QUICK_MESSAGES if bench.quick else MESSAGES
    return QueuedResult(
        run_small_messages(bench, "kafka", messages, budget=BUDGET, encoding=Encoding.ARROW)
    )
