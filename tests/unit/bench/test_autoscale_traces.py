"""The simulator's arrival traces have the shapes they are named for, vary message sizes, and
are the same for the same seed."""

from __future__ import annotations

from statistics import fmean

from bench.autoscale import traces


def _mean(values: tuple[int, ...], start: int, stop: int) -> float:
    return fmean(values[start:stop])


def test_steady_holds_its_rate() -> None:
    t = traces.steady(0, rows_per_s=50_000, minutes=10)
    assert t.duration_s == 600
    assert abs(_mean(t.rows, 0, 600) / 50_000 - 1) < 0.02
    assert abs(_mean(t.rows, 0, 60) / _mean(t.rows, 540, 600) - 1) < 0.05


def test_step_multiplies_the_rate_by_five_for_twenty_minutes() -> None:
    t = traces.step(1)
    before, during, after = (
        _mean(t.rows, 0, 600),
        _mean(t.rows, 600, 1800),
        _mean(t.rows, 1800, 3000),
    )
    assert abs(before / 30_000 - 1) < 0.03
    assert abs(during / before - 5) < 0.25
    assert abs(after / before - 1) < 0.05
    assert t.name == "step-x5"


def test_daily_sine_starts_low_peaks_mid_day() -> None:
    t = traces.daily_sine(2)
    n = t.duration_s
    night, noon = _mean(t.rows, 0, 60), _mean(t.rows, n // 2 - 30, n // 2 + 30)
    assert night < 15_000
    assert abs(noon / 150_000 - 1) < 0.05
    assert _mean(t.rows, n // 4 - 30, n // 4 + 30) < noon


def test_bursts_are_separated_by_idle_gaps() -> None:
    t = traces.bursts(3, rows_per_s=250_000, burst_s=60, every_s=600, count=3)
    assert t.duration_s == 120 + 1800
    for start in (120, 720, 1320):
        assert abs(_mean(t.rows, start, start + 60) / 250_000 - 1) < 0.05
        assert sum(t.rows[start + 60 : start + 600]) == 0
    assert sum(t.rows[:120]) == 0


def test_rows_per_message_vary_around_the_median() -> None:
    small, large = traces.daily_sine(0), traces.bursts(0)
    assert 200 < small.mean_rows_per_message < 300  # log-normal: mean = median x e^(s^2/2)
    assert 1000 < large.mean_rows_per_message < 1400
    t = traces.steady(
        0, rows_per_s=2_000, minutes=5
    )  # few messages a second: sizes drawn one by one
    per_second = [r / m for r, m in zip(t.rows, t.messages, strict=True) if m]
    assert min(per_second) < 400 < 700 < max(per_second)
    assert all(r >= m for r, m in zip(t.rows, t.messages, strict=True))


def test_same_seed_same_trace() -> None:
    assert traces.standard(5) == traces.standard(5)
    assert traces.steady(5).rows != traces.steady(6).rows
