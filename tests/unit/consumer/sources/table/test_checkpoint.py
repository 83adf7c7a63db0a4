"""A shard's state folder and its progress: segments written whole and ignored when cut short;
``run.json`` holding the run's identity, a rerun with the same identity resuming the recorded
ranges, another identity refused (naming what changed) unless it starts over; the segments
merged on open; the ranges not yet settled."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowbatch.consumer.sources.table.checkpoint import (
    DONE_PREFIX,
    RUN_FILE,
    Checkpoint,
    RunIdentity,
    RunMismatch,
    Settled,
)
from rowbatch.consumer.sources.table.state import StateFolder

IDENTITY = RunIdentity(
    input="/data/events",
    format="auto",
    schema="",
    chunk_rows=100,
    shards=2,
    shard=1,
    model="scorer",
    model_version="3",
    binding={"inputs": {"features": "INPUT"}, "passthrough": {"id": "int64"}},
)


def folder_in(tmp_path: Path) -> StateFolder:
    return StateFolder(str(tmp_path / "state"), "shard-1-of-2")


# --- StateFolder --------------------------------------------------------------------------------


def test_the_folder_is_created_under_the_location(tmp_path: Path) -> None:
    folder = StateFolder(str(tmp_path / "state") + "/", "shard-0-of-1")
    assert (tmp_path / "state" / "shard-0-of-1").is_dir()
    assert folder.location == str(tmp_path / "state" / "shard-0-of-1")
    assert folder.names("") == []
    assert folder.read("absent") is None


def test_a_segment_reads_back_its_lines(tmp_path: Path) -> None:
    folder = folder_in(tmp_path)
    first = folder.write_segment("done", ["a\t1", "b\t2"])
    second = folder.write_segment("done", [])
    folder.write("other", "x")
    assert first.startswith("done-")
    assert folder.names("done") == [first, second]  # name order is write order
    assert folder.read_segment(first) == ["a\t1", "b\t2"]
    assert folder.read_segment(second) == []
    assert (Path(folder.path) / first).read_text() == "a\t1\nb\t2\nend\n"
    folder.delete([first])
    assert folder.names("done") == [second]
    assert folder.read_segment(first) is None


@pytest.mark.parametrize("text", ["a\nb\n", "a\nend", "", "a\nend\nb\n", "end\n\n"])
def test_a_segment_without_its_end_line_is_ignored(tmp_path: Path, text: str) -> None:
    folder = folder_in(tmp_path)
    folder.write("done-cut", text)
    assert folder.read_segment("done-cut") is None


# --- Checkpoint.open ----------------------------------------------------------------------------


def test_a_new_run_writes_its_identity(tmp_path: Path) -> None:
    folder = folder_in(tmp_path)
    checkpoint = Checkpoint.open(folder, IDENTITY, new_run=False)
    assert checkpoint.missing("f", 0, 10) == [(0, 10)]
    assert checkpoint.settled_rows() == 0
    text = folder.read(RUN_FILE)
    assert text is not None
    assert json.loads(text) == IDENTITY.to_json()
    assert json.loads(text)["binding"] == {
        "inputs": {"features": "INPUT"},
        "passthrough": {"id": "int64"},
    }


def test_a_rerun_with_the_same_identity_resumes_the_recorded_ranges(tmp_path: Path) -> None:
    checkpoint = Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    checkpoint.record([Settled("f", 0, 10, "w"), Settled("f", 30, 5, "d")])
    checkpoint.record([Settled("g", 0, 4, "w")])
    checkpoint.record([])  # nothing: no segment
    assert len(folder_in(tmp_path).names(DONE_PREFIX)) == 2

    again = Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    assert again.missing("f", 0, 50) == [(10, 20), (35, 15)]
    assert again.missing("g", 0, 4) == []
    assert again.missing("h", 7, 3) == [(7, 3)]
    assert again.settled_rows() == 19
    assert again.dead_lettered_rows == 5


def test_several_segments_are_merged_into_one_on_open(tmp_path: Path) -> None:
    checkpoint = Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    for first in range(0, 40, 10):
        checkpoint.record([Settled("f", first, 10, "w")])
    folder = folder_in(tmp_path)
    folder.write(f"{DONE_PREFIX}-zz-cut-short", "f\t90\t10\tw\n")  # no end: ignored
    assert len(folder.names(DONE_PREFIX)) == 5

    Checkpoint.open(folder, IDENTITY, new_run=False)
    [merged] = folder.names(DONE_PREFIX)
    lines = folder.read_segment(merged)
    assert lines is not None
    assert lines == ["f\t0\t40\tw"]  # adjacent ranges joined

    again = Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    assert again.missing("f", 0, 100) == [(40, 60)]
    assert folder.names(DONE_PREFIX) == [merged]


@pytest.mark.parametrize(
    ("changed", "field"),
    [
        (replace(IDENTITY, model_version="4"), "model_version"),
        (replace(IDENTITY, chunk_rows=50), "chunk_rows"),
        (replace(IDENTITY, binding={"inputs": {"features": "OTHER"}}), "binding"),
        (replace(IDENTITY, input="/data/other"), "input"),
    ],
)
def test_another_identity_is_refused_naming_what_changed(
    tmp_path: Path, changed: RunIdentity, field: str
) -> None:
    Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False).record([Settled("f", 0, 1, "w")])
    with pytest.raises(RunMismatch) as caught:
        Checkpoint.open(folder_in(tmp_path), changed, new_run=False)
    message = str(caught.value)
    assert f"{field}: " in message
    assert "--new-run" in message
    others = {"model_version", "chunk_rows", "binding", "input"} - {field}
    assert not any(f"{other}: " in message for other in others)
    # refused: nothing was changed
    resumed = Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    assert resumed.missing("f", 0, 1) == []


def test_the_message_says_then_and_now(tmp_path: Path) -> None:
    Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    with pytest.raises(RunMismatch, match=r"model_version: '3' then, '4' now"):
        Checkpoint.open(folder_in(tmp_path), replace(IDENTITY, model_version="4"), new_run=False)


def test_a_new_run_forgets_the_progress(tmp_path: Path) -> None:
    Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False).record([Settled("f", 0, 10, "w")])
    changed = replace(IDENTITY, model_version="4")
    fresh = Checkpoint.open(folder_in(tmp_path), changed, new_run=True)
    assert fresh.missing("f", 0, 10) == [(0, 10)]
    folder = folder_in(tmp_path)
    assert folder.names(DONE_PREFIX) == []
    text = folder.read(RUN_FILE)
    assert text is not None
    assert json.loads(text)["model_version"] == "4"
    # and the new identity is the one a rerun must match
    assert Checkpoint.open(folder, changed, new_run=False).missing("f", 0, 10) == [(0, 10)]
    with pytest.raises(RunMismatch):
        Checkpoint.open(folder, IDENTITY, new_run=False)


def test_a_run_file_that_is_not_json_is_refused(tmp_path: Path) -> None:
    folder = folder_in(tmp_path)
    folder.write(RUN_FILE, "{not json")
    with pytest.raises(RunMismatch, match=r"run\.json is not JSON"):
        Checkpoint.open(folder, IDENTITY, new_run=False)


def test_settled_lines_round_trip_and_bad_outcomes_are_refused() -> None:
    s = Settled("day=1/a.parquet", 1024, 7, "d")
    assert s.line() == "day=1/a.parquet\t1024\t7\td"
    assert Settled.parse(s.line()) == s
    with pytest.raises(ValueError, match="bad outcome"):
        Settled.parse("f\t0\t1\tx")


# --- missing ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bare_folder(tmp_path_factory: pytest.TempPathFactory) -> StateFolder:
    return StateFolder(str(tmp_path_factory.mktemp("state")), "shard-0-of-1")


def test_missing_with_overlapping_and_adjacent_ranges(bare_folder: StateFolder) -> None:
    checkpoint = Checkpoint(
        bare_folder,
        [
            Settled("f", 10, 5, "w"),  # 10-15
            Settled("f", 15, 5, "w"),  # adjacent: 15-20
            Settled("f", 12, 2, "d"),  # inside
            Settled("f", 30, 10, "w"),  # 30-40
            Settled("f", 35, 10, "w"),  # overlapping: 35-45
            Settled("g", 0, 100, "w"),  # another file
        ],
    )
    assert checkpoint.missing("f", 0, 50) == [(0, 10), (20, 10), (45, 5)]
    assert checkpoint.missing("f", 12, 20) == [(20, 10)]
    assert checkpoint.missing("f", 10, 10) == []
    assert checkpoint.missing("f", 44, 1) == []
    assert checkpoint.missing("f", 45, 1) == [(45, 1)]
    assert checkpoint.missing("f", 5, 10) == [(5, 5)]
    assert checkpoint.settled_rows() == 10 + 15 + 100


N = 60
ranges = st.lists(
    st.tuples(st.integers(0, N - 1), st.integers(1, 20)).map(lambda t: (t[0], min(t[1], N - t[0]))),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(
    recorded=ranges,
    window=st.tuples(st.integers(0, N), st.integers(0, N)).filter(lambda w: w[0] != w[1]),
)
def test_missing_and_recorded_cover_the_window_exactly(
    bare_folder: StateFolder, recorded: list[tuple[int, int]], window: tuple[int, int]
) -> None:
    checkpoint = Checkpoint(bare_folder, [Settled("f", a, n, "w") for a, n in recorded])
    done = {a + i for a, n in recorded for i in range(n)}
    for first, rows in [(0, N), (min(window), max(window) - min(window))]:
        stop = first + rows
        missing = checkpoint.missing("f", first, rows)
        rows_missing = [a + i for a, n in missing for i in range(n)]
        assert len(rows_missing) == len(set(rows_missing)), "missing ranges overlap"
        assert set(rows_missing).isdisjoint(done)
        assert set(rows_missing) | (done & set(range(first, stop))) == set(range(first, stop))
        assert all(n > 0 for _, n in missing)
        assert [a for a, _ in missing] == sorted(a for a, _ in missing)
        for (a, n), (b, _) in itertools.pairwise(missing):
            assert a + n < b, "two missing ranges that touch should be one"
    assert checkpoint.settled_rows() == len(done)


def test_an_empty_window_has_nothing_missing(bare_folder: StateFolder) -> None:
    with_progress = Checkpoint(bare_folder, [Settled("f", 100, 1, "w")])
    assert with_progress.missing("f", 5, 0) == []
    assert Checkpoint(bare_folder).missing("f", 5, 0) == []


def test_a_long_run_keeps_a_few_segments_and_loses_nothing(tmp_path: Path) -> None:
    """Every ``compact_every`` segments the progress is merged into one: the folder stays
    small, and a reopened run sees every settled range and every dead-lettered row."""
    folder = folder_in(tmp_path)
    checkpoint = Checkpoint.open(folder, IDENTITY, new_run=False)
    checkpoint._compact_every = 3
    for first in range(0, 100, 10):
        head = Settled("f", first, 5, "d") if first == 50 else Settled("f", first, 5, "w")
        checkpoint.record([head, Settled("g", first, 10, "w")])
        assert checkpoint.segments <= 4
        assert len(folder.names(DONE_PREFIX)) == checkpoint.segments
    again = Checkpoint.open(folder_in(tmp_path), IDENTITY, new_run=False)
    assert again.missing("f", 0, 100) == [(s + 5, 5) for s in range(0, 100, 10)]
    assert again.missing("g", 0, 120) == [(100, 20)]
    assert again.dead_lettered_rows == 5
    assert len(folder.names(DONE_PREFIX)) == 1
