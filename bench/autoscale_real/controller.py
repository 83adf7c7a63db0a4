"""A test-only autoscaler: the Kubernetes HPA's rule (``bench/autoscale/hpa.py``, the
simulator's model) applied to a metric scraped from the consumer processes it starts itself
(``max(rowbatch_desired_replicas)`` as an External metric, or ``rowbatch_replica_load`` as a
Pods metric), which it stops with SIGTERM so they drain. Its clock runs ``time_scale`` times
faster than the HPA's (15 s sync, 300 s scale-down window), so a run of a minute or two shows
what the HPA does in ten or twenty."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Literal, Protocol

from bench.autoscale.hpa import (
    SYNC_PERIOD_S,
    Behavior,
    Hpa,
    external_average_value,
    pods_average_value,
)
from bench.autoscale.scenarios import KEDA_OVERLAY_BEHAVIOR


class Process(Protocol):
    """What the controller needs of a consumer process (:class:`ConsumerProcess` has it)."""

    def ready(self) -> bool:
        """``/readyz`` answers 200."""
        ...

    def metric(self, name: str) -> float | None: ...

    def returncode(self) -> int | None: ...

    def check_alive(self, what: str) -> None:
        """Raises if the process has exited."""
        ...

    def send(self, sig: signal.Signals) -> None: ...

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM, wait; the exit code (None if it had to be killed)."""
        ...

    def stop(self) -> None:
        """Kill by pid if still running, reap, release."""
        ...


@dataclass(frozen=True)
class Metric:
    """The HPA's metric: ``External`` (the maximum over the replicas: each exports the
    group's figure) or ``Pods`` (one value per replica, averaged), with an ``AverageValue``
    target."""

    name: str
    kind: Literal["External", "Pods"]
    target_per_pod: float = 1.0


#: Kafka: every replica computes the group's figure; the HPA takes the maximum.
DESIRED_REPLICAS = Metric("rowbatch_desired_replicas", "External")
#: Pub/Sub: each replica's share of the need; summed (averaged against 1 per pod).
REPLICA_LOAD = Metric("rowbatch_replica_load", "Pods")


@dataclass(frozen=True)
class ControllerSettings:
    """What the HPA object would say, and how much faster than the HPA this one runs."""

    min_replicas: int = 1
    max_replicas: int = 3
    time_scale: float = 10.0
    """HPA seconds per real second: the sync period is ``15 / time_scale`` s, the behaviour's
    windows and policy periods shrink alike."""
    behavior: Behavior = KEDA_OVERLAY_BEHAVIOR
    """In HPA seconds; default: up by max(4 pods, 100 %) per 15 s, down 1 pod per 60 s after
    a 300 s window (the kafka-keda overlay, and the gke-pubsub one docs/autoscaling.md
    recommends)."""
    metric: Metric = DESIRED_REPLICAS
    """Scraped from every replica that answers ``/readyz``."""
    stop_grace_s: float = 60.0
    """A replica told to stop (SIGTERM) and still running this long after is killed."""

    @property
    def sync_period_s(self) -> float:
        return SYNC_PERIOD_S / self.time_scale


@dataclass
class Replica:
    """One consumer process: when it was asked for, answered ``/readyz``, was told to stop
    and exited (seconds since the controller started)."""

    index: int
    proc: Process
    asked_at: float
    ready_at: float | None = None
    stopped_at: float | None = None
    exited_at: float | None = None
    exit_code: int | None = None

    @property
    def running(self) -> bool:
        return self.stopped_at is None


@dataclass(frozen=True)
class Sync:
    """One reconcile: the metric as read, the replicas before and after."""

    at_s: float
    figure: float | None
    """External: the metric's maximum over the ready replicas; Pods: their sum (None: none
    reported one)."""
    before: int
    after: int
    ready: int


@dataclass(frozen=True)
class ScaleEvent:
    at_s: float
    before: int
    after: int

    @property
    def direction(self) -> int:
        return 1 if self.after > self.before else -1


def reversals(events: list[ScaleEvent]) -> int:
    """Scale events in the opposite direction to the one before (flapping)."""
    return sum(1 for a, b in pairwise(events) if a.direction != b.direction)


