"""deploy/generative.example.toml names every ``[model]`` setting of kind ``openai`` (set, or
commented out with its default) and loads through the real config loader, commented lines
uncommented too."""

from __future__ import annotations

import re
from pathlib import Path

from harness.service import REPO_ROOT
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.service.config import load_config

EXAMPLE = REPO_ROOT / "deploy" / "generative.example.toml"
_KEY = re.compile(r"^#?\s*([a-z_]+)\s*=")


def model_keys(text: str) -> set[str]:
    keys, section = set(), ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line.strip("[]")
        elif section == "model" and (key := _KEY.match(line)):
            keys.add(key[1])
    return keys


def test_the_example_names_every_openai_setting() -> None:
    # [model.candidate] is a table of its own, named in a comment (keys: consumer.example.toml)
    missing = set(OpenAISettings.model_fields) - {"candidate"} - model_keys(EXAMPLE.read_text())
    assert not missing, f"absent from {EXAMPLE.name}: {sorted(missing)}"


def test_the_example_loads_as_an_openai_model(tmp_path: Path) -> None:
    config = load_config(EXAMPLE)
    assert isinstance(config.model, OpenAISettings)
    assert config.model.api == "chat" and (config.model.prompt or "").endswith("{body}")


def test_the_example_with_its_options_uncommented_loads(tmp_path: Path) -> None:
    """The commented settings, uncommented, load too (but api_key, which excludes
    api_key_file, tls_ca_file, which needs a real CA, and rows_per_request, which a chat
    refuses)."""
    key_file = tmp_path / "key"
    key_file.write_text("sk-test\n")
    lines = []
    section = ""
    for raw in EXAMPLE.read_text().splitlines():
        if raw.startswith("["):
            section = raw.strip("[]")
        candidate = raw.removeprefix("# ")
        if section == "model" and raw.startswith("# ") and _KEY.match(candidate):
            if candidate.startswith(("api_key =", "tls_ca_file", "rows_per_request")):
                continue
            candidate = candidate.replace("/var/run/secrets/model/api-key", str(key_file))
            lines.append(candidate)
        else:
            lines.append(raw)
    path = tmp_path / "all.toml"
    path.write_text("\n".join(lines) + "\n")
    model = load_config(path).model
    assert isinstance(model, OpenAISettings)
    assert model.key() == "sk-test"
    assert model.json_schema is not None and model.tokens_per_minute == 90000
