"""The fast header parse (lower-case names, values exactly as producers write them) returns
what the full parse returns, and leaves everything else, every error included, to it."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowbatch.wire.errors import WireError
from rowbatch.wire.headers import chunk_headers, fields
from rowbatch.wire.headers.chunk_headers import ChunkHeaders
from rowbatch.wire.headers.fields import Encoding

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CANONICAL = ChunkHeaders(
    chunk_id="orders-db:18446",
    table="orders",
    row_count=1,
    content_type=Encoding.ARROW,
    produced_at=dt.datetime(2024, 5, 1, 12, 34, 56, 789000, tzinfo=dt.UTC),
).to_attributes()

EDGES: dict[str, list[Any]] = {
    fields.H_FORMAT_VERSION: ["1", " 1", "1 ", "2", "", "\uff11", None, 1],
    fields.H_CONTENT_TYPE: [
        "application/json",
        "application/vnd.apache.arrow.stream",
        "application/json; charset=utf-8",
        "Application/JSON",
        " application/json",
        "application/vnd.apache.arrow.stream; charset=utf-8",
        "text/plain",
        "",
    ],
    fields.H_CHUNK_ID: ["a", "x:1.2", "a" * 256, "a" * 257, "a b", "\u00e9", "", "\x7f", "a\n"],
    fields.H_TABLE: ["t", "_t", ".t", "-t", "t" * 128, "t" * 129, "t.t-1", "t/t", "", "t\n"],
    fields.H_ROW_COUNT: [
        "0",
        "1",
        "250",
        "00",
        "01",
        "+1",
        " 1",
        "1 ",
        "-1",
        "9" * 18,
        "1" + "0" * 18,
        "\u0661",
        "\u00b2",
        "1_0",
        "",
    ],
    fields.H_PRODUCED_AT: [
        "2024-05-01T12:34:56.789Z",
        "2024-05-01T12:34:56Z",
        "2024-05-01T12:34:56.7Z",
        "2024-05-01T12:34:56.123456789Z",
        "2024-05-01T12:34:56.789+02:00",
        "2024-05-01t12:34:56.789z",
        "2024-13-01T12:34:56.789Z",
        "2024-02-30T12:34:56.789Z",
        "2024-05-01T24:00:00.000Z",
        "2024-05-01T12:34:60.000Z",
        "0000-01-01T00:00:00.000Z",
        "0001-01-01T00:00:00.000Z",
        "9999-12-31T23:59:59.999Z",
        "2024-05-01 12:34:56.789Z",
        "\u0662\u0660\u0662\u0664-05-01T12:34:56.789Z",
        "2024-05-01T12:34:56.789Z ",
        "",
    ],
}
ORDERING_KEYS: list[Any] = [
    "k",
    "",
    "\u00e9" * 256,
    "\u00e9" * 513,
    "\U0001f600" * 256,
    "\U0001f600" * 257,
    "\ud800" * 300,
    "\ud800" * 342,
    None,
]


def outcome(attributes: Mapping[str, Any]) -> Any:
    try:
        parsed = ChunkHeaders.from_attributes(attributes)
    except WireError as exc:
        return ("error", type(exc).__name__, str(exc), exc.reason)
    return (
        "ok",
        dataclasses.astuple(parsed),
        type(parsed.content_type),
        parsed.produced_at.tzinfo,
        parsed.to_attributes(),
    )


@contextmanager
def full_parse_only() -> Iterator[None]:
    with mock.patch.object(chunk_headers, "_headers_as_written", return_value=None):
        yield


def assert_alike(attributes: Mapping[str, Any]) -> None:
    fast = outcome(attributes)
    with full_parse_only():
        full = outcome(attributes)
    assert fast == full


def with_value(name: str, value: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = dict(CANONICAL)
    if value is None and name == fields.H_ORDERING_KEY:
        attrs.pop(name, None)
    else:
        attrs[name] = value
    return attrs


def test_fast_path_is_taken_for_what_producers_write() -> None:
    for encoding in Encoding:
        for key in (None, "k"):
            attrs = ChunkHeaders(
                chunk_id="c-1", table="t", row_count=3, content_type=encoding, ordering_key=key
            ).to_attributes()
            fast = chunk_headers._headers_as_written(attrs)
            assert fast is not None
            with full_parse_only():
                assert fast == ChunkHeaders.from_attributes(attrs)


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in EDGES.items() for value in values]
    + [(fields.H_ORDERING_KEY, key) for key in ORDERING_KEYS],
)
def test_each_edge_value_parses_alike(name: str, value: Any) -> None:
    assert_alike(with_value(name, value))


@pytest.mark.parametrize(
    "extra",
    [
        {"googclient_schemaencoding": "JSON"},
        {"Rowbatch-Table": "orders"},
        {"Rowbatch-Table": "other"},
        {"ROWBATCH-CHUNK-ID": "x"},
        {"x-\u00c9": "1"},
        {"x-\u00df": "1"},
    ],
)
def test_other_names_parse_alike(extra: dict[str, str]) -> None:
    assert_alike({**CANONICAL, **extra})


def test_missing_headers_parse_alike() -> None:
    for name in CANONICAL:
        attrs = dict(CANONICAL)
        del attrs[name]
        assert_alike(attrs)


_FIELD = st.sampled_from([*EDGES, fields.H_ORDERING_KEY])


@PROPERTY
@given(
    changes=st.lists(
        st.tuples(
            _FIELD,
            st.one_of(
                st.sampled_from([v for values in EDGES.values() for v in values]),
                st.sampled_from(ORDERING_KEYS),
                st.text(max_size=30),
                st.text(alphabet="0123456789-T:.Z+ ", max_size=30),
            ),
        ),
        max_size=4,
    )
)
def test_any_attributes_parse_alike(changes: list[tuple[str, Any]]) -> None:
    attrs: dict[str, Any] = dict(CANONICAL)
    for name, value in changes:
        attrs.update(with_value(name, value) if name == fields.H_ORDERING_KEY else {name: value})
        if value is None and name == fields.H_ORDERING_KEY:
            attrs.pop(name, None)
    assert_alike(attrs)


@PROPERTY
@given(moment=st.datetimes(timezones=st.just(dt.UTC)), count=st.integers(0, 10**18 - 1))
def test_produced_timestamps_parse_alike(moment: dt.datetime, count: int) -> None:
    attrs = with_value(fields.H_PRODUCED_AT, fields.format_timestamp(moment))
    attrs[fields.H_ROW_COUNT] = str(count)
    assert chunk_headers._headers_as_written(attrs) is not None
    assert_alike(attrs)


kafka_values = st.one_of(
    st.none(),
    st.binary(max_size=8),
    st.text(max_size=6).map(lambda t: t.encode("utf-8")),
    st.binary(max_size=4).map(bytearray),
)


def kafka_outcome(headers: Any) -> Any:
    try:
        return fields.kafka_headers_to_attributes(headers)
    except WireError as exc:
        return (type(exc).__name__, str(exc))


@settings(max_examples=300)
@given(
    headers=st.lists(st.tuples(st.sampled_from(["a", "b", "rowbatch-table"]), kafka_values)),
)
def test_kafka_headers_read_alike_either_way(headers: list[tuple[str, Any]]) -> None:
    """A list (the fast path) reads as the same headers one at a time (the general loop)."""
    assert kafka_outcome(list(headers)) == kafka_outcome(iter(headers))
    assert kafka_outcome(tuple(headers)) == kafka_outcome(iter(headers))
