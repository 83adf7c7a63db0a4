"""``rowbatch-consumer compare --config FILE``: the report over a shadow rollout's comparison
table, read from the store the configuration's ``[sink]`` names (:mod:`.read_table`), reduced
(:mod:`.compare`) and printed (:mod:`.compare_report`).

The configuration is any object with the consumer configuration's ``sink`` and
``model.candidate`` (:class:`CompareConfig`): this module imports nothing of the service."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from rowbatch.consumer.model.candidate import CandidateSettings
from rowbatch.consumer.rollout.compare import (
    check_layout,
    compare_table,
)
from rowbatch.consumer.rollout.compare_report import report_json, report_lines
from rowbatch.consumer.rollout.compare_values import (
    NotComparable,
    Tolerance,
)
from rowbatch.consumer.rollout.read_table import SinkSettings, locate, read_comparison
from rowbatch.consumer.rollout.table_where import ReadFailed, TableMissing

EXIT_FAILED: Final = 1
"""The store failed the read."""
EXIT_CONFIG: Final = 2
"""Bad configuration or arguments, or no such table."""
DEFAULT_FLIPPED: Final = 20

DESCRIPTION = """\
Report how a shadow candidate's answers compare with the production model's, from the
comparison table a shadow rollout ([model.candidate] mode = "shadow") writes in the [sink]'s
store: agreement per output, the differences' quantiles and histogram, the rows that flipped
or fall outside the tolerance, the candidate's errors, and latency per version."""

EPILOG = """\
examples:
  rowbatch-consumer compare --config consumer.toml
  rowbatch-consumer compare --config consumer.toml --tolerance score=1e-4 \\
      --tolerance embedding=1e-3:1e-2 --flipped 50 --json report.json

the outputs compared are the table's columns X with an X__candidate beside them. Integers,
bools and text are compared exactly (a confusion table, the rows that flipped); floats and
vectors agree where |candidate - production| <= ATOL + RTOL * |production| (each element of
a vector; default ATOL 1e-6, RTOL 0). Rows the candidate failed on are counted apart. A
Parquet [sink]'s comparison table is the dataset beside the results' (the url's parent
folder / the table); a --table with a / names a dataset's path or URL.

exit codes: 0 the report was printed (also "no rows compared yet"); 1 the store failed while
being read; 2 bad configuration or arguments, or the table is not there
"""


class _Model(Protocol):
    @property
    def candidate(self) -> CandidateSettings | None: ...


class CompareConfig(Protocol):
    """What the command reads of the consumer configuration."""

    @property
    def sink(self) -> SinkSettings: ...

    @property
    def model(self) -> _Model: ...


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rowbatch-consumer compare",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="the consumer's TOML (its [sink], [model])"
    )
    parser.add_argument(
        "--table",
        metavar="NAME",
        help="the comparison table (default: [model.candidate] table, else the [sink] "
        "table's name with _candidate appended)",
    )
    parser.add_argument(
        "--tolerance",
        action="append",
        default=[],
        metavar="COLUMN=ATOL[:RTOL]",
        help="a float or vector output's tolerance; repeatable",
    )
    parser.add_argument(
        "--flipped",
        type=int,
        default=DEFAULT_FLIPPED,
        metavar="N",
        help="rows listed per output that flipped or fall outside the tolerance "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--json", metavar="PATH", help="also write the figures as JSON to PATH (-: stdout only)"
    )
    return parser


def parse_tolerances(items: list[str]) -> dict[str, Tolerance]:
    """``COLUMN=ATOL[:RTOL]`` options by column (``ValueError`` naming a bad one)."""
    found: dict[str, Tolerance] = {}
    for item in items:
        column, _, values = item.partition("=")
        atol, _, rtol = values.partition(":")
        try:
            tolerance = Tolerance(float(atol), float(rtol) if rtol else 0.0)
        except ValueError:
            tolerance = None
        if not column or tolerance is None or not tolerance.atol >= 0 or not tolerance.rtol >= 0:
            raise ValueError(
                f"--tolerance {item!r}: give COLUMN=ATOL or COLUMN=ATOL:RTOL, two numbers >= 0 "
                "(e.g. --tolerance score=1e-4:1e-3)"
            )
        found[column] = tolerance
    return found


def comparison_table(config: CompareConfig) -> str:
    """The table the configuration's shadow writes."""
    candidate = config.model.candidate
    result_table = config.sink.table
    if candidate is not None:
        return candidate.comparison_table(result_table)
    return f"{result_table}_candidate"


def run_compare(config: CompareConfig, args: argparse.Namespace) -> int:
    """Reads the table, prints the report (and writes the JSON); the exit code."""
    if args.flipped < 0:
        print("error: --flipped must be >= 0", file=sys.stderr)
        return EXIT_CONFIG
    try:
        tolerances = parse_tolerances(list(args.tolerance))
        name = args.table or comparison_table(config)
        where = locate(config.sink, name)
        table = read_comparison(config.sink, name)
    except (ValueError, TableMissing) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ReadFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        if table.num_columns:  # an empty Parquet dataset has none yet
            check_layout(table.column_names)
        comparison = compare_table(table, tolerances, flipped=args.flipped) if len(table) else None
    except NotComparable as exc:
        print(f"error: {where}: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if comparison is None:
        figures = {"table": where.table, "store": where.store, "rows": 0}
        text = [f"comparison table {where}: no rows compared yet"]
    else:
        figures = report_json(comparison, where.table, where.store)
        text = report_lines(comparison, str(where))
    if args.json is not None:
        encoded = json.dumps(figures, indent=2, allow_nan=False, default=str)
        if args.json == "-":
            print(encoded)
            return 0
        Path(args.json).write_text(encoded + "\n")
    print("\n".join(text))
    return 0


def main(argv: list[str], load: Callable[[Path | None], CompareConfig]) -> int:
    """The command on ``argv`` (after ``compare``); ``load`` reads the configuration file
    (raising ``ValueError``, e.g. the service's ``ConfigError``, naming what is wrong)."""
    args = build_parser().parse_args(argv)
    try:
        config = load(args.config)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    return run_compare(config, args)
