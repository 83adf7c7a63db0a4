"""Model specs from the server's config (as tritonclient's JSON renders it), the target batch
size, the in-flight default and bytes per row (discovery itself: test_discovery.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from rowbatch.consumer.model.discovery import (
    DEFAULT_BYTES_ESTIMATE,
    input_bytes_per_row,
    output_bytes_per_row,
    spec_from_config,
)
from rowbatch.consumer.model.server_kind import default_in_flight, target_batch_size
from rowbatch.consumer.model.spec import ModelConfigError, ModelSpec, TensorSpec

# What tritonclient 2.73 returns for deploy/models/scorer (64-bit numbers as strings).
SCORER_CONFIG: dict[str, Any] = {
    "name": "scorer",
    "platform": "",
    "backend": "python",
    "version_policy": {"latest": {"num_versions": 1}},
    "max_batch_size": 512,
    "input": [
        {"name": "FEATURES", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": ["16"]},
        {"name": "COUNT", "data_type": "TYPE_INT64", "dims": ["1"]},
    ],
    "output": [
        {"name": "SCORE", "data_type": "TYPE_FP32", "dims": ["1"]},
        {"name": "LABEL", "data_type": "TYPE_INT32", "dims": ["1"]},
    ],
    "dynamic_batching": {
        "preferred_batch_size": [256],
        "max_queue_delay_microseconds": "1000",
        "default_queue_policy": {"max_queue_size": 2048},
    },
    "instance_group": [
        {"name": "scorer_0", "kind": "KIND_CPU", "count": 1},
        {"name": "scorer_1", "kind": "KIND_GPU", "count": 2, "gpus": [0]},
    ],
}

EMBEDDER = ModelSpec(
    name="embedder",
    version="1",
    inputs=(TensorSpec("TEXT", "BYTES", (1,)),),
    outputs=(TensorSpec("EMBEDDING", "FP32", (384,)),),
    max_batch_size=256,
    preferred_batch_sizes=(64, 128),
)


def test_spec_from_config() -> None:
    spec = spec_from_config(SCORER_CONFIG, "3")
    assert spec == ModelSpec(
        name="scorer",
        version="3",
        inputs=(TensorSpec("FEATURES", "FP32", (16,)), TensorSpec("COUNT", "INT64", (1,))),
        outputs=(TensorSpec("SCORE", "FP32", (1,)), TensorSpec("LABEL", "INT32", (1,))),
        max_batch_size=512,
        preferred_batch_sizes=(256,),
        instance_count=3,
    )


def test_spec_from_minimal_config_defaults() -> None:
    # Zero/default fields are omitted: no max_batch_size, no batching, no instance groups,
    # an instance group without count (means 1), TYPE_STRING is BYTES, dims missing = [].
    config = {
        "name": "m",
        "input": [{"name": "T", "data_type": "TYPE_STRING", "dims": ["-1", "1"]}],
        "output": [{"name": "O", "data_type": "TYPE_BOOL"}],
    }
    spec = spec_from_config(config)
    assert spec.max_batch_size == 0
    assert spec.preferred_batch_sizes == ()
    assert spec.instance_count == 1
    # A non-batching model's first dim is its row axis.
    assert spec.inputs == (TensorSpec("T", "BYTES", (1,)),)
    assert spec.outputs == (TensorSpec("O", "BOOL", ()),)
    grouped = spec_from_config({**config, "instance_group": [{"kind": "KIND_CPU"}]})
    assert grouped.instance_count == 1


def test_tensor_spec_str_and_lookup() -> None:
    assert str(EMBEDDER.inputs[0]) == "TEXT (BYTES [1])"
    assert EMBEDDER.input("TEXT") is EMBEDDER.inputs[0]
    assert EMBEDDER.input("EMBEDDING") is None
    assert EMBEDDER.output("EMBEDDING") is EMBEDDER.outputs[0]


def test_target_batch_size() -> None:
    assert target_batch_size(EMBEDDER, None) == 128
    assert target_batch_size(spec_from_config(SCORER_CONFIG)) == 256
    no_preferred = ModelSpec("m", "", EMBEDDER.inputs, EMBEDDER.outputs, 32)
    assert target_batch_size(no_preferred) == 32
    assert target_batch_size(EMBEDDER, 200) == 200
    assert target_batch_size(EMBEDDER, 256) == 256
    with pytest.raises(ModelConfigError, match=r"exceeds .* max_batch_size 256"):
        target_batch_size(EMBEDDER, 257)
    with pytest.raises(ModelConfigError, match=">= 1"):
        target_batch_size(EMBEDDER, 0)
    unbatched = ModelSpec("m", "", EMBEDDER.inputs, EMBEDDER.outputs, 0)
    with pytest.raises(ModelConfigError, match="configure batch_size"):
        target_batch_size(unbatched)
    assert target_batch_size(unbatched, 1000) == 1000  # no max to exceed


def test_bytes_per_row() -> None:
    scorer = spec_from_config(SCORER_CONFIG)
    assert input_bytes_per_row(scorer) == 16 * 4 + 8
    assert output_bytes_per_row(scorer) == 4 + 4
    assert output_bytes_per_row(EMBEDDER) == 384 * 4
    assert input_bytes_per_row(EMBEDDER) == DEFAULT_BYTES_ESTIMATE
    assert input_bytes_per_row(EMBEDDER, bytes_estimate=100) == 100
    variable = ModelSpec(
        "v", "", (TensorSpec("X", "FP16", (-1, 3)),), (TensorSpec("Y", "BYTES", (2, -1)),), 8
    )
    assert input_bytes_per_row(variable) == 2 * 3
    assert input_bytes_per_row(variable, variable_dim_estimate=10) == 10 * 3 * 2
    assert output_bytes_per_row(variable, bytes_estimate=5, variable_dim_estimate=4) == 2 * 4 * 5
    unknown = ModelSpec("u", "", (TensorSpec("X", "WEIRD", (1,)),), (), 8)
    with pytest.raises(ModelConfigError, match="WEIRD"):
        input_bytes_per_row(unknown)


@pytest.mark.parametrize(
    ("max_batch", "preferred", "instances", "want"),
    [
        (256, (64, 128), 1, 4),  # embedder: two merged executions of 256 in 128-row requests
        (512, (256,), 1, 4),  # scorer
        (256, (256,), 1, 2),  # requests already as large as an execution: the floor
        (256, (256,), 3, 6),
        (1000, (128,), 1, 16),  # 2 x ceil(1000 / 128)
        (0, (), 1, 2),  # no batching (batch_size configured): the floor
    ],
)
def test_default_in_flight_keeps_one_merged_execution_queued_behind_the_running_one(
    max_batch: int, preferred: tuple[int, ...], instances: int, want: int
) -> None:
    spec = dataclasses.replace(
        EMBEDDER,
        max_batch_size=max_batch,
        preferred_batch_sizes=preferred,
        instance_count=instances,
    )
    target = target_batch_size(spec, None if max_batch else 8)
    assert default_in_flight(spec, target) == want
