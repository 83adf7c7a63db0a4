from __future__ import annotations

from pathlib import Path

import pytest

from harness.service import REPO_ROOT
from rowbatch.consumer.service.config import ConfigError, load_config
from rowbatch.consumer.sinks.settings import SqliteSinkSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings

EXAMPLE = REPO_ROOT / "deploy" / "consumer.example.toml"


def test_example_config_is_valid() -> None:
    config = load_config(EXAMPLE)
    assert isinstance(config.source, PubSubSettings)
    assert isinstance(config.sink, SqliteSinkSettings)
    assert config.binding.passthrough == {"id": "int64"}
    assert config.model.max_wait_ms == 100


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROWBATCH_MODEL__URL", "triton:8001")
    monkeypatch.setenv("ROWBATCH_BUDGET_BYTES", "1048576")
    config = load_config(EXAMPLE)
    assert config.model.url == "triton:8001"
    assert config.model.name == "embedder"  # the rest of [model] still comes from the file
    assert config.budget_bytes == 1048576


def test_errors_name_the_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        EXAMPLE.read_text()
        .replace(
            'subscription = "projects/my-project/subscriptions/rows-embedder"',
            'subscription = "rows"',
        )
        .replace('passthrough = { id = "int64" }', 'passthrough = { id = "int65" }')
    )
    with pytest.raises(ConfigError) as err:
        load_config(bad)
    text = str(err.value)
    assert "source.pubsub.subscription" in text
    assert "passthrough" in text
    assert "int65" in text


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        load_config(tmp_path / "nope.toml")


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("ROWBATCH_SOURCE", "/some/path", "  source: Input should be a valid dictionary"),
        ("ROWBATCH_SOURCE__MAX_MESSAGES", "many", "  source.pubsub.max_messages: Input should"),
        ("ROWBATCH_SINK__BACKOFF_MAX_S", "soon", "  sink.sqlite.backoff_max_s: Input should"),
        ("ROWBATCH_BUDGET_BYTES", "lots", "  budget_bytes: Input should"),
    ],
)
def test_a_bad_value_from_the_environment_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, said: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_config(EXAMPLE)
    [line] = [x for x in str(caught.value).splitlines() if x.startswith(said)]
    assert line.endswith(f"(from the environment: {variable})"), line


def test_a_bad_value_from_the_file_names_no_variable(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.read_text().replace("max_messages = 1000", "max_messages = 0"))
    with pytest.raises(ConfigError) as caught:
        load_config(bad)
    assert "source.pubsub.max_messages" in str(caught.value)
    assert "from the environment" not in str(caught.value)
