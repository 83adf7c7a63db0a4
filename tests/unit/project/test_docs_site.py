"""The docs site (mkdocs.yml) builds strictly, as scripts/test.sh builds it: a link to a missing
page, a missing anchor or a missing repository file fails the build, and links to repository
files outside docs/ are carried into the site. Its configuration reference, generated from the
settings models at each build (scripts/config_reference.py), lists every field of every
settings model, secrets without their values."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel, SecretStr

from harness.service import REPO_ROOT
from rowbatch.consumer.section import Section
from rowbatch.consumer.service.config import ConsumerConfig

HOOKS = REPO_ROOT / "scripts" / "mkdocs_hooks.py"


@functools.cache
def _config_reference() -> ModuleType:
    """scripts/config_reference.py (scripts/ is no package), loaded once."""
    path = REPO_ROOT / "scripts" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_test_command_builds_the_site_strictly_and_not_quietly() -> None:
    """``mkdocs build --strict --quiet`` passes whatever the links: quiet drops the warnings
    before strict counts them."""
    lines = (REPO_ROOT / "scripts" / "test.sh").read_text().splitlines()
    builds = [line for line in lines if "mkdocs build" in line and not line.startswith("#")]
    assert builds, "scripts/test.sh no longer builds the docs site"
    for line in builds:
        assert "--strict" in line, line
        assert not re.search(r"\s(--quiet|-q)\b", line), line


def _settings_models() -> list[type[BaseModel]]:
    """Every concrete settings class (``Section`` subclasses, private bases left out: their
    fields show in their subclasses' tables), found without the generator's walk."""
    found: list[type[BaseModel]] = []
    pending: list[type[BaseModel]] = [Section]
    while pending:
        for sub in pending.pop().__subclasses__():
            pending.append(sub)
            if not sub.__name__.startswith("_") and sub.__module__.startswith("rowbatch."):
                found.append(sub)
    return found


def _page_tables(page: str) -> dict[str, set[str]]:
    """Each ``## `` heading of the page -> the keys (first column) of its table."""
    tables: dict[str, set[str]] = {}
    current: set[str] = set()
    for line in page.splitlines():
        if line.startswith("## "):
            current = tables.setdefault(line, set())
        else:
            key = re.match(r"^\| `([^`]+)` \|", line)
            if key:
                current.add(key.group(1))
    return tables


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    result = _build(REPO_ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr
    page = tmp_path / "site" / "configuration-reference" / "index.html"
    assert page.is_file()
    html = page.read_text()
    for name in ConsumerConfig.model_fields:
        assert name in html


def test_the_configuration_reference_lists_every_field_of_every_settings_model() -> None:
    page = _config_reference().render()
    tables = _page_tables(page)
    models = _settings_models()
    assert len(models) >= 10, models  # the walk above found them (imports done by the config)
    every: list[type[BaseModel]] = [ConsumerConfig, *models]
    for model in every:
        keys = {
            info.alias or name
            for name, info in model.model_fields.items()
            if not _is_section(info.annotation)
        }
        assert any(keys <= listed for listed in tables.values()), (
            f"{model.__qualname__}: no table of the configuration reference lists all of "
            f"{sorted(keys)}"
        )


def _is_section(annotation: object) -> bool:
    if isinstance(annotation, type):
        return issubclass(annotation, Section)
    return any(_is_section(a) for a in getattr(annotation, "__args__", ()))


def test_the_configuration_reference_shows_no_secret_values() -> None:
    page = _config_reference().render()
    for table, key in _config_reference().field_keys():
        info = {i.alias or n: i for n, i in table.model.model_fields.items()}[key]
        if "SecretStr" in str(info.annotation) or info.annotation is SecretStr:
            row = next(line for line in page.splitlines() if line.startswith(f"| `{key}` |"))
            assert "secret string" in row
            assert row.split(" | ")[2] in {"required", "unset", "(secret)"}, row


def test_the_configuration_reference_takes_descriptions_and_constraints() -> None:
    page = _config_reference().render()
    rows = [line for line in page.splitlines() if line.startswith("| `budget_bytes` |")]
    assert len(rows) == 1
    assert "≥ `1048576` (1 MiB)" in rows[0]
    assert "Memory budget for everything in flight" in rows[0]
    assert "[`[sink]` kind = " not in page  # headers in code, whole
    assert '## `[source] kind = "kafka"` {#config-source-kafka}' in page


def _scratch_site(tmp_path: Path, pages: dict[str, str]) -> Path:
    """A project beside the real one: the real mkdocs.yml (validation, hooks) over ``pages``,
    with a repository file ``deploy/example.toml`` and a folder ``src/`` outside docs/."""
    (tmp_path / "docs").mkdir()
    for name, text in pages.items():
        (tmp_path / "docs" / name).write_text(text)
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "example.toml").write_text("[model]\n")
    (tmp_path / "src").mkdir()
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {REPO_ROOT / 'mkdocs.yml'}\ndocs_dir: docs\nhooks:\n  - {HOOKS}\n")
    return config


def test_links_to_repository_files_are_carried_into_the_site(tmp_path: Path) -> None:
    config = _scratch_site(
        tmp_path,
        {
            "index.md": "# Home\n\nSee [the other page](other.md#a-section), "
            "[the example](../deploy/example.toml), [`src/`](../src/) and "
            "[its code](../src/).\n\n```\n[not a link](../missing.toml)\n```\n",
            "other.md": "# Other\n\n## A section\n\nBack [home](index.md).\n",
        },
    )
    result = _build(config, tmp_path / "site")
    assert result.returncode == 0, result.stderr
    index = (tmp_path / "site" / "index.html").read_text()
    assert (tmp_path / "site" / "repository" / "deploy" / "example.toml").is_file()
    assert 'href="repository/deploy/example.toml"' in index
    assert "<code>src/</code>" in index
    assert "its code (<code>src/</code> in the repository)" in index
    assert "[not a link](../missing.toml)" in index  # code is left alone


_BROKEN = {
    "[gone](missing.md)": "contains a link 'missing.md', but the target is not found",
    "[gone](other.md#no-such-heading)": "does not contain an anchor '#no-such-heading'",
    "[gone](#nowhere)": "contains a link '#nowhere', but there is no such anchor",
    "[gone](../deploy/missing.toml)": "'deploy/missing.toml', which is not in the repository",
}


def test_each_broken_link_fails_the_build(tmp_path: Path) -> None:
    """A missing page, a missing anchor on another page or on the same one, a missing
    repository file: one warning each, and strict fails the build (one build for all four)."""
    links = "\n\n".join(f"See {link}." for link in _BROKEN)
    config = _scratch_site(
        tmp_path, {"index.md": f"# Home\n\n{links}\n", "other.md": "# Other\n\n## A section\n"}
    )
    result = _build(config, tmp_path / "site")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    for link, message in _BROKEN.items():
        assert message in output, f"{link}: no {message!r} in\n{output}"
    assert f"Aborted with {len(_BROKEN)} warnings in strict mode" in output
