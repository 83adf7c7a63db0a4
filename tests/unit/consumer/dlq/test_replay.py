"""``dlq replay`` over an in-memory queue: each letter is published and only then removed; a
publish or removal that fails stops the replay with the letter left in the queue; a dry run
touches nothing; ``limit`` and ``max_replays`` bound it; a letter this run replayed that comes
back (a queue read to its live end) is counted, not replayed again; progress on a fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from rowbatch.consumer.dlq.letters import REPLAY_COUNT, REPLAYED_FROM, DeadLetter
from rowbatch.consumer.dlq.queue import DeadLetterQueue, DeadLetterQueueError
from rowbatch.consumer.dlq.replay import DEFAULT_MAX_REPLAYS, ReplayPlan, ReplaySummary, replay
from rowbatch.consumer.dlq.selection import Selection
from rowbatch.timing import Clocks

TARGET = "rows"


def letter(
    ref: str,
    *,
    reason: str = "rejected-by-model",
    rows: int | None = 4,
    replays: int | None = None,
    replayed_from: str | None = None,
) -> DeadLetter:
    attributes = {"rowbatch-chunk-id": f"chunk-{ref}", "rowbatch-dlq-reason": reason}
    if rows is not None:
        attributes["rowbatch-row-count"] = str(rows)
    if replays is not None:
        attributes[REPLAY_COUNT] = str(replays)
    if replayed_from is not None:
        attributes[REPLAYED_FROM] = replayed_from
    return DeadLetter(ref=ref, payload=b"payload-" + ref.encode(), attributes=attributes)


class Clock:
    """A monotonic clock the test moves (the queue moves it on each publish)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeQueue:
    """A dead-letter queue in a list. Records every publish and remove in order; the refs in
    ``fail_publish`` / ``fail_remove`` are not confirmed; a letter whose ref is in
    ``fails_again`` comes back to the queue (at its end, with the replay attributes) once it
    is published, as a Pub/Sub read that runs to the live end would see it."""

    def __init__(
        self,
        letters: list[DeadLetter],
        *,
        fail_publish: frozenset[str] = frozenset(),
        fail_remove: frozenset[str] = frozenset(),
        fails_again: frozenset[str] = frozenset(),
        clock: Clock | None = None,
        publish_takes_s: float = 0.0,
    ) -> None:
        self.queue = list(letters)
        self.fail_publish = fail_publish
        self.fail_remove = fail_remove
        self.fails_again = fails_again
        self.clock = clock
        self.publish_takes_s = publish_takes_s
        self.calls: list[tuple[str, str]] = []
        self.published: list[tuple[str, str, bytes, dict[str, str]]] = []
        """(ref, topic, payload, attributes) of each confirmed publish."""
        self.removed: list[tuple[str, str]] = []
        """(ref, replayed_as) of each confirmed removal."""
        self.closed = False

    @property
    def where(self) -> str:
        return "an in-memory queue"

    @property
    def default_target(self) -> str:
        return TARGET

    async def letters(self) -> AsyncIterator[DeadLetter]:
        i = 0
        while i < len(self.queue):  # sees what is appended while it runs
            yield self.queue[i]
            i += 1

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        self.calls.append(("publish", letter.ref))
        if self.clock is not None:
            self.clock.now += self.publish_takes_s
        if letter.ref in self.fail_publish:
            raise DeadLetterQueueError(f"publish of {letter.ref}: broker said no")
        landed = f"{topic}/0/{len(self.published)}"
        self.published.append((letter.ref, topic, letter.payload, letter.replay_attributes()))
        if letter.ref in self.fails_again:
            self.queue.append(
                DeadLetter(
                    ref=f"{letter.ref}-again",
                    payload=letter.payload,
                    attributes={
                        **letter.replay_attributes(),
                        "rowbatch-dlq-reason": letter.reason,
                    },
                )
            )
        return landed

    async def remove(self, letter: DeadLetter, replayed_as: str) -> None:
        self.calls.append(("remove", letter.ref))
        if letter.ref in self.fail_remove:
            raise DeadLetterQueueError(f"ack of {letter.ref}: deadline exceeded")
        self.removed.append((letter.ref, replayed_as))

    async def close(self) -> None:
        self.closed = True


