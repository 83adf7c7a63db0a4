"""Figures in the README and docs come from recorded runs only (``python -m bench --record``,
files under ``bench/results/``). A cited block in a Markdown file names its file and is
rendered from it:

    <!-- bench:headline bench/results/NAME.json -->
    ...a table of the headline figures: median (least-greatest) over the recorded runs...
    <!-- /bench -->

    <!-- bench:targets bench/results/NAME.json -->
    ...each target, what every run got, and in how many runs it was met...
    <!-- /bench -->

    <!-- bench:tables bench/results/NAME.txt -->
    ...the tables as that run printed them...
    <!-- /bench -->

    <!-- bench:from bench/results/NAME.txt [#SECTION] [rows: TEXT | TEXT] -->
    ...prose or a hand-made table: left as written, but every figure in it must be at its
    place in the file: a range one of the run's ranges, a single one of its single figures
    (as written there, or rounded to the digits the prose shows; see bench/figure_match.py)...
    <!-- /bench -->

Every page (README.md and docs/**/*.md) is read, and a measured figure outside the blocks (a
rate, a ratio, a time or CPU per message, a memory peak, a share: bench/figure_scan.py) must
carry the word "unrecorded" or a ``<!-- not measured: WHY -->`` marker.

``python -m bench.cite`` rewrites every block from its file; ``python -m bench.cite --check``
(and ``tests/unit/bench/test_cite.py``) fails naming each block whose text differs from
what its file gives, or whose file is missing: a figure edited by hand, or a file removed,
is caught.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import figure_match, figure_scan
from bench.help_text import description
from bench.report import Target, targets_table
from bench.spread import Spread, spread

REPO = Path(__file__).resolve().parent.parent


def citing(root: Path | None = None) -> tuple[str, ...]:
    """The Markdown files checked: README.md and every page under docs/."""
    root = root or REPO
    pages = sorted(p.relative_to(root).as_posix() for p in (root / "docs").rglob("*.md"))
    return ("README.md", *pages)


_BLOCK = re.compile(
    r"(?P<open><!-- bench:(?P<kind>[a-z]+) (?P<file>\S+)(?: (?P<section>[^\n]*?))? -->\n)"
    r"(?P<body>.*?)(?P<close><!-- /bench -->)",
    re.DOTALL,
)

BROKER_COLUMNS = (("pubsub", "Pub/Sub"), ("kafka", "Kafka"))


def _pct(v: float) -> str:
    return f"{v:.0%}"


def _x(v: float) -> str:
    return f"{v:.1f}x"


def _num(v: float) -> str:
    return f"{v:,.0f}"


def _us(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


@dataclass(frozen=True)
class Headline:
    label: str
    figure: str
    """The figure's name with ``{broker}`` for the column."""
    fmt: Callable[[float], str]


SAT = "saturation {broker} fixed_latency"
BAT = "saturation {broker} fixed_latency_batched"
HEADLINES: tuple[Headline, ...] = (
    Headline(
        "500-row messages: share of the measured ceiling (`fixed_latency`, 1 instance)",
        f"{SAT} 500-row postgres backlog: of measured ceiling",
        _pct,
    ),
    Headline("500-row messages: server busy", f"{SAT} 500-row postgres backlog: server busy", _pct),
    Headline(
        "16-row messages: share of the measured ceiling",
        f"{SAT} 16-row postgres backlog: of measured ceiling",
        _pct,
    ),
    Headline(
        "1-row messages: share of the measured ceiling",
        f"{SAT} 1-row postgres backlog: of measured ceiling",
        _pct,
    ),
    Headline(
        "consumer CPU per row, 500-row messages (us)",
        f"{SAT} 500-row postgres backlog: consumer CPU us/row",
        _us,
    ),
    Headline(
        "consumer CPU per row = per message, 1-row messages (us)",
        f"{SAT} 1-row postgres backlog: consumer CPU us/row",
        _us,
    ),
    Headline(
        "steady 80 % load, 100-row messages: p99 publish-to-written (ms)",
        f"{SAT} 100-row postgres 80% load: p99 ms",
        _num,
    ),
    Headline(
        "  its bound, max_wait + 3 x server batch (ms)",
        f"{SAT} 100-row postgres 80% load: p99 bound ms",
        _num,
    ),
    Headline(
        "steady 80 % load, 10-row messages: p99 publish-to-written (ms)",
        f"{SAT} 10-row postgres 80% load: p99 ms",
        _num,
    ),
    Headline(
        "x reference consumer, 500-row messages, 1-instance model",
        f"{SAT} 500-row postgres backlog: x reference",
        _x,
    ),
    Headline(
        "x reference consumer, 1-row messages, 1-instance model (set by the model)",
        f"{SAT} 1-row postgres backlog: x reference",
        _x,
    ),
    Headline(
        "x reference consumer, 500-row messages, `fixed_latency_batched` (2 instances, "
        "dynamic batching)",
        f"{BAT} 500-row postgres backlog: x reference",
        _x,
    ),
    Headline(
        "x reference consumer, 1-row messages, `fixed_latency_batched`",
        f"{BAT} 1-row postgres backlog: x reference",
        _x,
    ),
    Headline(
        "  rowbatch rows/s there (1-row messages)", f"{BAT} 1-row postgres backlog: rows/s", _num
    ),
    Headline(
        "  reference rows/s there (1-row messages)",
        f"{BAT} 1-row postgres backlog: reference rows/s",
        _num,
    ),
    Headline(
        "x naive consumer, same backlog of 1-row messages (`embedder`)",
        "naive {broker} 1-row: speed-up",
        _x,
    ),
    Headline(
        "x naive consumer, same backlog of 16-row messages", "naive {broker} 16-row: speed-up", _x
    ),
    Headline(
        "peak RSS of the consumer, 500-row backlog, 256 MiB budget (MiB)",
        f"{SAT} 500-row postgres backlog: peak RSS MiB",
        _num,
    ),
)


