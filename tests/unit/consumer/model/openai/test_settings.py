"""``[model]`` with ``kind = "openai"``, read through the consumer's configuration (a TOML file
and the environment): what parses, and what is refused naming the field; ``[model]`` without a
kind is still the Open Inference Protocol's section."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig, load_config

SOURCE = """
[source]
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topic = "rows"
group_id = "g"
"""

BINDING = """
[binding]
outputs = { text = "summary" }
"""


def write(tmp_path: Path, model: str, binding: str = BINDING) -> Path:
    path = tmp_path / "consumer.toml"
    path.write_text(SOURCE + "\n[model]\n" + model.strip() + "\n" + binding)
    return path


def openai(tmp_path: Path, model: str) -> OpenAISettings:
    config = load_config(write(tmp_path, 'kind = "openai"\nname = "llm"\n' + model))
    assert isinstance(config.model, OpenAISettings)
    return config.model


def refused(tmp_path: Path, model: str) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, 'kind = "openai"\nname = "llm"\n' + model))
    return str(caught.value)


@pytest.fixture(autouse=True)
def _no_model_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in [n for n in os.environ if n.startswith("ROWBATCH_")]:
        monkeypatch.delenv(name)


def test_kind_openai_parses_with_its_defaults(tmp_path: Path) -> None:
    model = openai(tmp_path, 'prompt = "Summarise: {body}"')
    assert model.kind == "openai"
    assert model.name == "llm"
    assert model.url == ("http://127.0.0.1:8000",)
    assert model.api == "chat"
    assert model.requests_rows == 1
    assert model.window_ceiling == 2 * model.max_in_flight
    assert model.key() is None
    config = load_config(write(tmp_path, 'kind = "openai"\nname = "llm"\nprompt = "{body}"'))
    assert config.binding.inputs == {}  # an OpenAI model's columns come from its template
    assert config.binding.outputs == {"text": "summary"}


def test_a_url_list_is_kept_in_order_without_v1(tmp_path: Path) -> None:
    model = openai(
        tmp_path,
        'prompt = "{body}"\nurl = ["http://a:8000/v1", "https://b:8443/v1/", "http://c:1/"]',
    )
    assert model.url == ("http://a:8000", "https://b:8443", "http://c:1")


def test_a_comma_separated_url_string(tmp_path: Path) -> None:
    model = openai(tmp_path, 'prompt = "{body}"\nurl = "http://a:8000/v1 , http://b:8001,"')
    assert model.url == ("http://a:8000", "http://b:8001")


def test_one_url_string(tmp_path: Path) -> None:
    model = openai(tmp_path, 'prompt = "{body}"\nurl = "http://vllm:8000/v1"')
    assert model.url == ("http://vllm:8000",)


def test_urls_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROWBATCH_MODEL__URL", "http://x:1/v1,http://y:2")
    model = openai(tmp_path, 'prompt = "{body}"\nurl = "http://ignored:9"')
    assert model.url == ("http://x:1", "http://y:2")


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ('"vllm:8000"', "is not an http:// or https:// URL"),
        ('["http://a:1", "http://a:1/v1"]', "is listed twice"),
        ("[]", "name at least one server"),
        ('""', "name at least one server"),
    ],
)
def test_bad_urls_are_named(tmp_path: Path, url: str, said: str) -> None:
    text = refused(tmp_path, f'prompt = "{{body}}"\nurl = {url}')
    assert "model.url" in text
    assert said in text


@pytest.mark.parametrize("template", ["{a.b}", "{a!r}", "{0}", "{body", "x}"])
def test_a_bad_template_names_model_prompt(tmp_path: Path, template: str) -> None:
    text = refused(tmp_path, f'prompt = "Summarise {template}"')
    [line] = [x for x in text.splitlines() if "prompt" in x]
    assert line.strip().startswith("model.prompt:"), line
    assert "model.openai" not in text  # the union's tag is not shown


def test_a_bad_system_prompt_names_model_system_prompt(tmp_path: Path) -> None:
    text = refused(tmp_path, 'prompt = "{body}"\nsystem_prompt = "You are {role:>3}"')
    assert "  model.system_prompt:" in text


def test_a_system_prompt_parses_for_chat(tmp_path: Path) -> None:
    model = openai(tmp_path, 'prompt = "{body}"\nsystem_prompt = "You speak {{JSON}} as {role}"')
    assert model.system_prompt == "You speak {{JSON}} as {role}"


def test_a_system_prompt_is_for_chat_only(tmp_path: Path) -> None:
    text = refused(tmp_path, 'api = "completions"\nprompt = "{body}"\nsystem_prompt = "s"')
    assert "model.system_prompt is for api = 'chat'" in text


def test_rows_per_request_on_chat_is_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, 'prompt = "{body}"\nrows_per_request = 4')
    assert "model.rows_per_request: a chat request holds one row" in text
    assert openai(tmp_path, 'prompt = "{body}"\nrows_per_request = 1').requests_rows == 1


@pytest.mark.parametrize(("api", "rows"), [("completions", 16), ("embeddings", 64)])
def test_rows_per_request_defaults_and_settings(tmp_path: Path, api: str, rows: int) -> None:
    assert openai(tmp_path, f'api = "{api}"\nprompt = "{{body}}"').requests_rows == rows
    model = openai(tmp_path, f'api = "{api}"\nprompt = "{{body}}"\nrows_per_request = 3')
    assert model.requests_rows == 3


@pytest.mark.parametrize("field", ["max_tokens", "temperature", "model", "response_format"])
def test_sampling_with_a_field_rowbatch_sets_is_refused(tmp_path: Path, field: str) -> None:
    text = refused(tmp_path, f'prompt = "{{body}}"\nsampling = {{ {field} = 5, top_p = 0.9 }}')
    assert "  model.sampling:" in text
    assert f"['{field}'] are set by rowbatch" in text


def test_other_sampling_fields_are_kept(tmp_path: Path) -> None:
    model = openai(
        tmp_path, 'prompt = "{body}"\nsampling = { top_p = 0.9, seed = 7, stop = ["\\n"] }'
    )
    assert model.sampling == {"top_p": 0.9, "seed": 7, "stop": ["\n"]}


def test_api_key_and_api_key_file_together_are_refused(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-file\n")
    text = refused(tmp_path, f'prompt = "{{body}}"\napi_key = "sk-x"\napi_key_file = "{key}"')
    assert "model.api_key and model.api_key_file: set one" in text
    assert "sk-x" not in text


def test_the_api_key_from_a_file_or_the_setting(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("  sk-file\n")
    assert openai(tmp_path, f'prompt = "{{body}}"\napi_key_file = "{key}"').key() == "sk-file"
    model = openai(tmp_path, 'prompt = "{body}"\napi_key = "sk-inline"')
    assert model.key() == "sk-inline"
    assert "sk-inline" not in repr(model)


def test_a_missing_api_key_file_is_named(tmp_path: Path) -> None:
    text = refused(tmp_path, f'prompt = "{{body}}"\napi_key_file = "{tmp_path / "none"}"')
    assert "  model.api_key_file:" in text
    assert "is not a readable file" in text


@pytest.mark.parametrize(
    "schema",
    [
        '{ type = "object" }',
        '{ type = "object", properties = [] }',
        '{ type = "array", properties = { a = { type = "string" } } }',
    ],
)
def test_json_schema_without_object_properties_is_refused(tmp_path: Path, schema: str) -> None:
    text = refused(tmp_path, f'prompt = "{{body}}"\njson_schema = {schema}')
    assert "model.json_schema: an object schema with 'properties'" in text


def test_json_schema_with_properties_parses(tmp_path: Path) -> None:
    model = openai(
        tmp_path,
        'prompt = "{body}"\n'
        'json_schema = { properties = { label = { type = "string" }, n = { type = "integer" } } }',
    )
    assert model.json_schema == {
        "properties": {"label": {"type": "string"}, "n": {"type": "integer"}}
    }


def test_json_schema_is_not_for_embeddings(tmp_path: Path) -> None:
    text = refused(
        tmp_path,
        'api = "embeddings"\nprompt = "{body}"\n'
        'json_schema = { properties = { a = { type = "string" } } }',
    )
    assert "model.json_schema: embeddings have no structured output" in text


def test_max_window_below_max_in_flight_is_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, 'prompt = "{body}"\nmax_in_flight = 8\nmax_window = 4')
    assert "model.max_window must not be below model.max_in_flight" in text
    model = openai(tmp_path, 'prompt = "{body}"\nmax_in_flight = 8\nmax_window = 12')
    assert model.window_ceiling == 12


def test_an_unknown_field_is_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, 'prompt = "{body}"\nversion = "1"')
    assert "model.version" in text


def test_a_prompt_is_required(tmp_path: Path) -> None:
    assert "  model.prompt: Field required" in refused(tmp_path, "")


def test_shared_settings_are_checked_for_openai_too(tmp_path: Path) -> None:
    text = refused(tmp_path, 'prompt = "{body}"\nbackoff_initial_s = 20\nbackoff_max_s = 10')
    assert "model.backoff_initial_s must not exceed model.backoff_max_s" in text


def test_model_without_kind_is_the_oip_section(tmp_path: Path) -> None:
    config = load_config(
        write(
            tmp_path,
            'url = "127.0.0.1:8001"\nname = "scorer"',
            '[binding]\ninputs = { x = "X" }\noutputs = { Y = "y" }\n',
        )
    )
    assert isinstance(config.model, ModelSettings)
    assert config.model.kind == "oip"
    assert config.model.url == "127.0.0.1:8001"
    assert config.binding.inputs == {"x": "X"}


def test_kind_oip_explicitly(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, 'kind = "oip"\nname = "scorer"'))
    assert isinstance(config.model, ModelSettings)


def test_an_oip_error_names_the_field_without_the_tag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, 'name = "scorer"\ntimeout_s = 0'))
    text = str(caught.value)
    assert "  model.timeout_s:" in text
    assert "model.oip" not in text


def test_an_oip_field_under_kind_openai_is_refused(tmp_path: Path) -> None:
    text = refused(tmp_path, 'prompt = "{body}"\nresolve_interval_s = 5')
    assert "model.resolve_interval_s" in text


def test_an_unknown_kind_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, 'kind = "triton"\nname = "m"'))
    assert "model" in str(caught.value)
    assert "triton" in str(caught.value)


def test_the_union_is_what_the_config_declares() -> None:
    # Both kinds are accepted by the one [model] field.
    field = ConsumerConfig.model_fields["model"]
    assert "OpenAISettings" in str(field.annotation)
    assert "ModelSettings" in str(field.annotation)
