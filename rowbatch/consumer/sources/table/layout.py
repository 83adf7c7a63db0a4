"""The input's layout as a sharded run planned it: its files, with how many units (Parquet row
groups) and rows each. Shards take units by their place in the whole list (``index mod N``),
so a file added, removed or rewritten with other row groups between two shards' starts moves
units from one shard to another: a shard that already finished never reads what moved to it,
and rows would be left out silently. The first shard of a run to start records the layout in
``<state>/run/layout-of-N.json``; every other start of that run compares its own with it and
refuses a difference, naming the files. A single shard has nothing to move: not checked.

A Parquet file that could not be opened when the layout was recorded (one unit of the whole
file, rows unknown: see the plan module) and is mended later would become K row-group units and
shift every later unit to another shard. So the recorded layout is kept: a Parquet file it holds
with rows unknown stays one whole unit for the rest of the run (:func:`shared_plan`), read at
its turn by the shard its one place gives it, row group after row group, with the keys its row
groups would have. The shards agree because they all read the record; indices never shift, and
the rerun of a sharded run after the file is mended reads it without starting over. (The other
way round, a file recorded with its row groups that can no longer be opened, is a change and
refused.) ``--new-run`` records the layout afresh, the mended file's row groups with it.

Not caught: shards planning at the very moment files land (each sees none recorded yet), and a
file rewritten in place with the same row groups (a resumed run takes its rows as settled)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from rowbatch.consumer.sources.table.checkpoint import RunMismatch
from rowbatch.consumer.sources.table.plan import TablePlan, Unit
from rowbatch.consumer.sources.table.state import StateFolder

RUN_FOLDER: Final = "run"
"""The folder beside the shards' (``<state>/run/``) for what a run's shards share."""

_SHOWN: Final = 5
"""Files named per kind of change in a refusal; the rest are counted."""


@dataclass(frozen=True)
class FileLayout:
    relative: str
    units: int
    rows: int | None
    """Known for Parquet row groups; None for a file read whole (one unit): a text file, or a
    Parquet file that could not be opened when planned."""


@dataclass(frozen=True)
class Layout:
    files: tuple[FileLayout, ...]

    @classmethod
    def of(cls, units: Sequence[Unit]) -> Layout:
        """The layout of the whole input's ``units`` (all shards')."""
        counts: dict[str, tuple[int, int | None]] = {}
        for unit in units:
            n, rows = counts.get(unit.file.relative, (0, 0))
            total = None if rows is None or unit.rows is None else rows + unit.rows
            counts[unit.file.relative] = (n + 1, total)
        return cls(tuple(FileLayout(f, n, rows) for f, (n, rows) in counts.items()))

    def to_json(self) -> str:
        files = [[f.relative, f.units, f.rows] for f in self.files]
        return json.dumps({"files": files}, indent=1)

    @classmethod
    def from_json(cls, text: str) -> Layout:
        files = json.loads(text)["files"]
        return cls(
            tuple(FileLayout(str(r), int(u), None if n is None else int(n)) for r, u, n in files)
        )

    def changes_from(self, then: Layout) -> list[str]:
        """What differs from ``then``, file by file, in words (empty when nothing does)."""
        before = {f.relative: f for f in then.files}
        now = {f.relative: f for f in self.files}
        added = [r for r in now if r not in before]
        removed = [r for r in before if r not in now]
        changed = [
            f"{r} ({_units(before[r])} then, {_units(now[r])} now)"
            for r in now
            if r in before and before[r] != now[r]
        ]
        out = []
        for kind, names in (("added", added), ("removed", removed), ("changed", changed)):
            if names:
                shown = ", ".join(names[:_SHOWN])
                more = f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
                out.append(f"{len(names)} file(s) {kind}: {shown}{more}")
        return out


def _units(f: FileLayout) -> str:
    rows = "" if f.rows is None else f", {f.rows:,} rows"
    return f"{f.units} unit(s){rows}"


def layout_name(shards: int) -> str:
    return f"layout-of-{shards}.json"


def _recorded(folder: StateFolder, name: str) -> Layout | None:
    text = folder.read(name)
    if text is None:
        return None
    try:
        return Layout.from_json(text)
    except (ValueError, KeyError, TypeError) as exc:
        raise RunMismatch(f"{folder.location}/{name} is not a layout: {exc}") from exc


def shared_plan(state: str, plan: TablePlan, shards: int, *, new_run: bool) -> TablePlan:
    """``plan`` as the run's shards share it: the Parquet files the recorded layout holds as
    whole units (not opened when it was recorded) whole again, so that no unit moves to
    another shard; then its layout checked (:func:`check_layout`). Blocking."""
    if shards > 1 and not new_run:
        then = _recorded(StateFolder(state, RUN_FOLDER), layout_name(shards))
        if then is not None:
            plan = plan.read_whole({f.relative for f in then.files if f.rows is None})
    check_layout(state, Layout.of(plan.units), shards, new_run=new_run)
    return plan


def check_layout(state: str, layout: Layout, shards: int, *, new_run: bool) -> None:
    """Records ``layout`` for a run of ``shards`` shards when none is (or ``new_run``), else
    raises :class:`RunMismatch` when it differs from the recorded one (blocking)."""
    if shards == 1:
        return
    folder = StateFolder(state, RUN_FOLDER)
    name = layout_name(shards)
    then = None if new_run else _recorded(folder, name)
    if then is None:
        folder.write(name, layout.to_json())
        return
    changes = layout.changes_from(then)
    if changes:
        raise RunMismatch(
            f"the input is not what this run's shards planned ({folder.location}/{name}): "
            + "; ".join(changes)
            + f". With {shards} shards a changed input moves row groups between shards, so "
            "a shard already done would never read some rows. Finish the run on the input "
            "it started with (put new files elsewhere), or start every shard over with "
            "--new-run"
        )


__all__ = ["RUN_FOLDER", "FileLayout", "Layout", "check_layout", "layout_name", "shared_plan"]
