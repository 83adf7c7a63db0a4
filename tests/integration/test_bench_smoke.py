"""``python -m bench --quick --only ceiling,overhead`` on its own stack (the command starts
and stops every service itself): the JSON it writes has the run header and positive figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.service import REPO_ROOT


@pytest.mark.timeout(240)
def test_bench_quick_ceiling_and_overhead_write_positive_figures(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "ceiling,overhead", "--no-profile",
         "--out", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=220, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1. Ceiling" in done.stdout and "4. Overhead" in done.stdout
    result = json.loads(out.read_text())

    run = result["run"]
    assert "--quick" in run["command"]
    for key in ("rowbatch", "triton", "kafka", "pubsub", "python", "numpy", "cpus"):
        assert run["versions"][key], key
    assert run["cpu_count"] >= 1

    ceiling = result["sections"]["ceiling"]["models"]
    assert {m["model"] for m in ceiling} == {"embedder", "scorer"}
    for model in ceiling:
        assert model["batch"] > 0 and model["rows_per_s"] > 0 and model["best_concurrency"] >= 1
        assert all(step["rows_per_s"] > 0 for step in model["steps"])

    cases = result["sections"]["overhead"]["cases"]
    assert {(c["encoding"], c["kind"]) for c in cases} == {
        ("json", "text"), ("arrow", "text"), ("json", "numeric"), ("arrow", "numeric"),
    }  # fmt: skip
    for case in cases:
        assert case["rows"] > 0 and case["us_per_row"] > 0 and case["rows_per_s"] > 0

    assert result["errors"] == {}
    assert {t["name"] for t in result["targets"]} >= {"consumer CPU per row, arrow numeric"}
    assert result["elapsed_s"]["total"] > 0
