"""The Kubernetes HorizontalPodAutoscaler's algorithm (autoscaling/v2), as the controller
computes it each sync period: the per-metric replica proposal (External ``AverageValue``
targets, Pods metrics), the 10 % tolerance, the larger proposal over metrics, the
scale-up/scale-down stabilization windows, and the rate policies of ``behavior``.

Follows the documentation (kubernetes.io, "Horizontal Pod Autoscaling") and the controller's
``replica_calculator.go`` / ``horizontal.go``: ``desired = ceil(current x metric / target)``;
for an ``AverageValue`` target on an External metric that is ``ceil(total / target)``, left at
``current`` while ``|total / (target x current) - 1| <= tolerance``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

#: ``--horizontal-pod-autoscaler-tolerance`` default.
TOLERANCE = 0.1
#: ``--horizontal-pod-autoscaler-sync-period`` default, seconds.
SYNC_PERIOD_S = 15


@dataclass(frozen=True)
class Policy:
    """One ``HPAScalingPolicy``: at most ``value`` pods (``Pods``) or ``value`` % of the
    replicas at the start of the period (``Percent``) per ``period_s``."""

    kind: Literal["Pods", "Percent"]
    value: int
    period_s: int


@dataclass(frozen=True)
class Rules:
    """One direction of ``behavior`` (``HPAScalingRules``)."""

    stabilization_s: int
    policies: tuple[Policy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"

    @property
    def longest_period_s(self) -> int:
        return max((p.period_s for p in self.policies), default=0)


@dataclass(frozen=True)
class Behavior:
    scale_up: Rules
    scale_down: Rules


#: What an HPA without ``behavior`` does: up by max(4 pods, 100 %) per 15 s, no window;
#: down by 100 % per 15 s after a 300 s window.
DEFAULT_BEHAVIOR = Behavior(
    scale_up=Rules(0, (Policy("Pods", 4, 15), Policy("Percent", 100, 15))),
    scale_down=Rules(300, (Policy("Percent", 100, 15),)),
)


def external_average_value(
    total: float, target_per_pod: float, current: int, tolerance: float = TOLERANCE
) -> int:
    """An External metric with an ``AverageValue`` target (``GetExternalPerPodMetricReplicas``):
    ``ceil(total / target)`` unless within the tolerance of ``current`` pods' worth."""
    if target_per_pod <= 0:
        raise ValueError(f"target_per_pod must be > 0, not {target_per_pod}")
    if current <= 0:
        return math.ceil(total / target_per_pod)
    ratio = total / (target_per_pod * current)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(total / target_per_pod)


def pods_average_value(
    values: Sequence[float], missing: int, target_per_pod: float, tolerance: float = TOLERANCE
) -> int | None:
    """A Pods metric with an ``AverageValue`` target (``calcPlainMetricReplicas``): ``values``
    from the pods that report one, ``missing`` pods without a value yet (starting). Missing pods
    count as 0 when scaling up and as the target when scaling down; no change when that flips
    the direction or lands within the tolerance. ``None`` when no pod reports a value."""
    if not values:
        return None
    count = len(values)
    ratio = sum(values) / (target_per_pod * count)
    if missing == 0:
        return count if abs(1.0 - ratio) <= tolerance else math.ceil(ratio * count)
    assumed = 0.0 if ratio > 1.0 else target_per_pod
    new_ratio = (sum(values) + assumed * missing) / (target_per_pod * (count + missing))
    current = count + missing
    if abs(1.0 - new_ratio) <= tolerance or (ratio > 1.0) != (new_ratio > 1.0):
        return current
    proposal = math.ceil(new_ratio * current)
    if (new_ratio > 1.0 and proposal < current) or (new_ratio < 1.0 and proposal > current):
        return current
    return proposal


@dataclass(frozen=True)
class ScaleEvent:
    at_s: float
    before: int
    after: int


@dataclass
class Hpa:
    """The controller's state for one HPA: past recommendations (for the windows) and past
    scale events (for the policies). :meth:`sync` is one reconcile."""

    min_replicas: int
    max_replicas: int
    behavior: Behavior = DEFAULT_BEHAVIOR
    recommendations: list[tuple[float, int]] = field(default_factory=list)
    events: list[ScaleEvent] = field(default_factory=list)
    _synced: bool = field(default=False, init=False)

    def sync(self, now: float, current: int, proposals: Sequence[int]) -> int:
        """The replica count after one reconcile: the largest of the metrics' proposals,
        stabilized, limited by the rate policies and ``min..max``. The first sync counts the
        current count as a recommendation (``maybeInitScaleDownStabilizationWindow``), so a
        new HPA does not scale down before its window has passed."""
        if not self._synced:
            self._synced = True
            self.recommendations.append((now, current))
        if current > self.max_replicas or current < self.min_replicas:
            wanted = min(self.max_replicas, max(self.min_replicas, current))
        elif not proposals:
            return current
        else:
            desired = max(proposals)
            stabilized = self._stabilize(now, current, desired)
            wanted = self._limit(now, current, stabilized)
        if wanted != current:
            self.events.append(ScaleEvent(now, current, wanted))
        return wanted

    def _stabilize(self, now: float, current: int, desired: int) -> int:
        up_cutoff = now - self.behavior.scale_up.stabilization_s
        down_cutoff = now - self.behavior.scale_down.stabilization_s
        up, down = desired, desired
        for at, rec in self.recommendations:
            if at > up_cutoff:
                up = min(up, rec)
            if at > down_cutoff:
                down = max(down, rec)
        keep = max(self.behavior.scale_up.stabilization_s, self.behavior.scale_down.stabilization_s)
        self.recommendations = [(at, r) for at, r in self.recommendations if at > now - keep]
        self.recommendations.append((now, desired))
        return min(max(current, up), down)

    def _changed_within(self, now: float, period_s: int) -> tuple[int, int]:
        added = removed = 0
        for e in self.events:
            if e.at_s > now - period_s:
                if e.after > e.before:
                    added += e.after - e.before
                else:
                    removed += e.before - e.after
        return added, removed

    def _limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            rules = self.behavior.scale_up
            limit = current if rules.select == "Disabled" else self._up_limit(now, current, rules)
            return min(desired, max(limit, current), self.max_replicas)
        if desired < current:
            rules = self.behavior.scale_down
            limit = current if rules.select == "Disabled" else self._down_limit(now, current, rules)
            return max(desired, min(limit, current), self.min_replicas)
        return desired

    def _up_limit(self, now: float, current: int, rules: Rules) -> int:
        proposals = []
        for policy in rules.policies:
            added, removed = self._changed_within(now, policy.period_s)
            start = current - added + removed
            if policy.kind == "Pods":
                proposals.append(start + policy.value)
            else:
                proposals.append(math.ceil(start * (1 + policy.value / 100)))
        return min(proposals) if rules.select == "Min" else max(proposals)

    def _down_limit(self, now: float, current: int, rules: Rules) -> int:
        proposals = []
        for policy in rules.policies:
            added, removed = self._changed_within(now, policy.period_s)
            start = current - added + removed
            if policy.kind == "Pods":
                proposals.append(start - policy.value)
            else:
                proposals.append(int(start * (1 - policy.value / 100)))
        return max(proposals) if rules.select == "Min" else min(proposals)