def _cell(found: Spread | None, fmt: Callable[[float], str]) -> str:
    if found is None:
        return "-"
    if len(found.values) == 1 or fmt(found.low) == fmt(found.high):
        return fmt(found.median)
    return f"{fmt(found.median)} ({fmt(found.low)}-{fmt(found.high)})"


def load_spread(recorded: Mapping[str, Any]) -> dict[str, Spread]:
    """The spread a recorded JSON keeps, or one run's figures as spreads of one value."""
    if "spread" in recorded:
        return {
            name: Spread(**{**v, "values": tuple(v["values"])})
            for name, v in recorded["spread"].items()
        }
    return spread([recorded["sections"]])


def headline(recorded: Mapping[str, Any], name: str) -> str:
    """The Markdown table of :data:`HEADLINES` from a recorded run's JSON."""
    found = load_spread(recorded)
    repeats = recorded.get("repeats", [recorded["sections"]])
    runs = len(repeats)
    per_section = {name: sum(1 for r in repeats if name in r) for r in repeats for name in r}
    counted = ", ".join(f"{name} {n}" for name, n in per_section.items())
    machine = recorded.get("machine") or {}
    lines = [
        "| figure | " + " | ".join(title for _, title in BROKER_COLUMNS) + " |",
        "|---|" + "---|" * len(BROKER_COLUMNS),
    ]
    for h in HEADLINES:
        cells = [_cell(found.get(h.figure.format(broker=b)), h.fmt) for b, _ in BROKER_COLUMNS]
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {h.label} | " + " | ".join(cells) + " |")
    run = recorded["run"]
    lines.append("")
    lines.append(
        f"Median (least-greatest) over {runs} run{'s' if runs > 1 else ''} in one stack "
        f"(runs that completed each section: {counted}): "
        f"`{run['command']}`, {run['started_at']}; "
        f"{machine.get('cores', run.get('cpu_count'))} cores, {machine.get('cpu_model', '?')}, "
        f"calibration {machine.get('calibration_us', 0):,.0f} us "
        f"(`bench/machine.py`: lower is faster); file `{name}`."
    )
    return "\n".join(lines) + "\n"


def targets(recorded: Mapping[str, Any]) -> str:
    """The targets of a recorded run as a Markdown table: what each run got, and in how many
    runs each was met (missed ones too)."""
    by_run = recorded.get("targets_by_run") or [recorded.get("targets", [])]
    table = targets_table(
        [[Target(t["name"], t["want"], t["got"], t["met"]) for t in run] for run in by_run]
    )
    lines = [
        "| " + " | ".join(table.columns) + " |",
        "|---|" + "---|" * (len(table.columns) - 1),
    ]
    lines += [
        "| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in table.rows
    ]
    return "\n".join(lines) + "\n"


