"""Tables for the terminal and the JSON file: every section's result is a frozen dataclass that
can render itself as a :class:`Table`; the JSON holds the run header and each result as is."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol


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
    still leaves what it measured)."""

    info: RunInfo
    out: Path
    sections: dict[str, Any] = field(default_factory=dict)
    elapsed_s: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)

    def add(self, name: str, result: Section, elapsed_s: float) -> None:
        self.sections[name] = result
        self.elapsed_s[name] = round(elapsed_s, 1)
        print(result.table().render())
        print(f"  ({name}: {elapsed_s:.0f} s)", flush=True)
        self.write()

    def fail(self, name: str, error: str, elapsed_s: float) -> None:
        self.errors[name] = error
        self.elapsed_s[name] = round(elapsed_s, 1)
        print(f"\n{name}: FAILED after {elapsed_s:.0f} s: {error}", flush=True)
        self.write()

    def targets_table(self) -> Table:
        return Table(
            "Targets",
            ("target", "want", "this run", "met"),
            tuple((t.name, t.want, t.got, "yes" if t.met else "NO") for t in self.targets),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "run": dataclasses.asdict(self.info),
            "elapsed_s": self.elapsed_s,
            "sections": {k: dataclasses.asdict(v) for k, v in self.sections.items()},
            "errors": self.errors,
            "targets": [dataclasses.asdict(t) for t in self.targets],
        }

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")


def rate(value: float) -> str:
    return f"{value:,.0f}"


def ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}x"
