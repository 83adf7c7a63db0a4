"""Figures in the README and docs trace to recorded runs (``bench/results/``): every cited block
is what its file gives (``bench/cite.py``), a figure changed by hand or a file removed is
named; the spread of repeated runs, the machine record and the per-run targets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import cite, machine
from bench.report import Report, RunInfo, Target, targets_table
from bench.spread import Spread, figures, spread


def _saturation(of_measured: float, cpu: float, speedup: float | None) -> dict[str, Any]:
    case = {
        "broker": "kafka",
        "sink": "postgres",
        "rows_per_message": 500,
        "load": None,
        "model": "fixed_latency",
        "rows_per_s": 19_000.0,
        "of_measured": of_measured,
        "busy": 0.97,
        "mean_batch": 256.0,
        "cpu_us_per_row": cpu,
        "peak_rss_mib": 200.0,
        "reference_rows_per_s": 18_000.0,
        "speedup": speedup,
        "p99_ms": None,
        "keeps_up": None,
    }
    return {"probes": [], "cases": [case]}


def _recorded(runs: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    found: dict[str, Any] = {
        "run": {"command": "python -m bench --only saturation", "started_at": "2026-12-02"},
        "machine": {"cores": 2, "cpu_model": "Test CPU", "calibration_us": 1500.0},
        "sections": runs[0],
    }
    if len(runs) > 1:
        found["repeats"] = runs
        found["spread"] = {
            name: {"median": s.median, "low": s.low, "high": s.high, "values": list(s.values)}
            for name, s in spread(runs).items()
        }
    return found


RUNS = [
    {"saturation": _saturation(0.98, 3.0, 1.1)},
    {"saturation": _saturation(0.95, 3.6, 1.0)},
    {"saturation": _saturation(0.99, 3.2, 1.2)},
]
FIGURE = "saturation kafka fixed_latency 500-row postgres backlog: of measured ceiling"


def test_every_cited_block_in_the_repository_is_what_its_file_gives() -> None:
    stale = cite.check()
    assert stale == [], "\n".join(f"{s.doc}: {s.cited}: {s.why}" for s in stale)


def test_the_readme_cites_a_recorded_run() -> None:
    cited = cite.cited_files()
    assert any(doc == "README.md" for doc, _ in cited), "README.md cites no recorded run"
    for _, name in cited:
        assert name.startswith("bench/results/"), name


def test_every_headline_names_a_figure_of_the_recorded_run() -> None:
    """A headline whose figure name drifted from bench/spread.py's would silently drop its
    row from the README: each must find a figure in a recorded run (the naive comparison's in
    the 2026-12-02 one, the 10-row steady case's in the 2026-12-04 one)."""
    found = {}
    for name in ("saturation-2026-12-02", "saturation-2026-12-04"):
        recorded = json.loads((cite.REPO / f"bench/results/{name}.json").read_text())
        found.update(cite.load_spread(recorded))
    brokers = [b for b, _ in cite.BROKER_COLUMNS]
    missing = [
        h.label
        for h in cite.HEADLINES
        if not any(h.figure.format(broker=b) in found for b in brokers)
    ]
    assert missing == []


def test_spread_is_median_least_and_greatest_over_the_runs() -> None:
    found = spread(RUNS)[FIGURE]
    assert found == Spread(0.98, 0.95, 0.99, (0.98, 0.95, 0.99))
    assert spread(RUNS)["saturation kafka fixed_latency 500-row postgres backlog: x reference"] == (
        Spread(1.1, 1.0, 1.2, (1.1, 1.0, 1.2))
    )


def test_figures_leave_out_what_a_case_did_not_measure() -> None:
    named = figures(RUNS[0])
    assert not any(name.endswith("p99 ms") for name in named)
    assert named[FIGURE] == 0.98


def _doc(tmp_path: Path, recorded: dict[str, object]) -> Path:
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    (results / "run.json").write_text(json.dumps(recorded))
    (results / "run.txt").write_text("8. Saturation\n  a table\n")
    doc = tmp_path / "README.md"
    doc.write_text(
        "intro\n<!-- bench:headline bench/results/run.json -->\n<!-- /bench -->\n"
        "more\n<!-- bench:tables bench/results/run.txt -->\nold\n<!-- /bench -->\nend\n"
    )
    return doc


def test_a_block_is_rendered_from_its_file_with_the_spread(tmp_path: Path) -> None:
    doc = _doc(tmp_path, _recorded(RUNS))
    text, stale = cite.refresh(doc.read_text(), tmp_path, "README.md")
    assert len(stale) == 2  # both blocks were out of date
    assert "| 500-row messages: share of the measured ceiling" in text
    assert "98% (95%-99%)" in text
    assert "over 3 runs" in text and "Test CPU" in text
    assert "```\n8. Saturation\n  a table\n```\n" in text
    doc.write_text(text)
    assert cite.check(tmp_path, ["README.md"]) == []


def test_a_figure_changed_by_hand_is_named(tmp_path: Path) -> None:
    doc = _doc(tmp_path, _recorded(RUNS))
    doc.write_text(cite.refresh(doc.read_text(), tmp_path, "README.md")[0])
    doc.write_text(doc.read_text().replace("98% (95%-99%)", "99% (95%-99%)"))
    [stale] = cite.check(tmp_path, ["README.md"])
    assert (stale.cited, stale.why) == (
        "bench/results/run.json",
        "differs from what the file gives",
    )


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    doc = _doc(tmp_path, _recorded(RUNS))
    doc.write_text(cite.refresh(doc.read_text(), tmp_path, "README.md")[0])
    (tmp_path / "bench" / "results" / "run.txt").unlink()
    [stale] = cite.check(tmp_path, ["README.md"])
    assert (stale.cited, stale.why) == ("bench/results/run.txt", "file missing")


def test_one_run_shows_single_values(tmp_path: Path) -> None:
    doc = _doc(tmp_path, _recorded(RUNS[:1]))
    text, _ = cite.refresh(doc.read_text(), tmp_path, "README.md")
    assert "| 98% |" in text and "over 1 run " in text


def test_machine_reads_cpu_memory_and_load(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("model name\t: Test CPU 9000\ncpu MHz\t\t: 2100.5\n")
    (tmp_path / "meminfo").write_text("MemTotal:       25165824 kB\n")
    (tmp_path / "loadavg").write_text("0.50 0.25 0.10 1/100 42\n")
    found = machine.describe(tmp_path)
    assert (found.cpu_model, found.cpu_mhz, found.memory_gib) == ("Test CPU 9000", 2100.5, 24.0)
    assert (found.load_before.one, found.load_before.five) == (0.5, 0.25)
    assert found.calibration_us > 0
    (tmp_path / "loadavg").write_text("1.50 0.75 0.10 1/100 42\n")
    assert machine.finish(found, tmp_path).load_after is not None
    assert "load before 0.50/0.25, after 1.50/0.75" in machine.finish(found, tmp_path).header()


def test_targets_over_runs_count_the_runs_that_met_them() -> None:
    table = targets_table(
        [
            [Target("t", ">= 1", "2", True)],
            [Target("t", ">= 1", "0", False)],
            [Target("t", ">= 1", "3", True)],
        ]
    )
    assert table.rows == (("t", ">= 1", "2 | 0 | 3", "2 of 3"),)
    assert targets_table([[Target("t", ">= 1", "0", False)]]).rows == (("t", ">= 1", "0", "NO"),)


@pytest.mark.parametrize("runs", [1, 3])
def test_report_json_keeps_every_run_and_the_spread(tmp_path: Path, runs: int) -> None:
    from dataclasses import dataclass

    from bench.report import Table

    @dataclass(frozen=True)
    class Result:
        rows_per_s: float

        def table(self) -> Table:
            return Table("t", ("rows/s",), ((f"{self.rows_per_s:g}",),))

    info = RunInfo("cmd", "now", {}, 2, False, "dir")
    report = Report(info, tmp_path / "out.json")
    for i in range(runs):
        if i:
            report.next_run()
        report.add("thing", Result(float(10 + i)), 1.0)
        report.targets = [Target("t", "x", str(i), True)]
    report.write()
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["sections"] == {"thing": {"rows_per_s": 10.0}}
    if runs == 1:
        assert "repeats" not in written and "spread" not in written
    else:
        assert [r["thing"]["rows_per_s"] for r in written["repeats"]] == [10.0, 11.0, 12.0]
        assert written["spread"]["thing: rows_per_s"]["median"] == 11.0
        assert len(written["targets_by_run"]) == 3
        assert set(written["elapsed_s"]) == {"thing", "thing#2", "thing#3"}


def test_prose_figures_must_be_in_the_cited_file(tmp_path: Path) -> None:
    results = tmp_path / "bench" / "results"
    results.mkdir(parents=True)
    (results / "sim.txt").write_text("steady  kafka/keda-lag  lag 180/pod  0  26  2.04  19,368\n")
    doc = tmp_path / "README.md"
    written = (
        "<!-- bench:from bench/results/sim.txt -->\n"
        "On 2026-12-02 KEDA at `lagThreshold` 180: p99 26 s, 2.0x the minimum, 19,368 rows/s.\n"
        "<!-- /bench -->\n"
    )
    doc.write_text(written)
    assert cite.check(tmp_path, ["README.md"]) == []
    doc.write_text(written.replace("p99 26 s", "p99 24 s").replace("19,368", "19,386"))
    [stale] = cite.check(tmp_path, ["README.md"])
    assert stale.why == "figures not at their place in the file: 24, 19386"
    assert cite.refresh(doc.read_text(), tmp_path, "README.md")[0] == doc.read_text()


def test_absent_figures_accepts_rounding_to_the_digits_shown() -> None:
    assert cite.absent_figures("1.4x and 2.0x and 36 %", "1.36 2.04 35.6") == []
    assert cite.absent_figures("1.5x", "1.36 2.04") == ["1.5"]
