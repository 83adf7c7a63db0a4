"""``Selection``: each filter given must match (any of its values), ``--since`` is inclusive
and ``--until`` exclusive, a letter with no time is left out once a time filter is set; and
``parse_moment`` reads ``--since`` / ``--until`` as an ISO 8601 time or an age before ``now``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.dlq.selection import Selection, SelectionError, parse_moment

NOW = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def letter(
    *,
    reason: str = "undecodable",
    code: str = "invalid_json",
    table: str = "docs",
    chunk_id: str = "c1",
    source: str = "rows/0",
    time: datetime | None = T0,
) -> DeadLetter:
    return DeadLetter(
        ref="rows.dlq/0/1",
        payload=b"",
        attributes={
            "rowbatch-dlq-reason": reason,
            "rowbatch-dlq-code": code,
            "rowbatch-table": table,
            "rowbatch-chunk-id": chunk_id,
            "rowbatch-dlq-source": source,
        },
        queued_at=time,
    )


def test_an_empty_selection_matches_everything() -> None:
    everything = Selection()
    assert everything.matches(letter())
    assert everything.matches(letter(time=None))
    assert everything.matches(DeadLetter(ref="x", payload=b"", attributes={}))
    assert everything.describe() == "every dead letter"


@pytest.mark.parametrize(
    ("selection", "other"),
    [
        (
            Selection(reasons=frozenset({"rejected-by-model", "undecodable"})),
            letter(reason="schema-mismatch"),
        ),
        (Selection(codes=frozenset({"invalid_json"})), letter(code="corrupt_arrow")),
        (Selection(tables=frozenset({"docs", "other"})), letter(table="events")),
        (Selection(chunk_ids=frozenset({"c1"})), letter(chunk_id="c2")),
        (Selection(sources=frozenset({"rows/0"})), letter(source="rows/1")),
    ],
)
def test_each_filter_matches_its_values_only(selection: Selection, other: DeadLetter) -> None:
    assert selection.matches(letter())
    assert not selection.matches(other)


def test_every_filter_given_must_match() -> None:
    both = Selection(reasons=frozenset({"undecodable"}), tables=frozenset({"docs"}))
    assert both.matches(letter())
    assert not both.matches(letter(table="other"))
    assert not both.matches(letter(reason="schema-mismatch"))


def test_a_filter_for_unknown_matches_a_letter_without_the_field() -> None:
    bare = DeadLetter(ref="x", payload=b"", attributes={})
    assert Selection(tables=frozenset({"unknown"})).matches(bare)
    assert not Selection(tables=frozenset({"docs"})).matches(bare)


def test_since_is_inclusive_and_until_exclusive() -> None:
    window = Selection(since=T0, until=T0 + timedelta(hours=1))
    assert window.matches(letter(time=T0))
    assert window.matches(letter(time=T0 + timedelta(minutes=59, seconds=59)))
    assert not window.matches(letter(time=T0 - timedelta(microseconds=1)))
    assert not window.matches(letter(time=T0 + timedelta(hours=1)))


def test_only_since_or_only_until() -> None:
    assert Selection(since=T0).matches(letter(time=T0 + timedelta(days=300)))
    assert not Selection(since=T0).matches(letter(time=T0 - timedelta(seconds=1)))
    assert Selection(until=T0).matches(letter(time=T0 - timedelta(days=300)))
    assert not Selection(until=T0).matches(letter(time=T0))


@pytest.mark.parametrize(
    "selection", [Selection(since=T0 - timedelta(days=1)), Selection(until=NOW)]
)
def test_a_letter_without_a_time_is_left_out_once_a_time_filter_is_set(
    selection: Selection,
) -> None:
    assert selection.matches(letter(time=T0))
    assert not selection.matches(letter(time=None))


def test_the_consumer_time_is_what_a_time_filter_compares() -> None:
    dead_lettered = DeadLetter(
        ref="x",
        payload=b"",
        attributes={"rowbatch-dlq-time": "2026-12-01T00:00:00Z"},
        queued_at=T0,  # later: the queue got it after the consumer's time
    )
    assert not Selection(since=T0 - timedelta(hours=1)).matches(dead_lettered)
    assert Selection(until=T0 - timedelta(hours=1)).matches(dead_lettered)


def test_describe_names_the_filters() -> None:
    got = Selection(
        reasons=frozenset({"undecodable", "rejected-by-model"}),
        chunk_ids=frozenset({"c1"}),
        since=T0,
        until=NOW,
    ).describe()
    assert got == (
        "reason rejected-by-model|undecodable, chunk id c1, "
        "since 2026-12-02T12:00:00+00:00, until 2026-12-03T08:00:00+00:00"
    )


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("30s", timedelta(seconds=30)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        (" 7 d ", timedelta(days=7)),
        ("0m", timedelta(0)),
    ],
)
def test_an_age_is_that_long_before_now(text: str, ago: timedelta) -> None:
    assert parse_moment(text, now=NOW, option="--since") == NOW - ago


def test_an_iso_time_with_z_is_utc() -> None:
    got = parse_moment("2026-12-01T08:00:00Z", now=NOW, option="--since")
    assert got == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert got.utcoffset() == timedelta(0)


def test_a_naive_iso_time_is_utc() -> None:
    got = parse_moment("2026-12-01T08:00:00", now=NOW, option="--since")
    assert got == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    assert got.tzinfo is UTC
    assert parse_moment("2026-12-01", now=NOW, option="--since") == datetime(
        2026, 12, 1, tzinfo=UTC
    )


def test_an_iso_time_keeps_its_offset() -> None:
    got = parse_moment("2026-12-01T10:00:00+02:00", now=NOW, option="--until")
    assert got.tzinfo == timezone(timedelta(hours=2))
    assert got == datetime(2026, 12, 1, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize("text", ["yesterday", "2h ago", "7w", "-2h", "", "2026-13-01"])
def test_a_bad_value_names_the_option(text: str) -> None:
    with pytest.raises(SelectionError, match=r"^--until ") as caught:
        parse_moment(text, now=NOW, option="--until")
    assert repr(text) in str(caught.value)
    assert "30m, 2h, 7d" in str(caught.value)


def test_a_lower_case_z_is_utc_too() -> None:
    """As the wire's timestamps: a lower-case z is accepted."""
    moment = parse_moment("2026-12-03T08:00:00z", now=NOW, option="--since")
    assert moment == datetime(2026, 12, 3, 8, tzinfo=UTC)
