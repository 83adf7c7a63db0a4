"""Arrival traces for the autoscaling simulator: rows and messages published in each second,
seeded, with message sizes drawn per message (log-normal around a median), so the broker-side
counts (messages, records) and the rows behind them differ as they do in production."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

#: Spread of rows per message: log-normal sigma (0.6: half of the messages within about
#: 0.67x..1.5x the median, a few at 3x).
SIZE_SIGMA = 0.6
#: Up to this many messages in a second, draw every message's size; above it the sum of
#: the sizes is drawn from its normal approximation (same mean and variance).
EXACT_MESSAGES = 40


@dataclass(frozen=True)
class Trace:
    """What the producers published, second by second."""

    name: str
    description: str
    rows: tuple[int, ...]
    """Rows published in second ``t`` (index ``t``)."""
    messages: tuple[int, ...]
    """Messages (Pub/Sub) or records (Kafka) published in second ``t``."""

    @property
    def duration_s(self) -> int:
        return len(self.rows)

    @property
    def total_rows(self) -> int:
        return sum(self.rows)

    @property
    def total_messages(self) -> int:
        return sum(self.messages)

    @property
    def mean_rows_per_message(self) -> float:
        return self.total_rows / max(1, self.total_messages)

    @property
    def peak_rows_per_s(self) -> int:
        return max(self.rows, default=0)


RateFn = Callable[[int], float]


def build(
    name: str,
    description: str,
    rate: RateFn,
    *,
    duration_s: int,
    median_rows_per_message: float,
    seed: int,
) -> Trace:
    """Sample a trace: ``rate(t)`` is the mean rows/s at second ``t``; the message count in a
    second is Poisson-like around ``rate / mean size`` and each message's size log-normal
    around ``median_rows_per_message`` (at least 1 row)."""
    rng = random.Random(f"{seed}-trace-{name}")  # noqa: S311 - a reproducible trace, not crypto
    mean_size = median_rows_per_message * math.exp(SIZE_SIGMA**2 / 2)
    size_sd = mean_size * math.sqrt(math.exp(SIZE_SIGMA**2) - 1)
    log_median = math.log(median_rows_per_message)
    rows: list[int] = []
    messages: list[int] = []
    for t in range(duration_s):
        expected = max(0.0, rate(t)) / mean_size
        n = max(0, round(rng.gauss(expected, math.sqrt(expected)))) if expected > 0 else 0
        if n <= EXACT_MESSAGES:
            r = sum(max(1, round(rng.lognormvariate(log_median, SIZE_SIGMA))) for _ in range(n))
        else:
            r = max(n, round(rng.gauss(n * mean_size, math.sqrt(n) * size_sd)))
        rows.append(r)
        messages.append(n)
    return Trace(name, description, tuple(rows), tuple(messages))


def steady(seed: int, rows_per_s: float = 50_000, minutes: int = 30) -> Trace:
    return build(
        "steady",
        f"{rows_per_s:,.0f} rows/s for {minutes} min, 500-row messages",
        lambda _t: rows_per_s,
        duration_s=minutes * 60,
        median_rows_per_message=500,
        seed=seed,
    )


def step(seed: int, low: float = 30_000, factor: float = 5.0) -> Trace:
    """``low`` for 10 min, ``factor`` x ``low`` for 20 min, ``low`` again for 20 min."""
    return build(
        f"step-x{factor:g}",
        f"{low:,.0f} -> {low * factor:,.0f} rows/s at 10 min, back at 30 min (50 min), "
        "500-row messages",
        lambda t: low * factor if 600 <= t < 1800 else low,
        duration_s=3000,
        median_rows_per_message=500,
        seed=seed,
    )


def daily_sine(seed: int, low: float = 10_000, high: float = 150_000, minutes: int = 48) -> Trace:
    """One day compressed into ``minutes`` (48: one simulated second is 30 s of the day),
    starting at the night's low."""
    period = minutes * 60
    mid, amplitude = (high + low) / 2, (high - low) / 2
    return build(
        "daily-sine",
        f"{low:,.0f}..{high:,.0f} rows/s, a day in {minutes} min, 200-row messages",
        lambda t: mid - amplitude * math.cos(2 * math.pi * t / period),
        duration_s=period,
        median_rows_per_message=200,
        seed=seed,
    )


def bursts(
    seed: int, rows_per_s: float = 250_000, burst_s: int = 60, every_s: int = 600, count: int = 6
) -> Trace:
    """Idle, then ``burst_s`` at ``rows_per_s`` every ``every_s`` (first at 2 min)."""
    first = 120
    return build(
        "bursts",
        f"{count} bursts of {burst_s} s at {rows_per_s:,.0f} rows/s every {every_s // 60} min, "
        "idle between, 1000-row messages",
        lambda t: rows_per_s if t >= first and (t - first) % every_s < burst_s else 0.0,
        duration_s=first + count * every_s,
        median_rows_per_message=1000,
        seed=seed,
    )


def standard(seed: int) -> tuple[Trace, ...]:
    """The four traces the report runs."""
    return (steady(seed), step(seed), daily_sine(seed), bursts(seed))