def as_queue(fake: FakeQueue) -> DeadLetterQueue:
    return fake  # checks that the fake implements the Protocol


async def test_each_letter_is_published_then_removed() -> None:
    fake = FakeQueue([letter("a"), letter("b"), letter("c", rows=None)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET))
    assert fake.calls == [
        ("publish", "a"),
        ("remove", "a"),
        ("publish", "b"),
        ("remove", "b"),
        ("publish", "c"),
        ("remove", "c"),
    ]
    assert fake.removed == [("a", "rows/0/0"), ("b", "rows/0/1"), ("c", "rows/0/2")]
    assert [(ref, topic, payload) for ref, topic, payload, _ in fake.published] == [
        ("a", TARGET, b"payload-a"),
        ("b", TARGET, b"payload-b"),
        ("c", TARGET, b"payload-c"),
    ]
    assert summary == ReplaySummary(
        target=TARGET, dry_run=False, read=3, matched=3, replayed=3, rows=8
    )
    assert summary.lines() == [
        "read 3 dead letters, 3 selected; replayed 3 (8 rows) to rows",
    ]


async def test_the_replay_publishes_the_replay_attributes() -> None:
    fake = FakeQueue([letter("a", replays=1)])
    await replay(as_queue(fake), Selection(), ReplayPlan(target="elsewhere"))
    ((ref, topic, _, attributes),) = fake.published
    assert (ref, topic) == ("a", "elsewhere")
    assert attributes == {
        "rowbatch-chunk-id": "chunk-a",
        "rowbatch-row-count": "4",
        REPLAYED_FROM: "a",
        REPLAY_COUNT: "2",
    }


async def test_a_publish_failure_stops_the_replay_and_leaves_the_letter() -> None:
    fake = FakeQueue([letter("a"), letter("b"), letter("c")], fail_publish=frozenset({"b"}))
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=1))
    assert fake.calls == [("publish", "a"), ("remove", "a"), ("publish", "b")]
    assert [ref for ref, _ in fake.removed] == ["a"]  # b was not removed
    assert summary.replayed == 1
    assert summary.failed is not None
    assert summary.failed.startswith("publishing b to rows failed: ")
    assert "broker said no" in summary.failed
    assert summary.lines()[-1] == (
        f"stopped: {summary.failed}; the rest stay in the dead-letter queue"
    )


async def test_a_remove_failure_stops_and_says_a_rerun_replays_it_again() -> None:
    fake = FakeQueue([letter("a"), letter("b"), letter("c")], fail_remove=frozenset({"b"}))
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=1))
    assert fake.calls == [("publish", "a"), ("remove", "a"), ("publish", "b"), ("remove", "b")]
    assert summary.failed is not None
    assert summary.failed.startswith("b was replayed as rows/0/1 but could not be removed")
    assert "deadline exceeded" in summary.failed
    assert "a rerun replays it again" in summary.failed
    assert summary.replayed == 1  # b is not counted: it is still in the queue


async def test_a_dry_run_publishes_and_removes_nothing_but_counts() -> None:
    fake = FakeQueue([letter("a", rows=2), letter("b", reason="undecodable"), letter("c", rows=5)])
    summary = await replay(
        as_queue(fake),
        Selection(reasons=frozenset({"rejected-by-model"})),
        ReplayPlan(target=TARGET, dry_run=True),
    )
    assert fake.calls == []
    assert (summary.read, summary.matched, summary.replayed, summary.rows) == (3, 2, 2, 7)
    assert summary.lines() == [
        "read 3 dead letters, 2 selected; would replay 2 (7 rows) to rows",
    ]


async def test_only_the_selected_letters_are_replayed() -> None:
    fake = FakeQueue([letter("a", reason="undecodable"), letter("b"), letter("c")])
    summary = await replay(
        as_queue(fake), Selection(reasons=frozenset({"undecodable"})), ReplayPlan(target=TARGET)
    )
    assert fake.calls == [("publish", "a"), ("remove", "a")]
    assert (summary.read, summary.matched, summary.replayed) == (3, 1, 1)


