"""Tables for the terminal and the JSON file: every section's result is a frozen dataclass that
can render itself as a :class:`Table`; the JSON holds the run header and each result as is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench.machine import Machine
from bench.spread import spread


@dataclass(frozen=True)
class Table:
    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()

    def render(self) -> str:
        widths = [len(c) for c in self.columns]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            parts = [
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(cells, widths, strict=True))
            ]
            return "  " + "  ".join(parts).rstrip()

        out = [f"\n{self.title}", line(self.columns), "  " + "  ".join("-" * w for w in widths)]
        out += [line(row) for row in self.rows]
        out += [f"  {note}" for note in self.notes]
        return "\n".join(out)


class Section(Protocol):
    """What every section's result offers."""

    def table(self) -> Table: ...


@dataclass(frozen=True)
class Target:
    """One of the benchmark targets (``bench/targets.py``), checked against this run's figures."""

    name: str
    want: str
    got: str
    met: bool


@dataclass(frozen=True)
class RunInfo:
    command: str
    started_at: str
    versions: Mapping[str, str]
    cpu_count: int
    quick: bool
    run_dir: str

    def header(self) -> str:
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return (
            f"rowbatch benchmarks, {self.started_at}\n"
            f"  command   {self.command}\n"
            f"  versions  {versions}\n"
            f"  machine   {self.cpu_count} CPU cores (services, consumer and load generator "
            f"share them){'; --quick sizes' if self.quick else ''}\n"
            f"  run dir   {self.run_dir}"
        )


@dataclass
class Report:
    """Collects results as sections finish; written to JSON after each one (a run cut short
    still leaves what it measured). With ``--repeat N`` the selected sections run N times in
    one stack: ``runs`` holds each repetition's results, the JSON their spread."""

    info: RunInfo
    out: Path
    machine: Machine | None = None
    runs: list[dict[str, Any]] = field(default_factory=lambda: [{}])
    tables: list[dict[str, str]] = field(default_factory=lambda: [{}])
    elapsed_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    targets_by_run: list[list[Target]] = field(default_factory=lambda: [[]])

    @property
    def sections(self) -> dict[str, Any]:
        """The current repetition's results."""
        return self.runs[-1]

    @property
    def targets(self) -> list[Target]:
        return self.targets_by_run[-1]

    @targets.setter
    def targets(self, found: list[Target]) -> None:
        self.targets_by_run[-1] = found

    def next_run(self) -> None:
        self.runs.append({})
        self.tables.append({})
        self.targets_by_run.append([])

    def _key(self, name: str) -> str:
        return name if len(self.runs) == 1 else f"{name}#{len(self.runs)}"

    def add(self, name: str, result: Section, elapsed_s: float) -> None:
        self.sections[name] = result
        self.elapsed_s[self._key(name)] = round(elapsed_s, 1)
        rendered = result.table().render()
        self.tables[-1][name] = rendered
        print(rendered)
        print(f"  ({name}: {elapsed_s:.0f} s)", flush=True)
        self.write()

    def fail(self, name: str, error: str, elapsed_s: float) -> None:
        self.errors[self._key(name)] = error
        self.elapsed_s[self._key(name)] = round(elapsed_s, 1)
        print(f"\n{name}: FAILED after {elapsed_s:.0f} s: {error}", flush=True)
        self.write()

    def targets_table(self) -> Table:
        return targets_table(self.targets_by_run)

    def to_json(self) -> dict[str, Any]:
        runs = [{k: dataclasses.asdict(v) for k, v in run.items()} for run in self.runs]
        found: dict[str, Any] = {
            "run": dataclasses.asdict(self.info),
            "machine": None if self.machine is None else dataclasses.asdict(self.machine),
            "elapsed_s": self.elapsed_s,
            "sections": runs[0],
            "errors": self.errors,
            "targets": [dataclasses.asdict(t) for t in self.targets_by_run[0]],
            "tables": self.tables[0],
        }
        if len(runs) > 1:
            found["repeats"] = runs
            found["tables_by_run"] = self.tables
            found["targets_by_run"] = [
                [dataclasses.asdict(t) for t in targets] for targets in self.targets_by_run
            ]
            found["spread"] = {
                name: dataclasses.asdict(value) for name, value in sorted(spread(runs).items())
            }
        return found

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


def targets_table(targets_by_run: Sequence[Sequence[Target]]) -> Table:
    """One row per target: what each run got, and in how many runs it was met."""
    names: dict[str, str] = {}
    got: dict[str, list[str]] = {}
    met: dict[str, int] = {}
    for targets in targets_by_run:
        for t in targets:
            names.setdefault(t.name, t.want)
            got.setdefault(t.name, []).append(t.got)
            met[t.name] = met.get(t.name, 0) + (1 if t.met else 0)
    runs = len(targets_by_run)
    rows = tuple(
        (
            name,
            want,
            " | ".join(got[name]),
            ("yes" if met[name] == len(got[name]) else "NO")
            if runs == 1
            else f"{met[name]} of {len(got[name])}",
        )
        for name, want in names.items()
    )
    return Table(
        "Targets",
        ("target", "want", "this run" if runs == 1 else f"each of {runs} runs", "met"),
        rows,
    )


def rate(value: float) -> str:
    return f"{value:,.0f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def times(value: float | None, *, exact: bool = False) -> str:
    """A ratio: ``4.6x``. ``exact``: beside a target, with the digits that decide it:
    ``1.46x`` (not ``1.5x``, which would read as met against ">= 1.5x"), ``46.1x`` from 10x
    up."""
    if value is None:
        return "-"
    return f"{value:.2f}x" if exact and value < 10 else f"{value:.1f}x"
