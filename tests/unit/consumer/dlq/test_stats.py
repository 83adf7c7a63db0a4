"""``dlq stats``: letters grouped by (reason, code, table, source, version), their rows summed
(a group with letters without a readable row count says how many, beside the rows known), the
first and last time, as a padded table or as JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.dlq.stats import Stats, table_lines

T = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def letter(
    reason: str,
    *,
    code: str = "c",
    table: str = "docs",
    rows: str | None = "10",
    minute: int | None = 0,
    replays: str | None = None,
) -> DeadLetter:
    attributes = {
        "rowbatch-dlq-reason": reason,
        "rowbatch-dlq-code": code,
        "rowbatch-table": table,
        "rowbatch-dlq-source": "rows/0",
        "rowbatch-dlq-consumer-version": "1.4.0",
    }
    if rows is not None:
        attributes["rowbatch-row-count"] = rows
    if replays is not None:
        attributes["rowbatch-replay-count"] = replays
    return DeadLetter(
        ref="rows.dlq/0/1",
        payload=b"",
        attributes=attributes,
        queued_at=None if minute is None else T.replace(minute=minute),
    )


def stats_of(*letters: DeadLetter, read: int | None = None) -> Stats:
    stats = Stats(read=len(letters) if read is None else read)
    for one in letters:
        stats.add(one)
    return stats


def test_letters_are_grouped_by_their_key_with_rows_summed() -> None:
    stats = stats_of(
        letter("undecodable", code="invalid_json", rows="3", minute=5),
        letter("undecodable", code="invalid_json", rows="4", minute=1),
        letter("undecodable", code="invalid_json", rows="5", minute=9),
        letter("undecodable", code="corrupt_arrow", rows="7", minute=2),
        letter("rejected-by-model", code="invalid_argument", rows="1", replays="1"),
    )
    assert stats.total == 5
    assert stats.by_reason() == {"undecodable": 4, "rejected-by-model": 1}
    json_group = stats.groups[("undecodable", "invalid_json", "docs", "rows/0", "1.4.0")]
    assert (json_group.count, json_group.rows, json_group.unknown_rows) == (3, 12, 0)
    assert json_group.first == T.replace(minute=1)
    assert json_group.last == T.replace(minute=9)
    assert json_group.replayed_before == 0
    model = stats.groups[("rejected-by-model", "invalid_argument", "docs", "rows/0", "1.4.0")]
    assert model.replayed_before == 1
    assert len(stats.groups) == 3


def test_a_group_with_unknown_row_counts_says_how_many_letters_beside_the_rows_known() -> None:
    stats = stats_of(
        letter("undecodable", rows="3"),
        letter("undecodable", rows=None),
        letter("undecodable", rows="garbage"),
    )
    (group,) = stats.groups.values()
    assert (group.count, group.rows, group.unknown_rows) == (3, 3, 2)
    head, row, footer = stats.lines()
    assert "3 known + 2 letters of unknown size" in row
    assert "?" not in row
    assert head.split() == [
        "reason",
        "code",
        "table",
        "source",
        "version",
        "count",
        "rows",
        "first",
        "last",
    ]
    assert head.index("rows") == row.index("3 known")  # the column lines up
    assert footer == "3 selected of 3 read"


def test_one_letter_of_unknown_size_and_no_rows_known() -> None:
    _, row, _ = stats_of(letter("undecodable", rows=None)).lines()
    assert "0 known + 1 letter of unknown size" in row


def test_rows_are_plain_when_every_count_is_known() -> None:
    _, row, _ = stats_of(letter("undecodable", rows="3"), letter("undecodable", rows="4")).lines()
    assert row.split()[5:7] == ["2", "7"]
    assert "known" not in row


def test_a_group_without_times_has_no_first_or_last() -> None:
    stats = stats_of(letter("undecodable", minute=None), read=10)
    (group,) = stats.groups.values()
    assert group.first is None
    assert group.last is None
    _, row, footer = stats.lines()
    assert row.split()[-2:] == ["-", "-"]
    assert footer == "1 selected of 10 read"
    assert stats.to_json()["groups"][0]["first"] is None


def test_to_json_shape() -> None:
    stats = stats_of(
        letter("undecodable", code="invalid_json", rows="3", minute=5),
        letter("undecodable", code="invalid_json", rows=None, minute=7, replays="2"),
        letter("rejected-by-model", code="invalid_argument", rows="1", minute=3),
        read=7,
    )
    got = stats.to_json()
    assert json.loads(json.dumps(got)) == got  # plain JSON
    assert got == {
        "read": 7,
        "selected": 3,
        "duplicates": 0,
        "by_reason": {"undecodable": 2, "rejected-by-model": 1},
        "groups": [
            {
                "reason": "rejected-by-model",
                "code": "invalid_argument",
                "table": "docs",
                "source": "rows/0",
                "version": "1.4.0",
                "count": 1,
                "duplicates": 0,
                "rows": 1,
                "letters_without_row_count": 0,
                "replayed_before": 0,
                "first": "2026-12-02T12:03:00+00:00",
                "last": "2026-12-02T12:03:00+00:00",
            },
            {
                "reason": "undecodable",
                "code": "invalid_json",
                "table": "docs",
                "source": "rows/0",
                "version": "1.4.0",
                "count": 2,
                "duplicates": 0,
                "rows": 3,
                "letters_without_row_count": 1,
                "replayed_before": 1,
                "first": "2026-12-02T12:05:00+00:00",
                "last": "2026-12-02T12:07:00+00:00",
            },
        ],
    }


def test_letters_without_fields_group_under_unknown() -> None:
    stats = stats_of(DeadLetter(ref="x", payload=b"", attributes={}))
    assert list(stats.groups) == [("unknown",) * 5]
    assert stats.by_reason() == {"unknown": 1}


def test_an_empty_stats() -> None:
    stats = Stats(read=4)
    assert stats.total == 0
    assert stats.by_reason() == {}
    assert stats.to_json() == {
        "read": 4,
        "selected": 0,
        "duplicates": 0,
        "by_reason": {},
        "groups": [],
    }
    assert stats.lines()[-1] == "0 selected of 4 read"
    assert len(stats.lines()) == 2  # the head and the footer


def test_the_table_sorts_groups_by_key() -> None:
    lines = stats_of(letter("undecodable"), letter("rejected-by-model")).lines()
    assert [line.split()[0] for line in lines[1:-1]] == ["rejected-by-model", "undecodable"]


def test_table_lines_pad_columns_and_right_align_numbers() -> None:
    got = table_lines(("name", "count"), [("a", "7"), ("longer", "1234"), ("b", "x")])
    assert got == [
        "name    count",
        "a           7",
        "longer   1234",
        "b       x",  # not a number: left-aligned (trailing spaces stripped)
    ]
