"""rowbatch's figure as a consumer computes it, state and safeguards included: the consumers'
own :class:`~rowbatch.consumer.observe.scaling.ScalingSignal` is ticked every simulated
second with what the model server reports (``rowbatch_server_saturated``, read late through
the server's statistics), so its ``Conditions.server_full`` comes from the consumer's own test
(:data:`~rowbatch.consumer.observe.scaling.SERVER_FULL_SHARE` of the samples over
:data:`~rowbatch.consumer.observe.scaling.RECENT_S`), and its ``Safeguards`` then count the
rate term alone (with :data:`~rowbatch.consumer.observe.scaling.SERVER_FULL_HEADROOM` to spare)
while the server is full. Blind (``server_aware=False``), the saturation is never reported:
the figure as it was before the server's queue counted.

Either way the figure is the consumer's: ``ScalingSignal.fleet`` on Kafka (the group's
backlog, ``Safeguards`` with their tolerance, capped at the partitions and ``max_replicas``,
rounded to an even split), ``Safeguards.apply`` for the unrounded need on Pub/Sub (summed
``rowbatch_replica_load``, capped at ``max_replicas``)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from bench.autoscale.run import RATE_WINDOW_S
from bench.autoscale.signals import Delay, Delayed, DesiredFormula, Observation
from rowbatch.consumer.observe.scaling import (
    Safeguards,
    ScalingGauges,
    ScalingSignal,
    SignalSettings,
    bounded,
    replicas_needed,
)

#: ``rowbatch_server_saturated`` as the consumer sees it: the server's statistics read every
#: 0.5 s and averaged over the admission window, so a change shows 1-3 s late (per second).
SERVER_STATISTICS = Delay("server statistics", 1, 1, 3)


@dataclass(frozen=True)
class Inputs:
    """The ``[source]`` fields the signal reads (``SignalInputs``)."""

    rows_per_s_per_replica: float | None
    rate_window_s: float
    max_replicas: int | None


class ConsumerFigure:
    """A :class:`~bench.autoscale.signals.Formula`: ``formula``'s inputs (broker, target,
    rows/s per replica, cap, partitions), computed by a consumer's :class:`ScalingSignal`.
    ``statistics``: how ``rowbatch_server_saturated`` reaches it (None: blind, never
    reported)."""

    def __init__(self, formula: DesiredFormula, statistics: Delayed | None) -> None:
        self.formula = formula
        self.statistics = statistics
        settings = SignalSettings(
            "fleet",
            formula.target_latency_s,
            Inputs(formula.rows_per_s_per_replica, RATE_WINDOW_S, formula.max_replicas),
        )
        self.signal = ScalingSignal(settings, ScalingGauges(CollectorRegistry()))
        self.safeguards = Safeguards(settings.tolerance)
        self._t = -1
        self._needed = 0.0
        self._figure = 1

    @property
    def server_full(self) -> bool:
        """The consumer's ``Conditions.server_full`` at the latest second seen."""
        return self.signal.conditions.server_full

    def _saturation_seen(self, obs: Observation) -> bool:
        if self.statistics is None:
            return False
        self.statistics.offer(obs.t, 1.0 if obs.server_saturated else 0.0)
        return bool(self.statistics.read(obs.t))

    def _step(self, obs: Observation) -> None:
        """Once per second, however many times asked: tick the signal, then the figures."""
        if obs.t <= self._t:
            return
        self._t = obs.t
        self.signal.tick(
            float(obs.t),
            busy=False,
            backing_off=False,
            slots_full=False,
            server_saturated=self._saturation_seen(obs),
        )
        f = self.formula
        backlog = f.backlog_rows(obs)
        written = obs.written_rows_per_s if f.with_rate else 0.0
        need, rounded = self.safeguards.apply(
            replicas_needed(backlog, written, f.target_latency_s, f.rows_per_s_per_replica),
            replicas_needed(0.0, written, f.target_latency_s, f.rows_per_s_per_replica),
            self.signal.conditions,
        )
        self._needed = min(float(f.max_replicas), need)
        if f.partitions is None:
            self._figure = bounded(rounded, 1, f.max_replicas)
        else:
            figure = self.signal.fleet(
                backlog, written, partitions=f.partitions, own_backlog_rows=backlog
            )
            self._figure = 1 if figure is None else figure

    def needed(self, obs: Observation) -> float:
        self._step(obs)
        return self._needed

    def __call__(self, obs: Observation) -> int:
        self._step(obs)
        return self._figure


__all__ = ["SERVER_STATISTICS", "ConsumerFigure", "Inputs"]
