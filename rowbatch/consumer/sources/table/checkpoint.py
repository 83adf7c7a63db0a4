"""A table run's progress: which row ranges of which files are settled (written, or
dead-lettered), kept in the shard's state folder as segments written as the engine settles
chunks, so a rerun after a kill skips them without calling the model; and the run's identity
(input, chunking, model and binding), so a rerun with another model refuses instead of
mixing results.

Files: ``run.json`` (the identity) and ``done-*`` segments, one line per settled range,
``<file key> <first row> <rows> <w|d>`` (tab-separated; ``w`` settled, ``d`` dead-lettered).
Opening a run, and every ``COMPACT_EVERY`` segments while it runs, the segments are merged into
one (adjacent ranges joined), so the folder holds a few files however long the run, and a
rerun reads them quickly from an object store."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from rowbatch.consumer.sources.table.state import StateFolder

RUN_FILE: Final = "run.json"
DONE_PREFIX: Final = "done"
COMPACT_EVERY: Final = 256
"""Segments written since the last merge that trigger the next."""

Outcome = Literal["w", "d"]


class RunMismatch(ValueError):
    """The state folder belongs to a run with another identity."""


@dataclass(frozen=True)
class RunIdentity:
    """What must not change while a run is resumed: the keys and the results depend on it."""

    input: str
    format: str
    schema: str
    chunk_rows: int
    shards: int
    shard: int
    model: str
    model_version: str
    binding: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "binding": dict(self.binding)}

    def differences(self, other: Mapping[str, Any]) -> list[str]:
        mine = json.loads(json.dumps(self.to_json()))
        return [
            f"{key}: {other.get(key)!r} then, {value!r} now"
            for key, value in mine.items()
            if other.get(key) != value
        ]


@dataclass(frozen=True)
class Settled:
    """Rows ``[first_row, first_row + rows)`` of the file with key ``file`` are settled."""

    file: str
    first_row: int
    rows: int
    outcome: Outcome

    def line(self) -> str:
        return f"{self.file}\t{self.first_row}\t{self.rows}\t{self.outcome}"

    @classmethod
    def parse(cls, line: str) -> Settled:
        file, first, rows, outcome = line.split("\t")
        if outcome not in ("w", "d"):
            raise ValueError(f"bad outcome {outcome!r}")
        return cls(file, int(first), int(rows), outcome)  # type: ignore[arg-type]


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping ``(start, stop)`` ranges covering the same rows."""
    out: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], stop))
        else:
            out.append((start, stop))
    return out


class Checkpoint:
    """The settled ranges of one shard's run (blocking methods: call them off the loop)."""

    def __init__(
        self,
        folder: StateFolder,
        settled: Iterable[Settled] = (),
        segments: Iterable[str] = (),
        compact_every: int = COMPACT_EVERY,
    ) -> None:
        self._folder = folder
        self._done: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self._dead: list[Settled] = []
        self.dead_lettered_rows = 0
        self._lock = threading.Lock()
        self._compacting = threading.Lock()
        self._segments = list(segments)
        """The segments that hold this run's progress."""
        self._compact_every = compact_every
        for s in settled:
            self._add(s)

    def _add(self, s: Settled) -> None:
        self._done[s.file].append((s.first_row, s.first_row + s.rows))
        if s.outcome == "d":
            self._dead.append(s)
            self.dead_lettered_rows += s.rows

    @classmethod
    def open(cls, folder: StateFolder, identity: RunIdentity, *, new_run: bool) -> Checkpoint:
        """The run in ``folder``: resumed when its identity matches, started when there is
        none (or ``new_run``: the old progress is deleted); :class:`RunMismatch` otherwise."""
        text = folder.read(RUN_FILE)
        segments = folder.names(DONE_PREFIX)
        if text is not None and not new_run:
            try:
                then = json.loads(text)
            except json.JSONDecodeError as exc:
                raise RunMismatch(f"{folder.location}/{RUN_FILE} is not JSON: {exc}") from exc
            differences = identity.differences(then)
            if differences:
                raise RunMismatch(
                    f"the progress in {folder.location} is of another run ("
                    + "; ".join(differences)
                    + "): its rows' results would mix. Resume with the same settings, point "
                    "[source] state elsewhere, or start over with --new-run"
                )
        if text is None or new_run:  # the old run's progress and dead letters go
            folder.delete(name for name in folder.names("") if name != RUN_FILE)
            folder.write(RUN_FILE, json.dumps(identity.to_json(), indent=2, sort_keys=True))
            return cls(folder)
        settled: list[Settled] = []
        for name in segments:
            lines = folder.read_segment(name)
            for line in lines or ():
                settled.append(Settled.parse(line))
        checkpoint = cls(folder, settled, segments)
        if len(segments) > 1:
            checkpoint.compact()
        return checkpoint

    def record(self, settled: Iterable[Settled]) -> None:
        """Durably records ``settled`` (one new segment; every ``compact_every``, a merge)."""
        items = list(settled)
        if not items:
            return
        name = self._folder.write_segment(DONE_PREFIX, (s.line() for s in items))
        with self._lock:
            for s in items:
                self._add(s)
            self._segments.append(name)
            due = len(self._segments) > self._compact_every
        if due:
            self.compact()

    def compact(self) -> None:
        """One segment with every settled range (merged), then the segments it replaces go.
        A kill between the two leaves both: they hold the same ranges."""
        if not self._compacting.acquire(blocking=False):
            return  # another writer's thread is at it
        try:
            with self._lock:
                replaced = list(self._segments)
                lines = [
                    Settled(file, start, stop - start, "w").line()
                    for file, ranges in self._done.items()
                    for start, stop in _merge(ranges)
                ]
                lines += [s.line() for s in self._dead]
            merged = self._folder.write_segment(DONE_PREFIX, lines)
            self._folder.delete(replaced)
            with self._lock:
                self._segments = [merged, *self._segments[len(replaced) :]]
        finally:
            self._compacting.release()

    @property
    def segments(self) -> int:
        """How many segments hold the progress now."""
        with self._lock:
            return len(self._segments)

    def missing(self, file: str, first_row: int, rows: int) -> list[tuple[int, int]]:
        """The ranges ``(first, rows)`` of ``[first_row, first_row + rows)`` not yet
        settled, in order."""
        if rows <= 0:
            return []
        stop = first_row + rows
        with self._lock:
            done = self._done.get(file)
            if not done:
                return [(first_row, rows)]
            merged = _merge(done)
            self._done[file] = merged
        out: list[tuple[int, int]] = []
        at = first_row
        for start, end in merged:
            if end <= at or start >= stop:
                continue
            if start > at:
                out.append((at, start - at))
            at = max(at, end)
        if at < stop:
            out.append((at, stop - at))
        return out

    def settled_rows(self) -> int:
        with self._lock:
            return sum(
                end - start for ranges in self._done.values() for start, end in _merge(ranges)
            )


__all__ = ["Checkpoint", "Outcome", "RunIdentity", "RunMismatch", "Settled"]
