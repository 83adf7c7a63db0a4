"""README.md is a first page: short, with a quickstart whose configuration loads through the
real config loader as a user would save it; the rest lives in docs/ (issue 45)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from harness.service import REPO_ROOT
from rowbatch.consumer.service.config import load_config
from rowbatch.consumer.sinks.settings import SqliteSinkSettings
from rowbatch.consumer.sources.kafka.settings import KafkaSettings

README = REPO_ROOT / "README.md"
MAX_LINES = 260
_TOML = re.compile(r"^```toml\n(.*?)^```$", re.MULTILINE | re.DOTALL)
_LINK = re.compile(r"\]\(((?:docs|deploy)/[^)#\s]+)")


def quickstart() -> str:
    text = README.read_text()
    start = text.index("\n## Quickstart\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_readme_stays_a_first_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines (at most {MAX_LINES})"


def test_the_quickstart_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ROWBATCH_")]:  # the file's values only
        monkeypatch.delenv(name)
    [block] = _TOML.findall(quickstart())
    path = tmp_path / "quickstart.toml"
    path.write_text(block)
    config = load_config(path)
    assert isinstance(config.source, KafkaSettings)
    assert isinstance(config.sink, SqliteSinkSettings)
    assert (config.model.name, config.binding.inputs) == ("my_model", {"text": "TEXT"})


def test_the_quickstart_runs_check_then_run_and_publishes_a_chunk() -> None:
    text = quickstart()
    assert "rowbatch-consumer check --config quickstart.toml" in text
    assert "rowbatch-consumer run --config quickstart.toml" in text
    assert "rowbatch-producer publish" in text


def test_the_readme_keeps_the_two_commands() -> None:
    text = README.read_text()
    assert "scripts/demo.sh     # main job" in text
    assert "scripts/test.sh     # all tests" in text


def test_the_readme_links_to_files_that_exist() -> None:
    links = _LINK.findall(README.read_text())
    missing = [link for link in links if not (REPO_ROOT / link).exists()]
    assert missing == []