def tables(text: str) -> str:
    return "```\n" + text.rstrip("\n") + "\n```\n"


RENDER: dict[str, Callable[[Path, str], str]] = {
    "headline": lambda path, cited: headline(json.loads(path.read_text()), cited),
    "tables": lambda path, _: tables(path.read_text()),
    "targets": lambda path, _: targets(json.loads(path.read_text())),
}


_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_NOT_FIGURES = re.compile(
    r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}(?::\d{2})?|bench/results/\S+|[A-Za-z_]+\d[\w.]*"
)
"""Dates, times, file names and words with digits (``p99``, ``3.11``-style versions are numbers
and are checked): not figures."""


def _numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in _NUMBER.findall(_NOT_FIGURES.sub(" ", text))]


def _in(number: str, found: set[str], values: list[float]) -> bool:
    if number in found:
        return True
    digits = len(number.partition(".")[2])
    want = float(number)
    return any(round(v, digits) == want for v in values)


def absent_figures(
    body: str, source: str, name: str = "run.txt", where: str | None = None
) -> list[str]:
    """The figures of ``body`` that are not at their place in ``source`` (see
    :mod:`bench.figure_match`), or why the section cannot be found. ``where`` is what follows
    the file name in the block's opening: ``#SECTION`` and/or ``rows: TEXT | TEXT``."""
    section, filters = figure_match.parse_where(where or "")
    try:
        return figure_match.absent(body, figure_match.of_file(name, source, section, filters))
    except KeyError as e:
        return [str(e.args[0])]


@dataclass(frozen=True)
class Stale:
    doc: str
    cited: str
    why: str


def _render(kind: str, cited: str, root: Path) -> str | None:
    path = root / cited
    if kind not in RENDER or not path.is_file():
        return None
    return RENDER[kind](path, cited)


def refresh(text: str, root: Path, doc: str) -> tuple[str, list[Stale]]:
    """``text`` with every block rendered from its file, and the blocks that differed or
    could not be rendered."""
    stale: list[Stale] = []

    def one(match: re.Match[str]) -> str:
        kind, cited = match["kind"], match["file"]
        if kind == "from":
            path = root / cited
            if not path.is_file():
                stale.append(Stale(doc, cited, "file missing"))
            elif absent := absent_figures(match["body"], path.read_text(), cited, match["section"]):
                stale.append(
                    Stale(
                        doc, cited, f"figures not at their place in the file: {', '.join(absent)}"
                    )
                )
            return match[0]
        body = _render(kind, cited, root)
        if body is None:
            why = f"unknown kind {kind!r}" if kind not in RENDER else "file missing"
            stale.append(Stale(doc, cited, why))
            return match[0]
        if body != match["body"]:
            stale.append(Stale(doc, cited, "differs from what the file gives"))
        return match["open"] + body + match["close"]

    return _BLOCK.sub(one, text), stale


def cited_files(root: Path = REPO, docs: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(doc, file) for every cited block."""
    return [
        (doc, m["file"])
        for doc in (citing(root) if docs is None else docs)
        if (root / doc).is_file()
        for m in _BLOCK.finditer((root / doc).read_text())
    ]


def check(root: Path = REPO, docs: Sequence[str] | None = None) -> list[Stale]:
    """Every block that is not what its file gives, and every measured figure outside the
    blocks with no marker (:mod:`bench.figure_scan`)."""
    found: list[Stale] = []
    for doc in citing(root) if docs is None else docs:
        path = root / doc
        if path.is_file():
            text = path.read_text()
            found += refresh(text, root, doc)[1]
            found += [Stale(doc, "-", str(u)) for u in figure_scan.unmarked(text, doc)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cite", description=description(__doc__))
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale: list[Stale] = []
    for doc in citing():
        path = REPO / doc
        text, found = refresh(path.read_text(), REPO, doc)
        stale += found + [Stale(doc, "-", str(u)) for u in figure_scan.unmarked(text, doc)]
        if not args.check and text != path.read_text():
            path.write_text(text)
            print(f"rewrote the cited blocks of {doc}")
    for s in stale:
        print(
            f"{s.doc}: block citing {s.cited}: {s.why}" if s.cited != "-" else s.why,
            file=sys.stderr,
        )
    missing = [s for s in stale if s.why != "differs from what the file gives"]  # not rewritable
    return 1 if (stale if args.check else missing) else 0


if __name__ == "__main__":
    raise SystemExit(main())
