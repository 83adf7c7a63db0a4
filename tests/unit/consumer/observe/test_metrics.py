"""``observe_many`` leaves a histogram exactly as observing each value one by one does."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from rowbatch.consumer.observe.metrics import observe_many

BUCKETS = (0.1, 0.25, 1.0, 10.0)


def histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("h", "h", buckets=BUCKETS, registry=registry)


def exposed(registry: CollectorRegistry) -> list[str]:
    """The exposition without the creation time and the sum (compared apart: a float sum
    may differ in its last bits with the order of additions, and Python 3.12's ``sum`` is
    compensated)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line and "_sum" not in line]


def total(registry: CollectorRegistry) -> float:
    value = registry.get_sample_value("h_sum")
    assert value is not None
    return value


values = st.lists(
    st.one_of(
        st.sampled_from([*BUCKETS, 0.0, -1.0, math.inf, math.nan]),
        st.floats(-5, 50, allow_nan=False),
    ),
    max_size=50,
)


@given(values=values)
def test_observe_many_is_observe_one_by_one(values: list[float]) -> None:
    one, one_h = histogram()
    many, many_h = histogram()
    for value in values:
        one_h.observe(value)
    observe_many(many_h, values)
    assert exposed(many) == exposed(one)
    one_sum, many_sum = total(one), total(many)
    assert (math.isnan(one_sum) and math.isnan(many_sum)) or math.isclose(
        many_sum, one_sum, rel_tol=1e-9, abs_tol=1e-9
    )


def test_a_histogram_without_the_known_layout_is_observed_one_by_one() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[float] = []

        def observe(self, value: float) -> None:
            self.seen.append(value)

    plain = Plain()
    observe_many(plain, [1.0, 2.0, 3.0])  # type: ignore[arg-type]
    assert plain.seen == [1.0, 2.0, 3.0]
