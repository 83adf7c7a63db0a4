"""Duplicate dead letters (issue 46): a consumer killed after a dead letter was confirmed and
before its message was acked dead-letters the redelivered message again under the same chunk
id (a row part's id is derived from its parent and rows), so the queue holds copies of one
letter. ``stats`` counts it once (and says how many copies were collapsed), ``show`` lists it
once ("seen N times"), ``replay`` publishes it once and removes every copy, each only after the
publish of the letter it copies was confirmed. A letter of the same chunk dead-lettered again
after a replay (its replay count one higher) is a later letter, not a copy."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rowbatch.consumer.dlq.letters import REPLAY_COUNT, REPLAYED_FROM, DeadLetter
from rowbatch.consumer.dlq.replay import ReplayPlan, replay
from rowbatch.consumer.dlq.selection import Selection
from rowbatch.consumer.dlq.show import collect, describe, to_json
from rowbatch.consumer.dlq.stats import Stats
from rowbatch.consumer.service import dlq_cli
from rowbatch.wire.chunks.encode import encode_chunk
from rowbatch.wire.chunks.row_parts import row_part
from tests.unit.consumer.dlq.test_replay import TARGET, FakeQueue, as_queue
from tests.unit.consumer.service.test_table_cli import REST

T = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PARENT = encode_chunk(
    "docs", {"id": np.arange(4, dtype=np.int64), "text": ["a", "b", "c", "d"]}, "json", "c1"
)


def part(rows: list[int]) -> tuple[bytes, dict[str, str]]:
    """The row part a consumer dead-letters for ``rows`` of ``PARENT`` (the same bytes and
    chunk id each time)."""
    return row_part(PARENT.payload, PARENT.attributes, rows)


def dead(
    ref: str,
    rows: list[int] | None = None,
    *,
    attempt: int = 1,
    minute: int = 0,
    reason: str = "rejected-by-model",
    code: str = "invalid_argument",
    replays: int | None = None,
    version: str = "1.4.0",
    payload: bytes | None = None,
    key: bytes | None = None,
) -> DeadLetter:
    """A row part of ``PARENT`` as the consumer dead-letters it on delivery ``attempt``: what
    differs between two dead-letterings of one part is the time, attempt, message and where
    it sits in the queue."""
    body, attributes = part([1] if rows is None else rows)
    attributes |= {
        "rowbatch-dlq-reason": reason,
        "rowbatch-dlq-code": code,
        "rowbatch-dlq-message": f"row 1 rejected (attempt {attempt})",
        "rowbatch-dlq-source": "rows/0",
        "rowbatch-dlq-message-id": "rows/0/17",
        "rowbatch-dlq-delivery-attempt": str(attempt),
        "rowbatch-dlq-consumer-version": version,
        "rowbatch-dlq-time": T.replace(minute=minute).isoformat().replace("+00:00", "Z"),
    }
    if replays is not None:
        attributes[REPLAY_COUNT] = str(replays)
        attributes[REPLAYED_FROM] = "rows.dlq/0/1"
    return DeadLetter(
        ref=ref, payload=body if payload is None else payload, attributes=attributes, key=key
    )


# --- which letters are copies ------------------------------------------------------------


def test_a_part_dead_lettered_twice_has_one_identity() -> None:
    first, again = dead("rows.dlq/0/3", attempt=1), dead("rows.dlq/0/9", attempt=2, minute=5)
    assert first.attributes != again.attributes  # time, attempt and message differ
    assert first.identity is not None
    assert first.identity == again.identity
    assert first.copy_key == again.copy_key


@pytest.mark.parametrize(
    "other",
    [
        dead("x", rows=[2]),  # another part: another chunk id
        dead("x", reason="rejected-by-sink", code="sink_rejected_value"),
        dead("x", code="internal"),
        dead("x", replays=1),  # dead-lettered again after a replay: a later letter
        dead("x", payload=b"[]"),  # not the same content
        dead("x", key=b"k"),
    ],
)
def test_letters_that_differ_in_what_they_carry_are_not_copies(other: DeadLetter) -> None:
    assert other.copy_key is not None
    assert other.copy_key != dead("y").copy_key


def test_a_letter_without_a_chunk_id_or_a_table_row_is_never_a_copy() -> None:
    assert DeadLetter(ref="a", payload=b"x", attributes={}).identity is None
    row = DeadLetter(
        ref="shard-0-of-1/a.parquet#3",
        payload=b"{}",
        attributes={"rowbatch-chunk-id": "c1"},
        values={"id": 3},
    )
    assert row.identity is None  # a table run keeps one record per row already
    assert row.copy_key is None


def test_a_message_without_a_chunk_id_is_named_by_where_it_was_read() -> None:
    """An undecodable message missing its headers, dead-lettered on two deliveries."""

    def undecodable(ref: str, attempt: int, message_id: str = "rows/0/17") -> DeadLetter:
        return DeadLetter(
            ref=ref,
            payload=b"\x00garbage",
            attributes={
                "rowbatch-dlq-reason": "undecodable",
                "rowbatch-dlq-code": "missing_header",
                "rowbatch-dlq-source": "rows/0",
                "rowbatch-dlq-message-id": message_id,
                "rowbatch-dlq-delivery-attempt": str(attempt),
            },
        )

    first = undecodable("rows.dlq/0/3", 1)
    assert first.copy_key is not None
    assert first.copy_key == undecodable("rows.dlq/0/8", 2).copy_key
    assert first.copy_key != undecodable("rows.dlq/0/9", 1, message_id="rows/0/18").copy_key
    no_id = {k: v for k, v in first.attributes.items() if k != "rowbatch-dlq-message-id"}
    assert DeadLetter(ref="x", payload=b"\x00garbage", attributes=no_id).identity is None


def test_a_different_consumer_version_is_still_a_copy() -> None:
    assert dead("a").copy_key == dead("b", version="1.5.0").copy_key


# --- stats -------------------------------------------------------------------------------


def test_stats_count_a_letter_once_and_say_how_many_copies() -> None:
    stats = Stats(read=4)
    for one in (
        dead("rows.dlq/0/3", minute=1),
        dead("rows.dlq/0/9", attempt=2, minute=4),
        dead("rows.dlq/0/12", attempt=3, minute=6, version="1.5.0"),
        dead("rows.dlq/0/20", rows=[2, 3]),
    ):
        stats.add(one)
    assert stats.total == 2
    assert stats.duplicates == 2
    assert stats.by_reason() == {"rejected-by-model": 2}
    group = stats.groups[("rejected-by-model", "invalid_argument", "docs", "rows/0", "1.4.0")]
    assert (group.count, group.rows, group.duplicates) == (2, 3, 2)  # 1 + 2 rows, once each
    assert ("rejected-by-model", "invalid_argument", "docs", "rows/0", "1.5.0") not in (
        stats.groups
    )  # the copy counts with the letter it copies
    got = stats.to_json()
    assert (got["read"], got["selected"], got["duplicates"]) == (4, 2, 2)
    assert got["groups"][0]["duplicates"] == 2
    head, row, footer = stats.lines()
    assert head.split()[5:8] == ["count", "duplicates", "rows"]
    assert row.split()[5:8] == ["2", "2", "3"]
    assert footer == "2 selected of 4 read (2 duplicates collapsed)"


def test_stats_without_copies_keep_their_table() -> None:
    stats = Stats(read=2)
    stats.add(dead("a"))
    stats.add(dead("b", rows=[2]))
    head, _, footer = stats.lines()
    assert "duplicates" not in head
    assert footer == "2 selected of 2 read"
    assert stats.to_json()["duplicates"] == 0


# --- show --------------------------------------------------------------------------------


async def letters_of(*letters: DeadLetter) -> AsyncIterator[DeadLetter]:
    for one in letters:
        yield one


async def test_show_lists_a_letter_once_with_the_times_it_was_seen() -> None:
    shown = await collect(
        letters_of(
            dead("rows.dlq/0/3"),
            dead("rows.dlq/0/4", rows=[2]),
            dead("rows.dlq/0/9", attempt=2),
            dead("rows.dlq/1/2", attempt=3),
        ),
        Selection(),
        limit=10,
    )
    assert [(s.letter.ref, s.seen, s.copies) for s in shown] == [
        ("rows.dlq/0/3", 3, ["rows.dlq/0/9", "rows.dlq/1/2"]),
        ("rows.dlq/0/4", 1, []),
    ]
    lines = describe(shown[0].letter, 1, copies=shown[0].copies)
    assert "  seen     3 times: also at rows.dlq/0/9, rows.dlq/1/2" in lines
    assert not any("seen" in line for line in describe(shown[1].letter, 1))
    got = to_json(shown[0].letter, 1, copies=shown[0].copies)
    assert (got["seen"], got["copies"]) == (3, ["rows.dlq/0/9", "rows.dlq/1/2"])
    assert to_json(shown[1].letter, 1)["seen"] == 1


async def test_show_counts_the_copies_of_what_it_shows_past_its_limit() -> None:
    shown = await collect(
        letters_of(dead("a"), dead("b", rows=[2]), dead("c", rows=[3]), dead("d", attempt=2)),
        Selection(),
        limit=1,
    )
    assert [(s.letter.ref, s.seen) for s in shown] == [("a", 2)]


async def test_show_collapses_only_the_selected_letters() -> None:
    since = Selection(since=T.replace(minute=3))
    shown = await collect(
        letters_of(dead("a", minute=1), dead("b", attempt=2, minute=4)), since, limit=10
    )
    assert [(s.letter.ref, s.seen) for s in shown] == [("b", 1)]


async def test_show_limit_zero_reads_nothing_more() -> None:
    assert await collect(letters_of(dead("a"), dead("b")), Selection(), limit=0) == []


# --- replay ------------------------------------------------------------------------------


async def test_replay_publishes_a_letter_once_and_removes_every_copy_after_it() -> None:
    fake = FakeQueue(
        [dead("a"), dead("b", rows=[2, 3]), dead("c", attempt=2), dead("d", attempt=3, minute=9)]
    )
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=1))
    assert [ref for ref, *_ in fake.published] == ["a", "b"]
    landed = {ref: f"{TARGET}/0/{n}" for n, (ref, *_) in enumerate(fake.published)}
    assert sorted(fake.removed) == sorted(
        [("a", landed["a"]), ("b", landed["b"]), ("c", landed["a"]), ("d", landed["a"])]
    )  # each copy names where its letter landed
    for copy in ("c", "d"):
        assert fake.calls.index(("publish", "a")) < fake.calls.index(("remove", copy))
    assert (summary.read, summary.matched, summary.replayed, summary.rows) == (4, 2, 2, 3)
    assert (summary.duplicates, summary.duplicates_removed) == (2, 2)
    assert summary.lines()[0] == "read 4 dead letters, 2 selected; replayed 2 (3 rows) to rows"
    assert summary.lines()[1] == (
        "2 duplicates of the selected letters (dead-lettered more than once): removed 2 once "
        "the letter they copy was published, none published again"
    )


class GatedQueue(FakeQueue):
    """Publishes that wait for the test to open ``gate`` (the broker's confirmation)."""

    def __init__(self, letters: list[DeadLetter], **kwargs: Any) -> None:
        super().__init__(letters, **kwargs)
        self.gate = asyncio.Event()
        self.publishing = asyncio.Event()

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        self.publishing.set()
        await self.gate.wait()
        return await super().publish(letter, topic)


async def test_a_copy_read_while_its_letter_is_being_published_waits_for_the_confirmation() -> None:
    fake = GatedQueue([dead("a"), dead("c", attempt=2)])
    running = asyncio.create_task(
        replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=4))
    )
    await fake.publishing.wait()
    for _ in range(20):
        await asyncio.sleep(0)  # the copy has been read and is waiting
    assert fake.removed == []  # nothing removed before the publish is confirmed
    fake.gate.set()
    summary = await running
    assert fake.calls[0] == ("publish", "a")
    assert sorted(ref for ref, _ in fake.removed) == ["a", "c"]
    assert (summary.replayed, summary.duplicates_removed) == (1, 1)


