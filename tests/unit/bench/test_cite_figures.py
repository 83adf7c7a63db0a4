"""Every measured figure in every page is checked: a cited block's figures must be at their
place in the run (a range the run's range, a median the median), and a figure outside any
block must be cited or say it is unrecorded. Each kind of wrong edit is planted in a page that
the check did not read before (docs/tracing.md) and must be named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench import cite, figure_match, figure_scan

RUN = "bench/results/memory-2026-12-05.txt"
SINKS = "bench/results/sinks-2026-12-03.txt"
PAGE = "docs/tracing.md"


def _block(body: str, cited: str = RUN, where: str = "") -> str:
    opening = f"<!-- bench:from {cited}{' ' + where if where else ''} -->"
    return f"\n\n{opening}\n{body}\n<!-- /bench -->\n"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of the pages and recorded runs the check reads."""
    shutil.copytree(cite.REPO / "docs", tmp_path / "docs")
    shutil.copytree(cite.REPO / "bench/results", tmp_path / "bench/results")
    shutil.copy(cite.REPO / "README.md", tmp_path / "README.md")
    return tmp_path


def _planted(root: Path, text: str) -> list[str]:
    """What the check says about ``PAGE`` once ``text`` is appended, and did not say before."""
    before = {s.why for s in cite.check(root)}
    page = root / PAGE
    page.write_text(page.read_text() + text)
    return [s.why for s in cite.check(root) if s.why not in before and s.doc == PAGE]


def test_every_page_is_read() -> None:
    pages = cite.citing()
    assert PAGE in pages
    assert "README.md" in pages
    assert len(pages) == 1 + len(list((cite.REPO / "docs").rglob("*.md")))


def test_a_right_block_passes(root: Path) -> None:
    body = "Peaks 176-194 MiB under a 64 MiB budget and 227-244 under 128 MiB; `expander` 169."
    assert _planted(root, _block(body, where="rows: expander_wide 64 | expander_wide 128")) == []


def test_a_range_that_is_not_the_runs_range_is_named(root: Path) -> None:
    """176 and 180 are both peaks of the 64 MiB rows, but the rows' range is 176-194."""
    body = "Peaks 176-180 MiB under a 64 MiB budget."
    found = _planted(root, _block(body, where="rows: expander_wide 64 | expander_wide 128"))
    assert len(found) == 1
    assert "176-180" in found[0]


def test_a_median_edited_to_an_end_of_its_range_is_named(root: Path) -> None:
    """Iceberg's median rows/s is 19,565 over rounds that spanned 19,552-19,663."""
    assert _planted(root, _block("Iceberg: 19,565 rows/s (19,552-19,663).", SINKS)) == []
    found = _planted(root, _block("Iceberg: 19,552 rows/s.", SINKS))
    assert len(found) == 1
    assert "19552" in found[0]


def test_a_figure_the_run_does_not_hold_is_named(root: Path) -> None:
    found = _planted(root, _block("Iceberg commits take 0.14 s.", SINKS))
    assert len(found) == 1
    assert "0.14" in found[0]


def test_a_section_that_does_not_exist_is_named(root: Path) -> None:
    found = _planted(root, _block("19,565 rows/s.", SINKS, "#99"))
    assert found and "no section '99'" in found[0]


@pytest.mark.parametrize(
    "sentence",
    [
        "Sampling every message costs 282 us of CPU.",
        "It drains 19,565 rows/s.",
        "The file sinks write 1.98x PostgreSQL's rows.",
        "A commit takes 0.12 s.",
        "Peaks of 176-194 MiB.",
        "The consumer keeps the server 93-97 % busy.",
        "Its p99 was 45 ms.",
        "Libraries map ~21 MiB.",
    ],
)
def test_a_measured_figure_outside_any_block_is_named(root: Path, sentence: str) -> None:
    found = _planted(root, f"\n\n{sentence}\n")
    assert len(found) == 1, found
    assert "no 'unrecorded' marker" in found[0]


@pytest.mark.parametrize(
    "text",
    [
        "\n\nSampling every message costs 282 us of CPU (a hand run, unrecorded).\n",
        "\n\nRetries back off from 0.1 s to 1 s. <!-- not measured: the defaults -->\n",
        "\n\nA hand run, unrecorded:\n\n| way | rows/s |\n|---|---|\n| table | 18,553 |\n",
        "\n\nThe default budget is 256 MiB and the HPA syncs every 15 s at up to 100 %.\n",
        "\n\nSet `max_wait_ms = 5.5` for 1.5x.\n".replace("1.5x", "`1.5x`"),
        "\n\n```toml\nmax_wait_ms = 2.5  # 19,565 rows/s\n```\n",
    ],
)
def test_marked_settings_and_code_are_not_named(root: Path, text: str) -> None:
    assert _planted(root, text) == []


def test_a_table_under_an_unmarked_caption_is_named_row_by_row(root: Path) -> None:
    found = _planted(root, "\n\nA run:\n\n| way | rows/s |\n|---|---|\n| table | 18,553 rows/s |\n")
    assert len(found) == 1


def test_tokens_tell_ranges_from_singles() -> None:
    tokens = [str(t) for t in figure_match.tokens("176-194 MiB, 0.42x-0.54x, 93-97 %, 12 s")]
    assert tokens == ["176-194", "0.42-0.54", "93-97%", "12"]
    assert [str(t) for t in figure_match.tokens("500-row, p99, 2026-12-05 01:59, rows/s")] == []


def test_column_ranges_follow_the_rows_named() -> None:
    text = (cite.REPO / RUN).read_text()
    found = figure_match.of_text(text, filters=("expander_wide 64",))
    assert ("176", "194") in found.ranges
    assert ("176", "180") not in found.ranges
    assert "176" in found.singles


def test_figure_scan_reads_units_not_settings() -> None:
    assert list(figure_scan.figures("it took 0.12 s and 30 s")) == ["0.12 s"]
    assert list(figure_scan.figures("15 s sync, 10 % tolerance, 256 MiB")) == []
    assert list(figure_scan.figures("p99 45 ms against 140 ms")) == ["45 ms"]
