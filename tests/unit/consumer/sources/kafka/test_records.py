"""``hold`` measures a record in one pass exactly as ``record_size``, ``record_rows`` and
``record_cost`` do one by one."""

from __future__ import annotations

from typing import Any

from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import strategies as st

from rowbatch.consumer.sources.kafka.records import hold, record_cost, record_rows, record_size
from tests.unit.consumer.sources.kafka.test_source import TOPIC, Record

header_values = st.one_of(
    st.none(), st.binary(max_size=6), st.integers(-3, 10**6).map(lambda n: str(n).encode())
)


@given(
    headers=st.lists(
        st.tuples(st.sampled_from(["rowbatch-row-count", "x", "rowbatch-table"]), header_values),
        max_size=5,
    ),
    key=st.one_of(st.none(), st.binary(max_size=4)),
    value=st.one_of(st.none(), st.binary(max_size=16)),
)
def test_hold_measures_as_the_functions_do(
    headers: list[tuple[str, Any]], key: bytes | None, value: bytes | None
) -> None:
    record = Record(TOPIC, 0, 7, key=key, value=value, headers=tuple(headers))
    held = hold(record, TopicPartition(TOPIC, 0), 3)
    size = record_size(record)
    assert (held.size, held.rows, held.cost) == (
        size,
        record_rows(record),
        record_cost(record, size),
    )
