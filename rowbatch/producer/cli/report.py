"""What a run prints and writes: the summary line (and the malformed messages the load generator
sent) on stdout, and the ``--manifest`` JSON file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from rowbatch.producer.cli.running import Outcome


def write_manifest(path: Path, outcome: Outcome) -> None:
    data: dict[str, Any]
    if outcome.manifest is not None:
        data = outcome.manifest.to_json(outcome.summary.to_json())
    else:
        data = {"summary": outcome.summary.to_json()}
    if outcome.error is not None:
        data["error"] = outcome.error
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def report(outcome: Outcome, stdout: TextIO) -> None:
    print(outcome.summary.line(), file=stdout)
    manifest = outcome.manifest
    if manifest is not None and manifest.spec.malformed > 0:
        items = ", ".join(f"{cid} ({m['kind']})" for cid, m in sorted(manifest.malformed.items()))
        print(
            f"malformed: {len(manifest.malformed)} of {manifest.messages} messages: {items}; "
            f"valid rows: {manifest.valid_rows:,}",
            file=stdout,
        )


__all__ = ["report", "write_manifest"]
