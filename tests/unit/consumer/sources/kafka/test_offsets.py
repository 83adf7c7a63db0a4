"""OffsetTracker: for any interleaving of receipts and out-of-order completions, the offset it
would commit never passes a record that is not done, and once all are done it is last + 1."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.consumer.sources.kafka.offsets import OffsetTracker

Partitions = dict[int, list[int]]
"""partition -> its offsets, strictly increasing (gaps allowed: transaction markers)."""


@st.composite
def partitions(draw: st.DrawFn) -> Partitions:
    out: Partitions = {}
    for p in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, 1000))
        gaps = draw(st.lists(st.integers(1, 3), min_size=0, max_size=40))
        offsets = [start]
        for gap in gaps:
            offsets.append(offsets[-1] + gap)
        out[p] = offsets
    return out


def check(tracker: OffsetTracker[int], p: int, received: list[int], done: set[int]) -> int | None:
    """The tracker's answer for partition ``p`` is safe and as far as it can be."""
    got = tracker.committable(p)
    if not received:
        assert got is None
        return got
    assert got is not None
    undone = [o for o in received if o not in done]
    # Safe: no record below the commit point is left undone.
    assert all(got <= o for o in undone), (got, undone)
    # Live: exactly the first record not done, or one past the last received.
    assert got == (min(undone) if undone else received[-1] + 1)
    assert tracker.pending(p) == len(undone)
    return got


@settings(max_examples=400, deadline=None)
@given(parts=partitions(), data=st.data())
def test_any_interleaving_never_commits_past_an_unsettled_record(
    parts: Partitions, data: st.DataObject
) -> None:
    tracker: OffsetTracker[int] = OffsetTracker()
    received: dict[int, list[int]] = {p: [] for p in parts}
    done: dict[int, set[int]] = {p: set() for p in parts}
    last_commit: dict[int, int] = {}
    while True:
        # Enabled events: the next receipt of each partition (in offset order), and the
        # completion of any received record not yet done (in any order).
        events: list[tuple[str, int, int]] = [
            ("receive", p, offs[len(received[p])])
            for p, offs in parts.items()
            if len(received[p]) < len(offs)
        ]
        events += [("settle", p, o) for p in parts for o in received[p] if o not in done[p]]
        if not events:
            break
        kind, p, offset = data.draw(st.sampled_from(events))
        if kind == "receive":
            tracker.received(p, offset)
            received[p].append(offset)
        else:
            assert tracker.settled(p, offset)
            assert not tracker.settled(p, offset), "a second settle must change nothing"
            done[p].add(offset)
        for q in parts:
            got = check(tracker, q, received[q], done[q])
            if got is not None:
                assert got >= last_commit.get(q, got), "the commit point went backwards"
                last_commit[q] = got
    for p, offs in parts.items():
        assert tracker.committable(p) == offs[-1] + 1
        assert tracker.pending(p) == 0


@settings(max_examples=200, deadline=None)
@given(parts=partitions(), data=st.data())
def test_forgotten_partitions_ignore_late_settles_and_start_afresh(
    parts: Partitions, data: st.DataObject
) -> None:
    """A revoke (forget) in the middle: settles of records from before it change nothing;
    records received after it (the partition came back, re-read from the committed offset)
    are tracked on their own."""
    tracker: OffsetTracker[int] = OffsetTracker()
    p, offsets = next(iter(parts.items()))
    cut = data.draw(st.integers(0, len(offsets)))
    before = offsets[:cut]
    for o in before:
        tracker.received(p, o)
    settled_before = data.draw(st.lists(st.sampled_from(before), unique=True)) if before else []
    for o in settled_before:
        assert tracker.settled(p, o)
    committed = tracker.committable(p)
    tracker.forget(p)
    assert tracker.committable(p) is None
    for o in before:
        assert not tracker.settled(p, o)
    # Re-read from the committed offset (or from the start when nothing was committable).
    again = [o for o in offsets if committed is None or o >= committed]
    for o in again:
        tracker.received(p, o)
    stale = [o for o in before if o not in settled_before]
    late = data.draw(st.permutations(again))
    for o in late:
        check(tracker, p, again, set(late[: late.index(o)]))
        assert tracker.settled(p, o)
    for o in stale:  # the old generation's in-flight work finishing late: ignored
        assert not tracker.settled(p, o)
    if again:
        assert tracker.committable(p) == again[-1] + 1


def test_gaps_are_skipped_and_order_is_enforced() -> None:
    tracker: OffsetTracker[str] = OffsetTracker()
    assert tracker.committable("t/0") is None
    for o in (5, 6, 9, 10):
        tracker.received("t/0", o)
    assert tracker.committable("t/0") == 5
    tracker.settled("t/0", 6)
    tracker.settled("t/0", 9)
    assert tracker.committable("t/0") == 5
    tracker.settled("t/0", 5)
    assert tracker.committable("t/0") == 10  # 7 and 8 never existed (markers)
    tracker.settled("t/0", 10)
    assert tracker.committable("t/0") == 11
    assert not tracker.settled("t/0", 42)
    with pytest.raises(ValueError, match="must increase"):
        tracker.received("t/0", 10)
    with pytest.raises(ValueError, match=">= 0"):
        tracker.received("t/1", -1)
    assert set(tracker.partitions()) == {"t/0"}
    assert "t/0" in tracker
    assert tracker.last_received("t/0") == 10
    tracker.forget("t/0")
    assert "t/0" not in tracker
    assert tracker.last_received("t/0") is None
    tracker.received("t/0", 3)  # starts afresh after a forget
    assert tracker.committable("t/0") == 3