async def test_the_copies_of_a_letter_whose_publish_failed_stay_in_the_queue() -> None:
    fake = FakeQueue(
        [dead("a"), dead("c", attempt=2), dead("d", attempt=3)], fail_publish=frozenset({"a"})
    )
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=4))
    assert fake.removed == []
    assert summary.failed is not None and summary.failed.startswith("publishing a to rows")
    assert summary.duplicates_removed == 0


async def test_a_copy_is_removed_even_when_its_letter_could_not_be_removed() -> None:
    """Its letter was published: the copy may go; the letter stays and a rerun publishes it
    again (its rows land once)."""
    fake = FakeQueue([dead("a"), dead("c", attempt=2)], fail_remove=frozenset({"a"}))
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=4))
    assert summary.failed is not None and "a was replayed as" in summary.failed
    assert [ref for ref, _ in fake.removed] == ["c"]
    assert [ref for ref, *_ in fake.published] == ["a"]


async def test_a_copy_that_cannot_be_removed_stops_the_replay_naming_it() -> None:
    fake = FakeQueue(
        [dead("a"), dead("c", attempt=2), dead("e", rows=[3])], fail_remove=frozenset({"c"})
    )
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=1))
    assert summary.failed is not None
    assert summary.failed.startswith("c (a copy of a, replayed as rows/0/0) could not be removed")
    assert ("publish", "e") not in fake.calls


