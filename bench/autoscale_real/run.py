"""One burst on the real stack under the test-only controller (``controller.py`` here):
the plans, the consumers' and controller's settings, what the run measured, and the checks it
must pass (replicas rise, the backlog drains, every row is written once, the replicas come back
to the minimum, no flapping while steady)."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from bench.autoscale_real.controller import (
    DESIRED_REPLICAS,
    REPLICA_LOAD,
    Autoscaler,
    ControllerSettings,
    ScaleEvent,
    reversals,
)
from bench.autoscale_real.stack import (
    Broker,
    PacedPublisher,
    Phase,
    Plan,
    Services,
    consumer_config,
    count_rows,
    create_feed,
    drop_table,
    executed_rows,
    read_written,
)
from harness.consumer_process import ConsumerProcess, to_toml
from harness.proc import free_port

SHORT_PLAN = Plan((Phase(8, 400), Phase(10, 5_000, burst=True), Phase(62, 400)))
"""The integration test's: 50,000 rows in 10 s, 9x what one consumer drains within its 3 s
target latency, arriving 2.5x as fast as one drains."""
LONG_PLAN = Plan(
    (
        Phase(30, 400),
        Phase(20, 5_000, burst=True),
        Phase(110, 400),
        Phase(10, 5_500, burst=True),
        Phase(110, 400),
    )
)
REPEATED_MAX = 0.02
"""Rows the server may execute twice (a revoked Kafka member's batch in flight)."""


@dataclass(frozen=True)
class Setup:
    """How the consumers and the controller are configured (real seconds)."""

    controller: ControllerSettings = field(default_factory=ControllerSettings)
    """The controller's bounds, pace and behaviour; its metric is chosen per broker."""
    target_latency_s: float = 3.0
    """The consumers' ``target_latency_s``: at time scale 10, the HPA's 30 s."""
    rows_per_s_per_replica: float = 1_800.0
    """The consumers' ``rows_per_s_per_replica`` (one request of 200 rows per 100 ms, less
    the consumer's own time per request)."""
    gauge_interval_s: float = 1.0
    """How often the consumers recompute the figure (Kafka: ``lag_interval_s``)."""
    with_rate: bool = True
    """For the simulator: whether the consumers' figure has the rate term."""
    settle_s: float = 60.0
    """After the plan, how long to wait for the backlog to drain and the replicas to reach
    the minimum."""

    def autoscaling(self, broker: Broker) -> dict[str, Any]:
        """The consumers' ``[source]`` settings for the figure; rates are means over the
        HPA's minute, scaled like the rest."""
        out: dict[str, Any] = {
            "target_latency_s": self.target_latency_s,
            "rows_per_s_per_replica": self.rows_per_s_per_replica,
            "rate_window_s": 60.0 / self.controller.time_scale,
        }
        if broker == "kafka":
            out["lag_interval_s"] = self.gauge_interval_s
        else:
            out["max_replicas"] = self.controller.max_replicas
        return out

    def controller_for(self, broker: Broker) -> ControllerSettings:
        """Kafka: ``max(rowbatch_desired_replicas)`` as an External metric (each replica
        sees the group); Pub/Sub: ``rowbatch_replica_load`` as a Pods metric (each replica
        sees its share)."""
        metric = DESIRED_REPLICAS if broker == "kafka" else REPLICA_LOAD
        return dataclasses.replace(self.controller, metric=metric)


@dataclass(frozen=True)
class Sample:
    """At one sync, seconds from the first publish."""

    at_s: float
    figure: float | None
    replicas: int
    ready: int
    published: int
    written: int

    def drained(self, message_rows: int) -> bool:
        """No more waits than the message in flight under steady load."""
        return self.published - self.written <= message_rows


@dataclass(frozen=True)
class RealRun:
    """One burst on the real stack: what was published and written, what the controller did.
    Times are seconds from the first publish."""

    broker: Broker
    plan: Plan
    setup: Setup
    published: int
    written: int
    distinct_ids: int
    ids_complete: bool
    executed: int
    """Rows the model server executed during the run."""
    p50_s: float
    p99_s: float
    max_s: float
    late: float
    """Share of rows later than ``target_latency_s``."""
    replica_seconds: float
    """Replicas asked for, over the plan's duration."""
    events: tuple[ScaleEvent, ...]
    samples: tuple[Sample, ...]
    sent: tuple[tuple[float, int], ...]
    startup_s: tuple[float, ...]
    """Per replica started: from asked for to ``/readyz``."""
    rows_per_s_per_replica: float
    """Measured: rows/s per ready replica while all had work."""
    write_pause_s: float
    """Measured: the longest time nothing was written while rows waited (from the first
    burst to the drain): on Kafka, a rebalance."""
    exit_codes: tuple[int | None, ...]
    final_replicas: int

    @property
    def peak(self) -> int:
        return max((s.replicas for s in self.samples), default=0)

    @property
    def reversals(self) -> int:
        return reversals(list(self.events))

    def drained_at_s(self) -> float | None:
        """When, after the last burst, no more than the message in flight waited."""
        last_burst_end = max(end for _, end, p in self.plan.windows() if p.burst)
        return next(
            (
                s.at_s
                for s in self.samples
                if s.at_s >= last_burst_end and s.drained(self.plan.rows_per_message)
            ),
            None,
        )

    def back_to_min_at_s(self) -> float | None:
        """The last scale event, if it left the minimum."""
        floor = self.setup.controller.min_replicas
        if not self.events or self.events[-1].after != floor:
            return None
        return self.events[-1].at_s

    def checks(self) -> dict[str, bool]:
        """What the run must show."""
        first_burst = min(start for start, _, p in self.plan.windows() if p.burst)
        bursts = sum(1 for p in self.plan.phases if p.burst)
        back = self.back_to_min_at_s()
        return {
            "replicas rose": self.peak >= 2,
            "backlog drained": self.drained_at_s() is not None,
            "every row written once": self.written == self.published == self.distinct_ids
            and self.ids_complete,
            f"under {REPEATED_MAX:.0%} executed twice": 0
            <= self.executed - self.published
            <= REPEATED_MAX * self.published,
            "back to the minimum": back is not None
            and self.final_replicas == self.setup.controller.min_replicas,
            "still while steady": all(e.at_s >= first_burst for e in self.events)
            and self.reversals <= 2 * bursts - 1,
            "replicas exited cleanly": all(code == 0 for code in self.exit_codes),
        }


def _spawner(
    workdir: Path, config: dict[str, Any], env: dict[str, str]
) -> Callable[[int], ConsumerProcess]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")} | env

    def spawn(index: int) -> ConsumerProcess:
        port = free_port()
        path = workdir / f"consumer-{index}.toml"
        path.write_text(to_toml({**config, "server": {"host": "127.0.0.1", "port": port}}))
        log = workdir / f"consumer-{index}.log"
        proc = ConsumerProcess(f"consumer-{index}", path, log, port, base)
        proc.start()
        return proc

    return spawn


def _measured_rate(samples: Sequence[Sample], configured: float) -> float:
    """Median rows/s per ready replica over the syncs between which the ready count held and
    at least a second of work per replica waited (else ``configured``)."""
    rates = [
        (b.written - a.written) / (b.at_s - a.at_s) / a.ready
        for a, b in pairwise(samples)
        if a.ready
        and a.ready == b.ready
        and b.at_s > a.at_s
        and min(a.published - a.written, b.published - b.written) >= configured * a.ready
    ]
    return statistics.median(rates) if rates else configured


def run_burst(
    broker: Broker, services: Services, plan: Plan, setup: Setup, workdir: Path
) -> RealRun:
    """Publish ``plan`` to a new topic while the controller scales consumers on it; wait for
    the backlog to drain and the replicas to settle; read the result table."""
    workdir.mkdir(parents=True, exist_ok=True)
    feed = create_feed(broker, services)
    table = f"autoscale_{broker}_{uuid.uuid4().hex[:8]}"
    config = consumer_config(feed, services, table, setup.autoscaling(broker))
    scaler = Autoscaler(setup.controller_for(broker), _spawner(workdir, config, services.env()))
    dsn = services.postgres.dsn
    executed_before = executed_rows(services.triton)
    samples: list[Sample] = []
    try:
        scaler.start()
        deadline = time.monotonic() + 120
        while scaler.ready() < setup.controller.min_replicas:
            scaler.tick()
            if time.monotonic() > deadline:
                raise TimeoutError("the first consumers did not become ready in 120 s")
            time.sleep(0.1)
        t0 = scaler.now()
        t0_epoch = time.time()
        publisher = PacedPublisher(
            lambda: feed.publisher(services), plan, scaler.started_at + t0, table
        )
        publisher.start()
        give_up_at = plan.duration_s + setup.settle_s
        while True:
            sync = scaler.tick()
            if sync is not None:
                written = count_rows(dsn, table)
                samples.append(
                    Sample(
                        sync.at_s - t0,
                        sync.figure,
                        sync.after,
                        sync.ready,
                        publisher.rows,
                        written,
                    )
                )
                if publisher.error is not None:
                    raise publisher.error
                settled = (
                    publisher.done()
                    and written >= publisher.rows
                    and scaler.count == setup.controller.min_replicas
                )
                at = sync.at_s - t0
                if (settled and at >= plan.duration_s) or at > give_up_at:
                    break
            time.sleep(0.1)
        publisher.join(30)
        final_replicas = scaler.count
    finally:
        scaler.close()
    published = publisher.rows
    written_rows = read_written(dsn, table, published)
    executed = executed_rows(services.triton) - executed_before
    drop_table(dsn, table)
    lat = written_rows.latency_s
    # The first burst, from a second in (a backlog has built) to its drain.
    start, end = next((start, end) for start, end, p in plan.windows() if p.burst)
    message = plan.rows_per_message
    drained = next((s.at_s for s in samples if s.at_s >= end and s.drained(message)), end)
    pause = written_rows.longest_gap_s(t0_epoch + start + 1.0, t0_epoch + drained)
    return RealRun(
        broker=broker,
        plan=plan,
        setup=setup,
        published=published,
        written=written_rows.rows,
        distinct_ids=written_rows.distinct_ids,
        ids_complete=written_rows.ids_complete,
        executed=executed,
        p50_s=written_rows.percentile(0.50),
        p99_s=written_rows.percentile(0.99),
        max_s=max(lat, default=math.nan),
        late=sum(1 for x in lat if x > setup.target_latency_s) / max(1, len(lat)),
        replica_seconds=scaler.replica_seconds(t0, t0 + plan.duration_s),
        events=tuple(dataclasses.replace(e, at_s=e.at_s - t0) for e in scaler.events()),
        samples=tuple(samples),
        sent=tuple(publisher.sent),
        startup_s=tuple(scaler.startup_s()),
        rows_per_s_per_replica=_measured_rate(samples, setup.rows_per_s_per_replica),
        write_pause_s=pause,
        exit_codes=tuple(r.exit_code for r in scaler.replicas),
        final_replicas=final_replicas,
    )
