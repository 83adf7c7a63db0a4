"""A rollout's series (``[model.candidate]``): rows per arm and outcome, request latency per
arm, the shadow's agreement per output and its backlog. Exported only when a candidate is
configured; every series exists from the start (at 0)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

ARMS = ("production", "candidate")
OUTCOMES = ("answered", "failed", "skipped", "unwritten", "dropped")
"""``answered``: the arm's model answered the rows; ``failed``: it did not (a shadow's
candidate: written to the comparison table with the error; a canary's arm: rows dead-lettered,
written as error rows, or nacked with their message); ``skipped``: the shadow's backlog was
full or its candidate is not up; ``unwritten``: the comparison table refused the write;
``dropped``: still waiting when the consumer stopped."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RolloutMetrics:
    def __init__(self, registry: CollectorRegistry, mode: str, outputs: Iterable[str]) -> None:
        self.rows = Counter(
            "rowbatch_rollout_rows",
            "Rows per arm of a rollout ([model.candidate]) and what became of them",
            ["mode", "arm", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "rowbatch_rollout_inference_seconds",
            "A rollout arm's requests, from sending to the answer (a shadow's candidate: "
            "successful or not; the production arm: its batch's inference, isolation included)",
            ["mode", "arm"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.agreement = Counter(
            "rowbatch_rollout_agreement_rows",
            "A shadow's rows by whether the candidate's output agrees with production's "
            "(exact; floats within 1e-6 of it)",
            ["output", "agree"],
            registry=registry,
        )
        self.backlog = Gauge(
            "rowbatch_rollout_backlog_rows",
            "Rows a shadow holds for its candidate (answered by production, not yet by the "
            "candidate or not yet in the comparison table)",
            registry=registry,
        )
        self.mode = mode
        for arm in ARMS:
            self.seconds.labels(mode, arm)
            for outcome in OUTCOMES:
                self.rows.labels(mode, arm, outcome)
        for output in outputs:
            for agree in ("true", "false"):
                self.agreement.labels(output, agree)

    def counted(self, arm: str, outcome: str, rows: int) -> None:
        self.rows.labels(self.mode, arm, outcome).inc(rows)

    def timed(self, arm: str, seconds: float) -> None:
        self.seconds.labels(self.mode, arm).observe(seconds)
