"""``model.inputs`` / ``model.outputs``: read from TOML tables and from a JSON list in the
environment, validated with errors naming the field, and turned into tensor specs."""

from __future__ import annotations

from pathlib import Path

import pytest

from rowbatch.consumer.model.configured_spec import ConfiguredSpec
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import TensorSpec
from rowbatch.consumer.service.config import ConfigError, load_config

BASE = """
[source]
kind = "kafka"
bootstrap_servers = "127.0.0.1:9092"
topic = "rows"
group_id = "g"

[model]
url = "127.0.0.1:8081"
name = "scorer"

[binding]
inputs = { features = "FEATURES" }
outputs = { SCORE = "score" }
"""

TENSORS = """
[[model.inputs]]
name = "FEATURES"
datatype = "FP32"
dims = [16]

[[model.inputs]]
name = "TEXT"
datatype = "BYTES"
dims = [-1]

[[model.outputs]]
name = "SCORE"
datatype = "FP32"
dims = []
"""


def config_with(tmp_path: Path, tensors: str) -> Path:
    path = tmp_path / "consumer.toml"
    path.write_text(BASE + tensors)  # [[model.inputs]] tables may follow [binding]
    return path


def test_tensor_tables_become_the_configured_spec(tmp_path: Path) -> None:
    config = load_config(config_with(tmp_path, TENSORS))
    assert isinstance(config.model, ModelSettings)
    assert config.model.configured_spec() == ConfiguredSpec(
        (TensorSpec("FEATURES", "FP32", (16,)), TensorSpec("TEXT", "BYTES", (-1,))),
        (TensorSpec("SCORE", "FP32", ()),),
    )


def test_without_tensors_nothing_is_configured(tmp_path: Path) -> None:
    config = load_config(config_with(tmp_path, ""))
    assert isinstance(config.model, ModelSettings)
    assert (config.model.inputs, config.model.outputs) == (None, None)
    assert config.model.configured_spec() is None


def test_tensors_from_the_environment_as_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "ROWBATCH_MODEL__INPUTS", '[{"name": "FEATURES", "datatype": "FP32", "dims": [16]}]'
    )
    monkeypatch.setenv(
        "ROWBATCH_MODEL__OUTPUTS", '[{"name": "SCORE", "datatype": "FP32", "dims": [1]}]'
    )
    model = load_config(config_with(tmp_path, "")).model
    assert isinstance(model, ModelSettings)
    spec = model.configured_spec()
    assert spec == ConfiguredSpec(
        (TensorSpec("FEATURES", "FP32", (16,)),), (TensorSpec("SCORE", "FP32", (1,)),)
    )


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            ('datatype = "FP32"\ndims = [16]', 'datatype = "FLOAT"\ndims = [16]'),
            [
                "model.inputs.0.datatype",
                "unknown datatype 'FLOAT'",
                "BYTES",
                "FP32",
            ],
        ),
        (
            ('datatype = "FP32"\ndims = [16]', 'datatype = "fp32"\ndims = [16]'),
            [
                "model.inputs.0.datatype",
                "upper case",
            ],
        ),
        (("dims = [16]", "dims = [0]"), ["model.inputs.0.dims", "0 is not a dimension"]),
        (("dims = [16]", "dims = [-2, 3]"), ["model.inputs.0.dims", "-2 is not a dimension"]),
        (("dims = [16]", 'dims = ["x"]'), ["model.inputs.0.dims"]),
        (('name = "TEXT"', 'name = ""'), ["model.inputs.1.name", "at least 1 character"]),
        (
            ('name = "TEXT"', 'name = "FEATURES"'),
            [
                "model.inputs",
                "['FEATURES'] appear more than once",
            ],
        ),
        (("dims = []", "dims = []\nshape = [1]"), ["model.outputs.0.shape", "Extra inputs"]),
        (('name = "SCORE"\n', ""), ["model.outputs.0.name", "Field required"]),
    ],
)
def test_bad_tensors_are_named(tmp_path: Path, change: tuple[str, str], words: list[str]) -> None:
    old, new = change
    assert old in TENSORS
    with pytest.raises(ConfigError) as caught:
        load_config(config_with(tmp_path, TENSORS.replace(old, new, 1)))
    for word in words:
        assert word in str(caught.value)


def test_inputs_and_outputs_go_together(tmp_path: Path) -> None:
    only_inputs = TENSORS[: TENSORS.index("[[model.outputs]]")]
    with pytest.raises(ConfigError, match=r"model\.inputs is set but model\.outputs is not"):
        load_config(config_with(tmp_path, only_inputs))
    only_outputs = TENSORS[TENSORS.index("[[model.outputs]]") :]
    with pytest.raises(ConfigError, match=r"model\.outputs is set but model\.inputs is not"):
        load_config(config_with(tmp_path, only_outputs))


def test_empty_lists_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROWBATCH_MODEL__INPUTS", "[]")
    monkeypatch.setenv("ROWBATCH_MODEL__OUTPUTS", "[]")
    with pytest.raises(ConfigError) as caught:
        load_config(config_with(tmp_path, ""))
    assert "model.inputs: Value error, is empty" in str(caught.value)
    assert "model.outputs: Value error, is empty" in str(caught.value)