async def test_a_killed_replay_rerun_leaves_no_copy_and_publishes_each_letter() -> None:
    """The first run stops after publishing ``a`` (its removal not confirmed, as a kill
    leaves it); the rerun publishes ``a`` again (its rows land once: same chunk id) and
    removes it and its copy."""
    letters = [dead("a"), dead("b", rows=[2]), dead("c", attempt=2)]
    first = FakeQueue(letters, fail_remove=frozenset({"a"}))
    await replay(as_queue(first), Selection(), ReplayPlan(target=TARGET, in_flight=1))
    removed = {ref for ref, _ in first.removed}
    rerun = FakeQueue([one for one in letters if one.ref not in removed])
    summary = await replay(as_queue(rerun), Selection(), ReplayPlan(target=TARGET))
    assert summary.failed is None
    assert removed | {ref for ref, _ in rerun.removed} == {"a", "b", "c"}
    published = [p for p, *_ in first.published] + [p for p, *_ in rerun.published]
    assert set(published) == {"a", "b"}  # c was never published: a copy


async def test_a_dry_run_counts_the_copies_it_would_remove() -> None:
    fake = FakeQueue([dead("a"), dead("c", attempt=2)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, dry_run=True))
    assert fake.calls == []
    assert (summary.replayed, summary.duplicates, summary.duplicates_removed) == (1, 1, 1)
    assert summary.lines()[1].startswith("1 duplicate of the selected letters")
    assert "would remove 1" in summary.lines()[1]


