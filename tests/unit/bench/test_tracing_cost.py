"""``python -m bench.tracing_cost`` runs end to end on a few messages (in a process of its own:
it installs the global tracer provider), prints its table and writes JSON whose figures say
that tracing on made spans and the off mode made none."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from harness.service import REPO_ROOT


def test_the_tracing_cost_bench_runs_and_records(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.tracing_cost",
            "--sizes",
            "1",
            "--messages",
            "64",
            "--repeat",
            "1",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "on - off" in done.stdout
    spans = int(done.stdout.split("spans exported: ")[1].split(",")[0])
    # warm-up + one "on" run: a process span per message at least, twice
    assert spans >= 2 * 64
    record = json.loads(out.read_text())
    [case] = record["cases"]
    assert case["rows_per_message"] == 1
    assert set(case["median"]) == {"off", "on", "unsampled"}
    assert record["machine"]["cores"] >= 1
    assert record["off_against_base"] is None
