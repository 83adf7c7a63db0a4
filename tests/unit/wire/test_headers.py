"""ChunkHeaders: Pub/Sub attributes and Kafka headers round trips and parsing rules."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.wire.errors import InvalidHeader
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import (
    Encoding,
    derive_chunk_id,
    format_timestamp,
    parse_timestamp,
)

chunk_ids = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=256)
tables = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,20}", fullmatch=True)
moments = st.datetimes(
    min_value=dt.datetime(1970, 1, 2),
    max_value=dt.datetime(9998, 12, 31),
    timezones=st.sampled_from([dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30))]),
)
ordering_keys = st.none() | st.text(min_size=1, max_size=50)


@settings(max_examples=200, deadline=None)
@given(
    chunk_id=chunk_ids,
    table=tables,
    rows=st.integers(0, 10**17),
    encoding=st.sampled_from(list(Encoding)),
    produced_at=moments,
    ordering_key=ordering_keys,
)
def test_attributes_and_kafka_round_trip(
    chunk_id: str,
    table: str,
    rows: int,
    encoding: Encoding,
    produced_at: dt.datetime,
    ordering_key: str | None,
) -> None:
    headers = ChunkHeaders(chunk_id, table, rows, encoding, produced_at, ordering_key)
    attributes = headers.to_attributes()
    assert all(isinstance(v, str) for v in attributes.values())
    assert ChunkHeaders.from_attributes(attributes) == headers
    kafka = headers.to_kafka_headers()
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in kafka)
    assert ChunkHeaders.from_kafka_headers(kafka) == headers
    assert headers.produced_at.tzinfo is dt.UTC
    assert headers.produced_at.microsecond % 1000 == 0


def test_attribute_names_and_values_are_exactly_documented() -> None:
    headers = ChunkHeaders(
        "orders-db:18446",
        "orders",
        2,
        Encoding.JSON,
        dt.datetime(2024, 5, 1, 12, 34, 56, 789999, tzinfo=dt.UTC),
    )
    assert headers.to_attributes() == {
        "rowbatch-format-version": "1",
        "content-type": "application/json",
        "rowbatch-chunk-id": "orders-db:18446",
        "rowbatch-table": "orders",
        "rowbatch-row-count": "2",
        "rowbatch-produced-at": "2024-05-01T12:34:56.789Z",
    }
    with_key = ChunkHeaders("c", "t", 0, Encoding.ARROW, headers.produced_at, "k1")
    assert with_key.to_attributes()["rowbatch-ordering-key"] == "k1"
    assert with_key.to_attributes()["content-type"] == "application/vnd.apache.arrow.stream"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2024-05-01T12:34:56.789Z", dt.datetime(2024, 5, 1, 12, 34, 56, 789000, tzinfo=dt.UTC)),
        ("2024-05-01T12:34:56Z", dt.datetime(2024, 5, 1, 12, 34, 56, tzinfo=dt.UTC)),
        ("2024-05-01t12:34:56.1z", dt.datetime(2024, 5, 1, 12, 34, 56, 100000, tzinfo=dt.UTC)),
        (
            "2024-05-01T12:34:56.123456789+02:00",
            dt.datetime(2024, 5, 1, 10, 34, 56, 123456, tzinfo=dt.UTC),
        ),
    ],
)
def test_timestamps_accepted(text: str, expected: dt.datetime) -> None:
    assert parse_timestamp(text) == expected


def test_format_timestamp_pads_early_years() -> None:
    moment = dt.datetime(999, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert format_timestamp(moment) == "0999-01-02T03:04:05.000Z"
    assert parse_timestamp(format_timestamp(moment)) == moment


def test_format_timestamp_converts_to_utc() -> None:
    moment = dt.datetime(2024, 5, 1, 14, 0, 0, 5000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert format_timestamp(moment) == "2024-05-01T12:00:00.005Z"


def test_derive_chunk_id() -> None:
    assert derive_chunk_id("orders-db", 18446) == "orders-db:18446"
    with pytest.raises(InvalidHeader):
        derive_chunk_id("has space", 1)
    with pytest.raises(InvalidHeader):
        derive_chunk_id("src", -1)


def test_default_produced_at_is_now() -> None:
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    headers = ChunkHeaders("c", "t", 0, Encoding.JSON)
    assert before <= headers.produced_at <= dt.datetime.now(dt.UTC)