async def test_the_copies_of_a_letter_held_back_stay_with_it() -> None:
    fake = FakeQueue([dead("a", replays=3), dead("c", attempt=2, replays=3)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, max_replays=3))
    assert fake.calls == []
    assert (summary.held_back, summary.duplicates, summary.duplicates_removed) == (1, 1, 0)
    assert "1 left in the queue with their letter" in summary.lines()[1]


async def test_a_letter_dead_lettered_again_after_a_replay_is_replayed_on_its_own() -> None:
    fake = FakeQueue([dead("a"), dead("b", replays=1)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET))
    assert [ref for ref, *_ in fake.published] == ["a", "b"]
    assert summary.duplicates == 0


async def test_limit_counts_letters_and_still_removes_the_copies_read_after_it() -> None:
    fake = FakeQueue([dead("a"), dead("b", rows=[2]), dead("c", attempt=2)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, limit=1))
    assert [ref for ref, *_ in fake.published] == ["a"]
    assert sorted(ref for ref, _ in fake.removed) == ["a", "c"]
    assert (summary.matched, summary.replayed, summary.duplicates_removed) == (1, 1, 1)


async def test_copies_are_removed_with_many_in_flight() -> None:
    letters = [dead(f"l{i:02d}", rows=[i % 4], attempt=i) for i in range(20)]
    fake = FakeQueue(letters)
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=3))
    assert sorted(ref for ref, *_ in fake.published) == ["l00", "l01", "l02", "l03"]
    assert sorted(ref for ref, _ in fake.removed) == [one.ref for one in letters]
    assert (summary.replayed, summary.duplicates_removed) == (4, 16)


# --- the command line --------------------------------------------------------------------


def test_the_commands_collapse_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in list(os.environ):
        if name.startswith("ROWBATCH_"):
            monkeypatch.delenv(name)
    config = tmp_path / "consumer.toml"
    config.write_text(
        '[source]\nkind = "kafka"\nbootstrap_servers = "127.0.0.1:9092"\ntopic = "rows"\n'
        'group_id = "g"\n' + REST
    )
    fakes: list[FakeQueue] = []

    def open_queue(*_: Any) -> FakeQueue:
        fakes.append(FakeQueue([dead("a"), dead("c", attempt=2)]))
        return fakes[-1]

    monkeypatch.setattr(dlq_cli, "open_queue", open_queue)
    capsys.readouterr()
    assert dlq_cli.main(["stats", "--json", "--config", str(config)]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["read"], got["selected"], got["duplicates"]) == (2, 1, 1)
    assert dlq_cli.main(["show", "--json", "--config", str(config)]) == 0
    (shown,) = json.loads(capsys.readouterr().out)
    assert (shown["ref"], shown["seen"], shown["copies"]) == ("a", 2, ["c"])
    assert dlq_cli.main(["show", "--config", str(config)]) == 0
    assert "1 shown (--limit 10), 1 duplicate collapsed" in capsys.readouterr().out
    assert dlq_cli.main(["replay", "--config", str(config)]) == 0
    assert [ref for ref, *_ in fakes[-1].published] == ["a"]
    assert sorted(ref for ref, _ in fakes[-1].removed) == ["a", "c"]