@dataclass
class Autoscaler:
    """Call :meth:`start`, then :meth:`tick` often (every 0.1-0.5 s); :meth:`close` at the end
    (always: it stops every replica by pid). ``spawn(index)`` starts consumer ``index`` and
    returns it (a :class:`harness.consumer_process.ConsumerProcess`)."""

    settings: ControllerSettings
    spawn: Callable[[int], Process]
    clock: Callable[[], float] = time.monotonic
    replicas: list[Replica] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    started_at: float = 0.0
    _hpa: Hpa | None = None
    _next_sync: float = 0.0

    def now(self) -> float:
        """Seconds since :meth:`start`."""
        return self.clock() - self.started_at

    def start(self) -> None:
        s = self.settings
        self.started_at = self.clock()
        self._hpa = Hpa(s.min_replicas, s.max_replicas, s.behavior)
        for _ in range(s.min_replicas):
            self._add()
        self._next_sync = s.sync_period_s

    @property
    def running(self) -> list[Replica]:
        return [r for r in self.replicas if r.running]

    @property
    def count(self) -> int:
        """Replicas asked for (started or not), as the Deployment counts them."""
        return len(self.running)

    def ready(self) -> int:
        return sum(1 for r in self.running if r.ready_at is not None)

    def tick(self) -> Sync | None:
        """Note readiness and exits; reconcile when a sync is due (returns it)."""
        now = self.now()
        self._watch(now)
        if now < self._next_sync:
            return None
        self._next_sync += self.settings.sync_period_s
        return self.sync(now)

    def sync(self, now: float) -> Sync:
        assert self._hpa is not None, "start() first"
        s = self.settings
        values = self.values()
        current = self.count
        metric = s.metric
        proposal: int | None = None
        if values and metric.kind == "External":
            proposal = external_average_value(max(values), metric.target_per_pod, current)
        elif values:
            missing = max(0, current - len(values))
            proposal = pods_average_value(values, missing, metric.target_per_pod)
        proposals = [] if proposal is None else [proposal]
        figure = None if not values else max(values) if metric.kind == "External" else sum(values)
        wanted = self._hpa.sync(now * s.time_scale, current, proposals)
        self.scale_to(wanted, now)
        done = Sync(now, figure, current, self.count, self.ready())
        self.syncs.append(done)
        return done

    def values(self) -> list[float]:
        """The metric from each replica that answers ``/readyz`` and reports it."""
        return [
            v
            for r in self.running
            if r.ready_at is not None
            for v in [r.proc.metric(self.settings.metric.name)]
            if v is not None
        ]

    def scale_to(self, wanted: int, now: float) -> None:
        while self.count < wanted:
            self._add()
        while self.count > wanted:
            # Not ready first, then the newest (what a ReplicaSet removes first).
            victim = max(self.running, key=lambda r: (r.ready_at is None, r.asked_at))
            victim.stopped_at = now
            if victim.proc.returncode() is None:
                victim.proc.send(signal.SIGTERM)  # it drains what it holds, then exits

    def events(self) -> list[ScaleEvent]:
        """The scale events, at real seconds since :meth:`start`."""
        if self._hpa is None:
            return []
        k = self.settings.time_scale
        return [ScaleEvent(e.at_s / k, e.before, e.after) for e in self._hpa.events]

    def replica_seconds(self, start_s: float, end_s: float) -> float:
        """Replicas asked for, integrated over ``start_s..end_s``."""
        total = 0.0
        for r in self.replicas:
            stop = r.stopped_at if r.stopped_at is not None else end_s
            total += max(0.0, min(stop, end_s) - max(r.asked_at, start_s))
        return total

    def startup_s(self) -> list[float]:
        """Seconds from asked for to ready, per replica that became ready."""
        return [r.ready_at - r.asked_at for r in self.replicas if r.ready_at is not None]

    def close(self) -> None:
        """SIGTERM every replica still running, wait for it to exit, kill by pid if it does
        not within ``stop_grace_s``."""
        now = self.now()
        for r in self.replicas:
            if r.stopped_at is None:
                r.stopped_at = now
            if r.exited_at is None:
                r.exit_code = r.proc.terminate(self.settings.stop_grace_s)
                r.exited_at = self.now()
            r.proc.stop()

    def _add(self) -> None:
        index = len(self.replicas)
        self.replicas.append(Replica(index, self.spawn(index), self.now()))

    def _watch(self, now: float) -> None:
        for r in self.replicas:
            if r.exited_at is not None:
                continue
            code = r.proc.returncode()
            if code is not None:
                if r.stopped_at is None:
                    r.proc.check_alive("being told to stop")  # raises: it died
                r.exited_at, r.exit_code = now, code
                r.proc.stop()  # reaps, closes the log
            elif r.stopped_at is not None and now - r.stopped_at > self.settings.stop_grace_s:
                r.proc.stop()
                r.exited_at = now
            elif r.ready_at is None and r.stopped_at is None and r.proc.ready():
                r.ready_at = now
