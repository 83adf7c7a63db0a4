"""The autoscaling signal: how many replicas a backlog and a write rate call for
(``rowbatch_desired_replicas``, ``rowbatch_replica_load``), and the safeguards that keep that
figure steady: a floor and hysteresis when the backlog is empty, a hold while the pipeline backs
off, and the rate term alone, with a tenth to spare, while the model server is full (more
consumers would only queue there). The derivation and the targets: docs/autoscaling.md.

The formula (``target_latency_s`` = T, ``rows_per_s_per_replica`` = r)::

    needed  = backlog_rows / (T x r) + written_rows_per_s / r
    desired = ceil(needed), within min..max (and, on Kafka, a count that splits the
              partitions evenly: ceil(P / floor(P / n)))

Two views feed it. A Kafka replica sees the whole group (every partition's lag, the group's
commits), so each computes the fleet's figure: aggregate ``rowbatch_desired_replicas`` with
``max``. A Pub/Sub replica sees only the messages it receives; its ``rowbatch_replica_load`` is
its share (its receive age x receive rate as its backlog, its own writes), and the fleet needs
``ceil(sum(rowbatch_replica_load))``: an HPA Pods metric with ``AverageValue`` 1."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Gauge

from rowbatch.consumer.observe.lag import ThroughputMeter, desired_replicas

TOLERANCE = 0.1
"""A figure falls only once what is needed is this share below the lower count (the HPA's
own tolerance is the same 10 %)."""
SERVER_FULL_SHARE = 0.9
"""The model server counts as full once every inference slot was busy, or it ran full with
requests waiting (``rowbatch_server_saturated``), in this share of the recent samples..."""
SERVER_FREE_SHARE = 0.5
"""...and stops counting as full only once that share falls below this one: a few seconds
with nothing sent (a Kafka group's rebalance pause) leave a full server full, where one
threshold would let the backlog term back for the ~10 s the pause stays in the samples (a
jump of the figure after every membership change, in the simulator)."""
SERVER_FULL_HEADROOM = 0.1
"""While the model server is full the need is the rate term with this share on top (never
more than the need with the backlog): the replicas that keep up with what is written with a
tenth to spare. Without it, a dip in the write rate (a rebalance pause) asks for just too few
to keep the server full, the server stops being full and the figure jumps back: a flap."""
RECENT_S = 10.0
"""Span of the receive age and the server-full test (rates use ``rate_window_s``)."""


def replicas_needed(
    backlog_rows: float,
    written_rows_per_s: float,
    target_latency_s: float,
    rows_per_s_per_replica: float,
) -> float:
    """``backlog_rows / (T x r) + written_rows_per_s / r``, unrounded: the replicas that keep
    up with what is being written and clear the backlog within ``T`` on top."""
    if target_latency_s <= 0 or rows_per_s_per_replica <= 0:
        raise ValueError(
            f"target_latency_s and rows_per_s_per_replica must be > 0, not "
            f"{target_latency_s} and {rows_per_s_per_replica}"
        )
    return (
        max(0.0, backlog_rows) / (target_latency_s * rows_per_s_per_replica)
        + max(0.0, written_rows_per_s) / rows_per_s_per_replica
    )


def balanced(n: int, partitions: int) -> int:
    """The fewest members at least ``n`` among which ``partitions`` split evenly:
    ``ceil(P / floor(P / n))`` (``n`` within 1..P). 7 to 11 members drain 12 partitions no
    faster than 6 (someone still has two), so 7 becomes 12."""
    n = min(max(1, n), partitions)
    return math.ceil(partitions / (partitions // n))


def bounded(
    n: int, min_replicas: int, max_replicas: int | None, partitions: int | None = None
) -> int:
    """``n`` within ``min_replicas..max_replicas`` (None: no cap), then rounded up to a count
    that splits ``partitions`` evenly (still within the cap)."""
    top = max_replicas if max_replicas is None else max(max_replicas, min_replicas)
    n = max(min_replicas, n if top is None else min(top, n))
    if partitions:
        n = balanced(n, partitions) if top is None else min(top, balanced(n, partitions))
    return n


def fleet_replicas(
    backlog_rows: float,
    written_rows_per_s: float,
    target_latency_s: float,
    rows_per_s_per_replica: float,
    max_replicas: int,
    *,
    partitions: int | None = None,
    min_replicas: int = 1,
) -> int:
    """The figure with the rate term, without state:
    ``desired_replicas(backlog + T x written, T, r, max)``, rounded up to an even split of
    ``partitions`` when given. What ``python -m bench autoscale`` simulates."""
    n = desired_replicas(
        backlog_rows + target_latency_s * max(0.0, written_rows_per_s),
        target_latency_s,
        rows_per_s_per_replica,
        max_replicas,
        min_replicas,
    )
    return bounded(n, min_replicas, max_replicas, partitions)


def steady_round(needed: float, previous: int | None, tolerance: float = TOLERANCE) -> int:
    """``ceil(needed)``, except that a figure falls from ``previous`` only once ``needed`` is
    at most ``(previous - 1) x (1 - tolerance)``: a need hovering at a whole number does not
    make the figure alternate."""
    want = math.ceil(needed)
    if previous is None or want >= previous:
        return want
    return want if needed <= (previous - 1) * (1 - tolerance) else previous


@dataclass(frozen=True)
class Conditions:
    """What the pipeline reports of itself."""

    backing_off: bool = False
    """Consumption is paused: the model server or the sink asked to back off."""
    server_full: bool = False
    """The model server is full: every inference slot has been busy (and the slots are what
    keeps the server full), or the server has run full with requests waiting
    (``rowbatch_server_saturated``)."""


@dataclass
class Safeguards:
    """One figure's state: holds it while backing off, counts only the rate term (with
    :data:`SERVER_FULL_HEADROOM` to spare) while the server is full, and rounds it with
    :func:`steady_round`."""

    tolerance: float = TOLERANCE
    needed: float | None = None
    rounded: int | None = None

    def apply(self, full: float, rate_only: float, conditions: Conditions) -> tuple[float, int]:
        """``(needed, rounded)`` from the need with the backlog (``full``) and without it
        (``rate_only``). While the server is full: ``min(full, rate_only x (1 + headroom))``,
        so the safeguard never asks for more than the figure without it."""
        if conditions.backing_off and self.needed is not None and self.rounded is not None:
            return self.needed, self.rounded
        needed = (
            min(full, rate_only * (1 + SERVER_FULL_HEADROOM)) if conditions.server_full else full
        )
        self.rounded = steady_round(needed, self.rounded, self.tolerance)
        self.needed = needed
        return needed, self.rounded


@dataclass
class Window:
    """Running totals sampled over time; :meth:`change` is their increase over a span."""

    span_s: float
    samples: deque[tuple[float, tuple[float, ...]]] = field(default_factory=deque)

    def add(self, now: float, totals: tuple[float, ...]) -> None:
        self.samples.append((now, totals))
        while len(self.samples) >= 2 and self.samples[1][0] <= now - self.span_s:
            self.samples.popleft()

    def change(self, span_s: float | None = None) -> tuple[float, tuple[float, ...]]:
        """``(seconds, increases)`` from the latest sample at least ``span_s`` (default: the
        window's) before the newest, or the oldest kept, to the newest."""
        if not self.samples:
            return 0.0, ()
        newest_t, newest = self.samples[-1]
        cutoff = newest_t - (self.span_s if span_s is None else span_s)
        base_t, base = self.samples[0]
        for t, totals in self.samples:
            if t > cutoff:
                break
            base_t, base = t, totals
        return newest_t - base_t, tuple(b - a for a, b in zip(base, newest, strict=True))


@dataclass(frozen=True)
class OwnRates:
    """This replica's recent flow."""

    received_rows_per_s: float
    written_rows_per_s: float
    receive_age_s: float
    """Mean receive age (receive time - publish time) of the rows received recently."""


class SignalInputs(Protocol):
    """The ``[source]`` fields of the figure that every broker shares. They are declared once,
    with their defaults, bounds and meaning, in
    ``rowbatch.consumer.sources.scaling_settings.ScalingInputs`` (which each broker's settings
    extend); the signal, a layer below the sources, reads them through this."""

    @property
    def rows_per_s_per_replica(self) -> float | None:
        """None: measured while this replica is saturated (``ThroughputMeter``)."""
        ...

    @property
    def rate_window_s(self) -> float:
        """Write and receive rates are means over this span."""
        ...

    @property
    def max_replicas(self) -> int | None:
        """Cap (None: none); Kafka adds the partition count."""
        ...


@dataclass(frozen=True)
class SignalSettings:
    """What the figure is computed with: the view, the target latency (each source's own
    ``[source]`` field, its default differing per broker), the shared ``[source]`` fields as
    configured (``inputs``), and the safeguards' constants."""

    view: Literal["fleet", "share"]
    """``fleet``: the source reports the group's backlog (Kafka); ``share``: the replica's own
    receipts are its view (Pub/Sub)."""
    target_latency_s: float
    inputs: SignalInputs
    """``rows_per_s_per_replica``, ``rate_window_s`` and ``max_replicas``: the ``[source]``
    section itself (or a ``ScalingInputs``), never copies of its fields."""
    min_replicas: int = 1
    slots_fill_server: bool = True
    """Whether busy inference slots mean a full server: true when the in-flight limit comes
    from the server's own model configuration (enough to keep every instance busy), false
    when ``model.max_in_flight`` was set by hand."""
    tolerance: float = TOLERANCE

    @property
    def rows_per_s_per_replica(self) -> float | None:
        return self.inputs.rows_per_s_per_replica

    @property
    def rate_window_s(self) -> float:
        return self.inputs.rate_window_s

    @property
    def max_replicas(self) -> int | None:
        return self.inputs.max_replicas


class ScalingGauges:
    """The signal's gauges (names in docs/autoscaling.md):

    - ``rowbatch_desired_replicas``: the replicas the rule asks for, at least 1 (1 until a
      rate is known);
    - ``rowbatch_replica_load``: this replica's share of the need, unrounded: summed over the
      replicas it is the fleet's need;
    - ``rowbatch_rows_per_s_per_replica``: configured, or measured while saturated (0 until
      measured)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge(
            "rowbatch_desired_replicas",
            "Replicas the autoscaling rule asks for: "
            "ceil(backlog_rows / (target_latency_s * r) + written_rows_per_s / r), held while "
            "backing off, the rate term alone (plus 10 %) while the model server is full",
            registry=registry,
        )
        self.load = Gauge(
            "rowbatch_replica_load",
            "This replica's share of the replicas needed (unrounded; sum over replicas)",
            registry=registry,
        )
        self.rows_per_s = Gauge(
            "rowbatch_rows_per_s_per_replica",
            "Rows/s one replica sustains (configured, or measured while saturated)",
            registry=registry,
        )
        self.desired.set(1)  # the floor, until a rate is known


class ScalingSignal:
    """The figure for one replica. The engine reports rows received (with their receive age)
    and written, and every second the pipeline's state (:meth:`tick`); in the ``share`` view
    the tick also updates the gauges from this replica's own flow, in the ``fleet`` view the
    source does with the group's backlog and write rate (:meth:`fleet`)."""

    def __init__(
        self,
        settings: SignalSettings,
        gauges: ScalingGauges,
        meter: ThroughputMeter | None = None,
    ) -> None:
        self.settings = settings
        self._gauges = gauges
        self._meter = meter or ThroughputMeter()
        self._received = self._age_rows = self._written = 0.0
        self._window = Window(max(settings.rate_window_s, RECENT_S))
        self._full_samples: deque[tuple[float, bool]] = deque()
        self.conditions = Conditions()
        self._fleet = Safeguards(settings.tolerance)
        self._share = Safeguards(settings.tolerance)
        self.rate = settings.rows_per_s_per_replica
        """``r``: configured, else measured (None until then)."""
        if self.rate is not None:
            gauges.rows_per_s.set(self.rate)

    # -- what the engine reports --------------------------------------------------------------

    def received(self, rows: int, age_s: float) -> None:
        """``rows`` taken from the broker ``age_s`` after they were published."""
        self._received += rows
        self._age_rows += rows * max(0.0, age_s)

    def written(self, rows: int) -> None:
        """``rows`` done (written, or dead-lettered)."""
        self._written += rows
        self._meter.done(rows)

    def tick(
        self,
        now: float,
        *,
        busy: bool,
        backing_off: bool,
        slots_full: bool,
        server_saturated: bool = False,
    ) -> None:
        """The pipeline's state at ``now`` (monotonic seconds): ``busy``: work waited for room
        (the replica is saturated, so its rate is its capacity); ``backing_off``;
        ``slots_full``: every inference slot was in use; ``server_saturated``: every model
        server ran full with requests waiting (admission from the server's queue)."""
        self._window.add(now, (self._received, self._age_rows, self._written))
        recent = min(RECENT_S, self.settings.rate_window_s)
        self._full_samples.append(
            (now, server_saturated or (self.settings.slots_fill_server and slots_full))
        )
        while self._full_samples and self._full_samples[0][0] <= now - recent:
            self._full_samples.popleft()
        full = sum(1 for _, f in self._full_samples if f) / len(self._full_samples)
        self.conditions = Conditions(
            backing_off=backing_off,
            server_full=full
            >= (SERVER_FREE_SHARE if self.conditions.server_full else SERVER_FULL_SHARE),
        )
        measured = self._meter.sample(now, busy)
        if self.settings.rows_per_s_per_replica is None and measured:
            self.rate = measured
            self._gauges.rows_per_s.set(measured)
        if self.settings.view == "share":
            self._update_share()

    def own_rates(self) -> OwnRates:
        """This replica's receive and write rates over ``rate_window_s``, and the mean
        receive age of what it received in the last :data:`RECENT_S`."""
        span, (received, _, written) = self._change(self.settings.rate_window_s)
        recent, (got, age_rows, _) = self._change(min(RECENT_S, self.settings.rate_window_s))
        return OwnRates(
            received_rows_per_s=received / span if span > 0 else 0.0,
            written_rows_per_s=written / span if span > 0 else 0.0,
            receive_age_s=age_rows / got if recent > 0 and got > 0 else 0.0,
        )

    def _change(self, span_s: float) -> tuple[float, tuple[float, ...]]:
        seconds, change = self._window.change(span_s)
        return seconds, change or (0.0, 0.0, 0.0)

    # -- the figures ---------------------------------------------------------------------------

    def _load(self, backlog_rows: float, own: OwnRates, rate: float) -> int:
        """Sets this replica's load from its backlog and its own writes; returns it rounded."""
        t = self.settings.target_latency_s
        load, rounded = self._share.apply(
            replicas_needed(backlog_rows, own.written_rows_per_s, t, rate),
            replicas_needed(0.0, own.written_rows_per_s, t, rate),
            self.conditions,
        )
        self._gauges.load.set(load)
        return rounded

    def _update_share(self) -> None:
        """Pub/Sub: the backlog this replica sees is its receive rate x its receive age
        (Little's law: what waits is what arrives during the wait)."""
        if self.rate is None:
            return
        own = self.own_rates()
        rounded = self._load(own.receive_age_s * own.received_rows_per_s, own, self.rate)
        s = self.settings
        self._gauges.desired.set(bounded(rounded, s.min_replicas, s.max_replicas))

    def unknown(self) -> None:
        """The backlog can no longer be read (Kafka: no lag read for a while): the figures are
        set to NaN, "not known", until the next :meth:`fleet`. An HPA does not act on a NaN
        (it keeps the replicas it has), KEDA uses its ``fallback``, and PromQL's ``max`` over
        the replicas takes the ones still fresh; the old figure is never served as current."""
        self._gauges.desired.set(math.nan)
        self._gauges.load.set(math.nan)

    def fleet(
        self,
        backlog_rows: float,
        written_rows_per_s: float,
        *,
        partitions: int,
        own_backlog_rows: float,
    ) -> int | None:
        """Kafka: the group's figure from its backlog and write rate, capped by ``partitions``
        (and ``max_replicas``) and rounded to an even split; this replica's load from its own
        partitions' backlog and its own writes. None while no rate is known."""
        rate = self.rate
        if rate is None:
            return None
        s = self.settings
        _, n = self._fleet.apply(
            replicas_needed(backlog_rows, written_rows_per_s, s.target_latency_s, rate),
            replicas_needed(0.0, written_rows_per_s, s.target_latency_s, rate),
            self.conditions,
        )
        top = partitions if s.max_replicas is None else min(partitions, s.max_replicas)
        desired = bounded(n, s.min_replicas, top, partitions)
        self._gauges.desired.set(desired)
        self._load(own_backlog_rows, self.own_rates(), rate)
        return desired


__all__ = [
    "Conditions",
    "OwnRates",
    "Safeguards",
    "ScalingGauges",
    "ScalingSignal",
    "SignalInputs",
    "SignalSettings",
    "Window",
    "balanced",
    "bounded",
    "fleet_replicas",
    "replicas_needed",
    "steady_round",
]