async def test_limit_bounds_the_letters_replayed() -> None:
    fake = FakeQueue([letter(ref) for ref in "abcde"])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, limit=2))
    assert fake.calls == [("publish", "a"), ("remove", "a"), ("publish", "b"), ("remove", "b")]
    assert (summary.matched, summary.replayed) == (2, 2)


async def test_limit_counts_only_the_selected_letters() -> None:
    fake = FakeQueue([letter("a", reason="undecodable"), letter("b"), letter("c")])
    summary = await replay(
        as_queue(fake),
        Selection(reasons=frozenset({"rejected-by-model"})),
        ReplayPlan(target=TARGET, limit=1),
    )
    assert fake.calls == [("publish", "b"), ("remove", "b")]
    assert summary.replayed == 1


async def test_limit_zero_replays_nothing() -> None:
    fake = FakeQueue([letter("a")])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, limit=0))
    assert fake.calls == []
    assert summary.replayed == 0


async def test_letters_replayed_max_replays_times_are_held_back() -> None:
    fake = FakeQueue(
        [
            letter("a", replays=3),
            letter("b", replays=2),
            letter("c", replays=7),
            letter("d"),
        ]
    )
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, max_replays=3))
    assert fake.calls == [("publish", "b"), ("remove", "b"), ("publish", "d"), ("remove", "d")]
    assert (summary.matched, summary.replayed, summary.held_back) == (4, 2, 2)
    assert any(line.startswith("held back 2 replayed too often") for line in summary.lines())


async def test_the_default_max_replays_holds_back_at_three() -> None:
    assert DEFAULT_MAX_REPLAYS == 3
    fake = FakeQueue([letter("a", replays=3), letter("b", replays=2)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET))
    assert [ref for ref, _ in fake.removed] == ["b"]
    assert summary.held_back == 1


async def test_a_letter_that_comes_back_during_the_run_is_not_replayed_again() -> None:
    fake = FakeQueue([letter("a"), letter("b")], fails_again=frozenset({"a"}))
    summary = await replay(
        as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=1, max_replays=10)
    )
    assert [ref for ref, *_ in fake.published] == ["a", "b"]
    assert fake.queue[-1].attributes[REPLAYED_FROM] == "a"  # it did come back
    assert summary.came_back == 1
    assert (summary.read, summary.replayed) == (2, 2)
    assert "1 came back to the dead-letter queue during this replay" in summary.lines()[1]


async def test_a_letter_replayed_by_an_earlier_run_is_replayed() -> None:
    fake = FakeQueue([letter("b", replayed_from="a", replays=1)])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET))
    assert summary.came_back == 0
    assert summary.replayed == 1


async def test_progress_is_reported_on_the_clock_and_at_the_end() -> None:
    clock = Clock()
    fake = FakeQueue([letter(ref) for ref in "abcd"], clock=clock, publish_takes_s=1.5)
    seen: list[tuple[int, float]] = []

    def progress(summary: ReplaySummary) -> None:
        seen.append((summary.replayed, clock.now))

    await replay(
        as_queue(fake),
        Selection(),
        ReplayPlan(target=TARGET, in_flight=1),
        progress=progress,
        progress_every_s=2.0,
        clocks=Clocks(monotonic=clock),
    )
    # t = 101.5, 103 (2 s since the start: shown), 104.5, 106 (3 s since 103: shown), end
    assert seen == [(2, 103.0), (4, 106.0), (4, 106.0)]


async def test_progress_is_called_once_at_the_end_of_a_quick_run() -> None:
    clock = Clock()
    fake = FakeQueue([letter("a"), letter("b")])
    seen: list[int] = []
    await replay(
        as_queue(fake),
        Selection(),
        ReplayPlan(target=TARGET),
        progress=lambda s: seen.append(s.replayed),
        clocks=Clocks(monotonic=clock),
    )
    assert seen == [2]


