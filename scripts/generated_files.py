"""The command line of the scripts that write files generated from sources in the repository
(scripts/gmp_rules.py, scripts/render_kube_prometheus.py): with no option it writes each file;
``--check`` writes nothing and exits 1, naming each file that is missing or differs from what
would be written; ``--root`` names the repository root.

scripts/ is no package: a script imports this module from beside it, after appending its own
directory to ``sys.path`` (there already when it runs as ``python scripts/<name>.py``; not when
a test loads it from its file).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

#: Each generated file (relative to the root it is given) and its content, from the sources
#: under that root.
Render = Callable[[Path], dict[Path, str]]


def stale(render: Render, root: Path) -> list[Path]:
    """The files ``render`` generates under ``root`` that are missing or differ from their
    sources."""
    return [
        path
        for path, text in render(root).items()
        if not (root / path).is_file() or (root / path).read_text() != text
    ]


def main(
    argv: Sequence[str] | None, render: Render, default_root: Path, command: str, doc: str | None
) -> int:
    """The generator's command line: ``render`` the files under ``--root`` (``default_root``
    unless given); ``command`` is how a stale file's message says to regenerate it; the first
    paragraph of ``doc`` (the script's docstring) describes the command."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0] if doc else None)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a file is stale"
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=default_root,
        help="the repository root (default: this checkout)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.check:
        out_of_date = stale(render, root)
        for path in out_of_date:
            print(f"{path} is stale: run `{command}`", file=sys.stderr)
        return 1 if out_of_date else 0
    for path, text in render(root).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
        print(f"wrote {path}")
    return 0
