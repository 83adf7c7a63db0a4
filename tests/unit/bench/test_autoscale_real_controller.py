"""The test-only autoscaler (``bench/autoscale_real/controller.py``) with fake consumer
processes and a fake clock: it applies the HPA's rule at its scaled pace (scale-up at once,
scale-down only after the window and one pod per period), stops the newest replica with
SIGTERM, reads an External metric as the maximum over the replicas and a Pods metric per
replica, and accounts replica-seconds and reversals."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from bench.autoscale_real.controller import (
    REPLICA_LOAD,
    Autoscaler,
    ControllerSettings,
    ScaleEvent,
    reversals,
)


@dataclass
class FakeProcess:
    value: Callable[[], float | None]
    is_ready: bool = True
    code: int | None = None
    signals: list[signal.Signals] = field(default_factory=list)

    def ready(self) -> bool:
        return self.is_ready

    def metric(self, name: str) -> float | None:
        return self.value()

    def returncode(self) -> int | None:
        return self.code

    def check_alive(self, what: str) -> None:
        if self.code is not None:
            raise AssertionError(f"exited before {what}")

    def send(self, sig: signal.Signals) -> None:
        self.signals.append(sig)
        self.code = 0  # drains at once

    def terminate(self, timeout_s: float = 60.0) -> int | None:
        self.code = 0
        return 0

    def stop(self) -> None:
        pass


@dataclass
class Harness:
    settings: ControllerSettings
    figure: list[float | None] = field(default_factory=lambda: [1.0])
    now: list[float] = field(default_factory=lambda: [0.0])
    procs: list[FakeProcess] = field(default_factory=list)

    def spawn(self, index: int) -> FakeProcess:
        proc = FakeProcess(lambda: self.figure[0])
        self.procs.append(proc)
        return proc

    def scaler(self) -> Autoscaler:
        scaler = Autoscaler(self.settings, self.spawn, clock=lambda: self.now[0])
        scaler.start()
        return scaler

    def run(self, scaler: Autoscaler, until_s: float, step_s: float = 0.25) -> None:
        while self.now[0] < until_s - 1e-9:
            self.now[0] += step_s
            scaler.tick()


def test_scales_up_at_once_and_down_after_the_window_one_pod_per_period() -> None:
    h = Harness(ControllerSettings(min_replicas=1, max_replicas=3, time_scale=10.0))
    scaler = h.scaler()
    assert scaler.count == 1
    h.run(scaler, 2.0)  # first sync at 1.5 s
    assert scaler.count == 1
    h.figure[0] = 5.0  # more than the maximum
    h.run(scaler, 3.0)
    assert scaler.count == 3, "scale-up is immediate (no window), capped at max_replicas"
    h.figure[0] = 1.0
    h.run(scaler, 3.0 + 29.0)
    assert scaler.count == 3, "the 300 s (30 s scaled) scale-down window holds the peak"
    h.run(scaler, 3.0 + 30.5)
    assert scaler.count == 2
    h.run(scaler, 3.0 + 35.5)
    assert scaler.count == 2, "down by 1 pod per 60 s (6 s scaled)"
    h.run(scaler, 3.0 + 36.5)
    assert scaler.count == 1
    stopped = [p for p in h.procs if p.signals]
    assert [p.signals for p in stopped] == [[signal.SIGTERM]] * 2
    assert h.procs[0].signals == [], "the oldest replica stays; the newest go first"
    events = scaler.events()
    assert [(e.before, e.after) for e in events] == [(1, 3), (3, 2), (2, 1)]
    assert reversals(events) == 1
    assert events[0].at_s == pytest.approx(3.0)


def test_external_metric_is_the_maximum_and_pods_metric_the_sum() -> None:
    h = Harness(ControllerSettings(max_replicas=5, time_scale=10.0))
    scaler = h.scaler()
    h.figure[0] = 3.0
    h.run(scaler, 1.5)
    assert scaler.count == 3
    assert scaler.syncs[-1].figure == 3.0

    p = Harness(ControllerSettings(max_replicas=5, time_scale=10.0, metric=REPLICA_LOAD))
    pods = p.scaler()
    p.figure[0] = 2.4  # one replica carrying 2.4 replicas' worth
    p.run(pods, 1.5)
    assert pods.count == 3
    p.figure[0] = 0.9  # three replicas at 0.9 each: within the 10 % tolerance of 3
    p.run(pods, 3.0)
    assert pods.count == 3
    assert pods.syncs[-1].figure == pytest.approx(2.7)


def test_replicas_not_ready_report_nothing_and_count_for_replica_seconds() -> None:
    h = Harness(ControllerSettings(max_replicas=3, time_scale=10.0))
    scaler = h.scaler()
    h.figure[0] = 2.0
    h.run(scaler, 1.5)
    assert scaler.count == 2
    h.procs[1].is_ready = False
    h.procs[1].value = lambda: 9.0  # never read while not ready
    h.run(scaler, 4.5)
    assert scaler.count == 2
    assert scaler.ready() == 1
    assert scaler.replica_seconds(0.0, 4.5) == pytest.approx(4.5 + 3.0)


def test_a_replica_that_dies_unasked_fails_the_run() -> None:
    h = Harness(ControllerSettings(time_scale=10.0))
    scaler = h.scaler()
    h.procs[0].code = 1
    with pytest.raises(AssertionError, match="told to stop"):
        h.run(scaler, 0.5)


def test_close_stops_every_replica() -> None:
    h = Harness(ControllerSettings(min_replicas=2, time_scale=10.0))
    scaler = h.scaler()
    scaler.close()
    assert all(p.code == 0 for p in h.procs)
    assert all(r.exit_code == 0 for r in scaler.replicas)


def test_reversals_count_changes_of_direction() -> None:
    ups_and_downs = [ScaleEvent(t, a, b) for t, (a, b) in enumerate([(1, 2), (2, 3), (3, 2)])]
    assert reversals(ups_and_downs) == 1
    assert reversals([*ups_and_downs, ScaleEvent(9, 2, 3)]) == 2
    assert reversals([]) == 0
