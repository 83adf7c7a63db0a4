"""Defaults per server kind (batch size, requests in flight), what ``check`` says about them,
and the comparison of several endpoints' specs when they come from ModelMetadata."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from rowbatch.consumer.model.server_kind import (
    DEFAULT_BATCH_SIZE,
    OTHER,
    default_in_flight,
    describe_defaults,
    server_kind,
    target_batch_size,
)
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.spec import ModelConfigError, ModelSpec, SpecSource
from rowbatch.consumer.model.spec_match import EndpointSpecMismatch, same_spec
from rowbatch.consumer.service.build_model import (
    describe_batching,
    describe_origin,
    per_endpoint_limit,
)
from tests.unit.consumer.model.test_discovery import SCORER_INPUTS, SCORER_OUTPUTS

TRITON_SPEC = ModelSpec(
    "scorer", "1", SCORER_INPUTS, SCORER_OUTPUTS, 512, (256,), 1, "model_config", "triton", "2.59"
)


def served_by(name: str, source: SpecSource = "model_metadata", version: str = "") -> ModelSpec:
    return ModelSpec(
        "scorer",
        "",
        SCORER_INPUTS,
        SCORER_OUTPUTS,
        0,
        source=source,
        server_name=name,
        server_version=version,
    )


@pytest.mark.parametrize(
    ("name", "kind", "in_flight"),
    [
        ("mlserver", "mlserver", 8),
        ("MLServer", "mlserver", 8),
        ("kserve", "kserve", 4),
        ("triton", "triton", 4),  # a Triton spec from ModelMetadata: the table's default
        ("someserver", "other", 4),
        ("", "other", 4),
    ],
)
def test_defaults_per_server_kind(name: str, kind: str, in_flight: int) -> None:
    assert server_kind(name).name == kind
    spec = served_by(name)
    assert target_batch_size(spec) == DEFAULT_BATCH_SIZE == 256
    assert default_in_flight(spec, 256) == in_flight
    assert default_in_flight(dataclasses.replace(spec, source="configured"), 64) == in_flight
    assert server_kind(name).batches_requests == (kind in ("mlserver", "triton"))
    assert OTHER.in_flight == 4


def test_model_config_specs_keep_triton_defaults_whatever_the_server_name() -> None:
    assert target_batch_size(TRITON_SPEC) == 256
    assert default_in_flight(TRITON_SPEC, 256) == 4  # 2 x ceil(512 / 256)
    unnamed = dataclasses.replace(TRITON_SPEC, server_name="")
    assert default_in_flight(unnamed, 256) == 4
    unbatched = dataclasses.replace(TRITON_SPEC, max_batch_size=0, preferred_batch_sizes=())
    with pytest.raises(ModelConfigError, match="configure batch_size"):
        target_batch_size(unbatched)


def test_batch_size_override_without_a_known_maximum() -> None:
    spec = served_by("mlserver")
    assert target_batch_size(spec, 4096) == 4096  # nothing to exceed
    with pytest.raises(ModelConfigError, match=">= 1"):
        target_batch_size(spec, 0)


def test_describe_defaults_names_where_each_number_comes_from() -> None:
    assert describe_defaults(served_by("mlserver"), None, None) == (
        "batch size 256 (default without ModelConfig); 8 in flight per server "
        "(default for mlserver)"
    )
    assert describe_defaults(served_by("kserve"), 100, 3) == (
        "batch size 100 (model.batch_size); 3 in flight per server (model.max_in_flight)"
    )
    assert describe_defaults(TRITON_SPEC, None, None) == (
        "batch size 256 (largest preferred batch size); 4 in flight per server "
        "(from the model config)"
    )
    no_preferred = dataclasses.replace(TRITON_SPEC, preferred_batch_sizes=())
    assert describe_defaults(no_preferred, None, None).startswith("batch size 512 (max_batch_size)")


def test_check_output_names_the_server_and_the_spec_source() -> None:
    settings = ModelSettings(name="scorer")
    assert describe_origin(TRITON_SPEC) == "server triton 2.59; spec from its ModelConfig"
    mlserver = served_by("mlserver", version="1.7.1")
    assert describe_origin(mlserver) == "server mlserver 1.7.1; spec from its ModelMetadata"
    assert describe_origin(served_by("", "configured")) == (
        "server unknown server; spec from configuration (model.inputs/model.outputs)"
    )
    assert describe_batching(mlserver, settings).endswith(
        "8 in flight per server (default for mlserver)"
    )


def test_per_endpoint_limit_follows_each_endpoints_kind() -> None:
    limit = per_endpoint_limit(ModelSettings(name="scorer"), 256)
    assert [limit(s) for s in (served_by("mlserver"), served_by("kserve"), TRITON_SPEC)] == [
        8,
        4,
        4,
    ]
    assert (
        per_endpoint_limit(ModelSettings(name="scorer", max_in_flight=2), 256)(
            served_by("mlserver")
        )
        == 2
    )


def test_endpoints_serving_metadata_specs_are_compared_by_tensors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = served_by("mlserver", version="1.7.1"), served_by("mlserver", version="1.7.1")
    assert same_spec({"a:1": a, "b:2": b}) is a
    other_dims = dataclasses.replace(
        b, inputs=(dataclasses.replace(SCORER_INPUTS[0], dims=(8,)), SCORER_INPUTS[1])
    )
    with pytest.raises(EndpointSpecMismatch, match=r"input FEATURES: .*\[16\].* vs .*\[8\]"):
        same_spec({"a:1": a, "b:2": other_dims})
    # A Triton endpoint and an MLServer one with the same tensors: the unknown max_batch_size
    # of the metadata spec is not a difference; the mix is logged.
    with caplog.at_level(logging.WARNING, logger="rowbatch.consumer.model.spec_match"):
        assert same_spec({"t:1": TRITON_SPEC, "m:2": a}) is TRITON_SPEC
    assert "triton 2.59 (spec from model_config) and mlserver 1.7.1" in caplog.text
    # Two Triton endpoints still compare max_batch_size.
    with pytest.raises(EndpointSpecMismatch, match="max_batch_size: 512 vs 64"):
        same_spec({"t:1": TRITON_SPEC, "t:2": dataclasses.replace(TRITON_SPEC, max_batch_size=64)})