async def test_progress_is_called_at_the_end_of_a_failed_run() -> None:
    fake = FakeQueue([letter("a")], fail_publish=frozenset({"a"}))
    seen: list[str | None] = []
    await replay(
        as_queue(fake),
        Selection(),
        ReplayPlan(target=TARGET),
        progress=lambda s: seen.append(s.failed),
        clocks=Clocks(monotonic=Clock()),
    )
    assert len(seen) == 1
    assert seen[0] is not None


async def test_an_empty_queue() -> None:
    summary = await replay(as_queue(FakeQueue([])), Selection(), ReplayPlan(target=TARGET))
    assert summary.lines() == ["read 0 dead letters, 0 selected; replayed 0 (0 rows) to rows"]


class SlowQueue(FakeQueue):
    """Publishes that yield to the loop a few times (as a broker round trip does), so several
    letters are between publish and removal at once; tracks how many at most."""

    def __init__(self, letters: list[DeadLetter], **kwargs: Any) -> None:
        super().__init__(letters, **kwargs)
        self.between: set[str] = set()
        self.most_between = 0

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        self.between.add(letter.ref)
        self.most_between = max(self.most_between, len(self.between))
        for _ in range(3):
            await asyncio.sleep(0)  # a yield to the loop, not a wait for time
        return await super().publish(letter, topic)

    async def remove(self, letter: DeadLetter, replayed_as: str) -> None:
        await asyncio.sleep(0)
        await super().remove(letter, replayed_as)
        self.between.discard(letter.ref)


async def test_a_window_keeps_at_most_in_flight_letters_each_published_before_removed() -> None:
    refs = [f"l{i}" for i in range(20)]
    fake = SlowQueue([letter(ref) for ref in refs])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=4))
    assert summary.replayed == 20 and summary.failed is None
    assert fake.most_between == 4
    for ref in refs:
        assert fake.calls.index(("publish", ref)) < fake.calls.index(("remove", ref))
    assert sorted(ref for ref, _ in fake.removed) == sorted(refs)


async def test_a_failure_in_a_window_starts_no_more_and_the_rest_in_flight_finish() -> None:
    refs = [f"l{i:02d}" for i in range(20)]
    fake = SlowQueue([letter(ref) for ref in refs], fail_publish=frozenset({"l05"}))
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET, in_flight=4))
    assert summary.failed is not None and "l05" in summary.failed
    removed = {ref for ref, _ in fake.removed}
    assert "l05" not in removed
    published = {ref for ref, *_ in fake.published}
    assert removed == published  # every confirmed publish was removed: none left between
    assert summary.replayed == len(removed)
    started = {ref for call, ref in fake.calls if call == "publish"}
    assert max(started) < "l10"  # at most a window past the failure was started


async def test_a_letter_the_queue_gives_twice_is_replayed_once() -> None:
    """A Pub/Sub lease that lapsed mid-read gives the same letter again (same ref)."""
    fake = FakeQueue([letter("a"), letter("b"), letter("a")])
    summary = await replay(as_queue(fake), Selection(), ReplayPlan(target=TARGET))
    assert [ref for ref, _ in fake.removed] == ["a", "b"]
    assert summary.replayed == 2


async def test_a_rate_spaces_the_letters_on_the_clock() -> None:
    """``rate=2``: letter n starts no earlier than n / 2 s after the replay began."""
    clock = Clock()
    starts: list[float] = []

    async def sleep(seconds: float) -> None:
        clock.now += seconds

    class Timed(FakeQueue):
        async def publish(self, letter: DeadLetter, topic: str) -> str:
            starts.append(clock.now)
            return await super().publish(letter, topic)

    fake = Timed([letter(ref) for ref in "abcd"])
    summary = await replay(
        as_queue(fake),
        Selection(),
        ReplayPlan(target=TARGET, in_flight=1, rate=2.0),
        clocks=Clocks(monotonic=clock, sleep=sleep),
    )
    assert summary.replayed == 4
    assert starts == [100.0, 100.5, 101.0, 101.5]
