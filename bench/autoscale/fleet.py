"""The consumers and the broker in the autoscaling simulator: a FIFO backlog of rows (in
cohorts by publish second), replicas that count from the moment they are asked for but drain
only once started, and the group's drain rate: replicas x rows/s each, at most one busy member
per partition on Kafka (the busiest member's share of the partitions sets the pace), a pause
on every Kafka group membership change, and the model server's capacity over everything."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FleetParams:
    """One broker's consumers."""

    rows_per_s_per_replica: float
    """What one replica drains when nothing else limits it (a benchmark figure)."""
    server_rows_per_s: float
    """The model server's capacity: the group never writes more than this."""
    partitions: int | None = None
    """Kafka: the topic's partitions (``None``: Pub/Sub, no such cap)."""
    pod_startup_s: float = 30.0
    """From the scale-up to the pod draining (scheduling, image, start, readiness)."""
    rebalance_pause_s: float = 3.0
    """Kafka: the whole group stops this long when a member joins or leaves."""
    max_messages: int = 1000
    """Pub/Sub flow control: messages one replica holds at most (its read-ahead)."""
    unsettled_s: float = 1.0
    """How long written work stays counted by the broker: Kafka commits every
    ``commit_interval_s`` (1 s), Pub/Sub acks go out in batches; plus the pipeline's own
    latency. The broker's backlog never reads 0 under load."""

    def consumer_rate(self, ready: int) -> float:
        """Rows/s ``ready`` started replicas would drain together were the server unlimited."""
        if ready <= 0:
            return 0.0
        if self.partitions is None:
            return ready * self.rows_per_s_per_replica
        busy = min(ready, self.partitions)
        return self.rows_per_s_per_replica * self.partitions / math.ceil(self.partitions / busy)

    def drain_rate(self, ready: int) -> float:
        """Rows/s ``ready`` started replicas drain together, the server's cap included."""
        if ready <= 0:
            return 0.0
        return min(self.consumer_rate(ready), self.server_rows_per_s)

    def server_saturated(self, ready: int, waiting_rows: float) -> bool:
        """Whether the model server, not the consumers, sets the pace: the ``ready`` replicas
        would send more rows than it serves and that many rows wait for them, so requests
        queue at the server (its queue stands at its target: ``rowbatch_server_saturated``)."""
        return min(self.consumer_rate(ready), waiting_rows) > self.server_rows_per_s

    def useful_replicas(self) -> int:
        """The fewest replicas at the group's fastest drain: more add nothing (the server is
        full, or every partition has its member). On Kafka that can be all the partitions
        even below the server's cap: 12 partitions drain as fast with 6 members as with 11
        (someone still has two)."""
        n = math.ceil(self.server_rows_per_s / self.rows_per_s_per_replica)
        if self.partitions is None:
            return max(1, n)
        best = self.drain_rate(self.partitions)
        return next(k for k in range(1, self.partitions + 1) if self.drain_rate(k) >= best)

    def replicas_for(self, rows_per_s: float) -> int:
        """The fewest replicas that drain ``rows_per_s`` (the most useful if none do)."""
        useful = self.useful_replicas()
        for n in range(1, useful + 1):
            if self.drain_rate(n) >= rows_per_s:
                return n
        return useful


@dataclass
class Backlog:
    """Rows published and not yet written, oldest first, and the latency of those written.
    ``rows_in == rows_out + rows`` at every step."""

    cohorts: deque[list[float]] = field(default_factory=deque)
    """``[publish second, rows, messages]``, oldest first."""
    rows: float = 0.0
    messages: float = 0.0
    rows_in: float = 0.0
    rows_out: float = 0.0
    latency_rows: dict[int, float] = field(default_factory=dict)
    """Rows written, by whole seconds from publish to written (end of the step)."""

    def publish(self, t: int, rows: float, messages: float) -> None:
        if rows <= 0:
            return
        self.cohorts.append([float(t), rows, messages])
        self.rows += rows
        self.messages += messages
        self.rows_in += rows

    def drain(self, t: int, capacity_rows: float) -> float:
        """Write up to ``capacity_rows`` oldest rows in second ``t``; returns rows written."""
        left = capacity_rows
        done = 0.0
        while left > 0 and self.cohorts:
            cohort = self.cohorts[0]
            published, rows, messages = cohort
            take = min(rows, left)
            took_messages = messages * take / rows
            latency = int(t - published) + 1
            self.latency_rows[latency] = self.latency_rows.get(latency, 0.0) + take
            left -= take
            done += take
            self.messages -= took_messages
            if take >= rows:
                self.cohorts.popleft()
            else:
                cohort[1] = rows - take
                cohort[2] = messages - took_messages
        self.rows -= done
        self.rows_out += done
        if not self.cohorts:
            self.rows = self.messages = 0.0
        return done

    def oldest_age_s(self, t: int) -> float:
        """Seconds the oldest waiting row has waited at the end of second ``t``."""
        return t - self.cohorts[0][0] + 1 if self.cohorts else 0.0


@dataclass
class Replicas:
    """The Deployment's pods: each ready at a time; scaling down removes the ones not started
    yet first, then the newest."""

    params: FleetParams
    ready_at: list[float] = field(default_factory=list)
    paused_until: float = -1.0
    _ready_seen: int = 0

    def start(self, count: int, now: float, ready: bool = False) -> None:
        at = now if ready else now + self.params.pod_startup_s
        self.ready_at.extend([at] * count)
        self.ready_at.sort()

    @property
    def count(self) -> int:
        return len(self.ready_at)

    def scale_to(self, n: int, now: float) -> None:
        if n > self.count:
            self.start(n - self.count, now)
        elif n < self.count:
            del self.ready_at[n:]  # sorted: the last ones are those that start latest

    def ready(self, now: float) -> int:
        return sum(1 for at in self.ready_at if at <= now)

    def drain_rate(self, now: float) -> float:
        """Rows/s the group drains in the second starting at ``now`` (0 while rebalancing)."""
        ready = self.ready(now)
        if self.params.partitions is not None and ready != self._ready_seen:
            if self._ready_seen:
                self.paused_until = now + self.params.rebalance_pause_s
            self._ready_seen = ready
        if now < self.paused_until:
            return 0.0
        return self.params.drain_rate(ready)
