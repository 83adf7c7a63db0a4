"""Model discovery against fakes of ``tritonclient.grpc.aio.InferenceServerClient`` that answer
in tritonclient's JSON form (``as_json=True``: int64 numbers as strings, empty fields left
out): Triton's ModelConfig path
as before, ModelMetadata where ModelConfig is UNIMPLEMENTED (MLServer, KServe), configured
tensor specs where the metadata does not describe the model, and the errors of each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import pytest
from tritonclient.utils import InferenceServerException

from rowbatch.consumer.model.configured_spec import ConfiguredSpec, ConfiguredSpecMismatch
from rowbatch.consumer.model.discovery import (
    ModelConfigUnavailable,
    ModelDiscoveryError,
    ModelNotFound,
    ModelServerUnavailable,
    discover_model,
)
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec
from tests.unit.consumer.model.test_discovery_spec import SCORER_CONFIG

Answer: TypeAlias = dict[str, Any] | InferenceServerException

TRITON = {"name": "triton", "version": "2.59.0", "extensions": ["classification"]}
MLSERVER = {"name": "mlserver", "version": "1.7.1"}
KSERVE = {"name": "kserve", "version": "0.21.0", "extensions": ["model_repository_extension"]}

SCORER_INPUTS = (TensorSpec("FEATURES", "FP32", (16,)), TensorSpec("COUNT", "INT64", (1,)))
SCORER_OUTPUTS = (TensorSpec("SCORE", "FP32", (1,)), TensorSpec("LABEL", "INT32", (1,)))
CONFIGURED = ConfiguredSpec(SCORER_INPUTS, SCORER_OUTPUTS)


def error(status: str, message: str = "boom") -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


def metadata(
    inputs: Sequence[tuple[str, str, Sequence[int]]],
    outputs: Sequence[tuple[str, str, Sequence[int]]],
    *,
    name: str = "scorer",
    versions: Sequence[str] = (),
) -> dict[str, Any]:
    """A ModelMetadata answer as tritonclient's ``as_json=True`` renders it (int64 shapes as
    strings, empty lists left out)."""

    def tensors(specs: Sequence[tuple[str, str, Sequence[int]]]) -> list[dict[str, Any]]:
        return [
            {"name": n, "datatype": d, **({"shape": [str(x) for x in s]} if s else {})}
            for n, d, s in specs
        ]

    answer: dict[str, Any] = {"name": name}
    for key, value in (
        ("versions", list(versions)),
        ("inputs", tensors(inputs)),
        ("outputs", tensors(outputs)),
    ):
        if value:
            answer[key] = value
    return answer


#: MLServer 1.7.1 serving the scorer formula with its tensors in model-settings.json.
SCORER_METADATA = metadata(
    [("FEATURES", "FP32", (-1, 16)), ("COUNT", "INT64", (-1, 1))],
    [("SCORE", "FP32", (-1, 1)), ("LABEL", "INT32", (-1, 1))],
)
METHOD_NOT_FOUND = error("UNIMPLEMENTED", "Method not found!")


class FakeServer:
    """Answers the discovery RPCs like tritonclient.grpc.aio, from fixed answers (a JSON dict,
    or an exception to raise); records each call."""

    def __init__(
        self,
        *,
        config: Answer | None = None,
        metadata: Answer | None = None,
        server: Answer | None = None,
    ) -> None:
        self.config = config if config is not None else METHOD_NOT_FOUND
        self.metadata = metadata if metadata is not None else {}
        self.server = server if server is not None else MLSERVER
        self.calls: list[tuple[str, ...]] = []

    @staticmethod
    def _answer(answer: Answer) -> dict[str, Any]:
        if isinstance(answer, InferenceServerException):
            raise answer
        return answer

    async def get_model_config(
        self,
        model_name: str,
        model_version: str = "",
        *,
        as_json: bool,
        client_timeout: float | None,
    ) -> dict[str, Any]:
        assert as_json
        self.calls.append(("config", model_name, model_version))
        return {"config": self._answer(self.config)}

    async def get_model_metadata(
        self,
        model_name: str,
        model_version: str = "",
        *,
        as_json: bool,
        client_timeout: float | None,
    ) -> dict[str, Any]:
        assert as_json
        self.calls.append(("metadata", model_name, model_version))
        return self._answer(self.metadata)

    async def get_server_metadata(
        self, *, as_json: bool, client_timeout: float | None
    ) -> dict[str, Any]:
        assert as_json
        self.calls.append(("server",))
        return self._answer(self.server)


def triton(config: dict[str, Any] | InferenceServerException, **kwargs: Any) -> FakeServer:
    return FakeServer(config=config, server=kwargs.pop("server", TRITON), **kwargs)


# --- ModelConfig (Triton): as before -----------------------------------------------------------


async def test_model_config_spec_with_the_latest_version_and_the_server() -> None:
    client = triton(SCORER_CONFIG, metadata={"name": "scorer", "versions": ["2", "10", "3"]})
    spec = await discover_model(client, "scorer")
    assert spec == ModelSpec(
        "scorer",
        "10",
        SCORER_INPUTS,
        SCORER_OUTPUTS,
        512,
        (256,),
        3,
        source="model_config",
        server_name="triton",
        server_version="2.59.0",
    )
    assert (spec.server_name, spec.server_version, spec.server) == (
        "triton",
        "2.59.0",
        "triton 2.59.0",
    )
    assert client.calls == [("config", "scorer", ""), ("metadata", "scorer", ""), ("server",)]
    assert (await discover_model(client, "scorer", "2")).version == "2"


async def test_model_config_without_metadata_keeps_an_empty_version() -> None:
    spec = await discover_model(triton(SCORER_CONFIG, metadata=error("UNIMPLEMENTED")), "s")
    assert (spec.version, spec.name) == ("", "scorer")
    unnamed = {k: v for k, v in SCORER_CONFIG.items() if k != "name"}
    assert (await discover_model(triton(unnamed), "mine")).name == "mine"


@pytest.mark.parametrize(
    ("status", "exc_type", "words"),
    [
        ("NOT_FOUND", ModelNotFound, ["does not serve model 'nope'", "grpc://h:1"]),
        ("UNAVAILABLE", ModelServerUnavailable, ["cannot reach", "grpc://h:1", "config"]),
        ("DEADLINE_EXCEEDED", ModelServerUnavailable, ["cannot reach", "DEADLINE_EXCEEDED"]),
        ("INTERNAL", ModelDiscoveryError, ["INTERNAL", "boom", "config of model 'nope'"]),
    ],
)
async def test_model_config_errors(
    status: str, exc_type: type[Exception], words: list[str]
) -> None:
    client = triton(error(status))
    with pytest.raises(exc_type) as caught:
        await discover_model(client, "nope", server="grpc://h:1")
    for word in words:
        assert word in str(caught.value)
    assert [c[0] for c in client.calls] == ["config"]  # nothing else asked


async def test_model_config_without_tensors_is_refused() -> None:
    with pytest.raises(ModelDiscoveryError, match="without inputs or outputs"):
        await discover_model(triton({"name": "x", "max_batch_size": 8}), "x")


async def test_server_metadata_is_optional_but_an_unreachable_server_is_not() -> None:
    spec = await discover_model(triton(SCORER_CONFIG, server=error("UNIMPLEMENTED")), "scorer")
    assert (spec.server_name, spec.server_version, spec.server) == ("", "", "unknown server")
    with pytest.raises(ModelServerUnavailable, match="cannot reach h:1"):
        await discover_model(triton(SCORER_CONFIG, server=error("UNAVAILABLE")), "s", server="h:1")


# --- ModelMetadata (MLServer, KServe) ----------------------------------------------------------


async def test_metadata_where_model_config_is_unimplemented() -> None:
    client = FakeServer(metadata=SCORER_METADATA)
    spec = await discover_model(client, "scorer", server="inference server h:1")
    assert spec == ModelSpec(
        "scorer",
        "",  # MLServer lists no versions: the responses name it
        SCORER_INPUTS,
        SCORER_OUTPUTS,
        0,
        source="model_metadata",
        server_name="mlserver",
        server_version="1.7.1",
    )
    assert spec.server == "mlserver 1.7.1"
    assert client.calls == [("config", "scorer", ""), ("metadata", "scorer", ""), ("server",)]


async def test_metadata_versions_and_the_requested_version() -> None:
    listed = metadata([("X", "BYTES", (-1,))], [("Y", "FP64", (-1, 3, -1))], versions=["1", "7"])
    spec = await discover_model(FakeServer(metadata=listed), "scorer")
    assert spec.version == "7"
    assert spec.inputs == (TensorSpec("X", "BYTES", ()),)  # one value per row
    assert spec.outputs == (TensorSpec("Y", "FP64", (3, -1)),)
    client = FakeServer(metadata=listed)
    assert (await discover_model(client, "scorer", "1")).version == "1"
    assert ("metadata", "scorer", "1") in client.calls


async def test_a_model_the_server_does_not_serve_is_named() -> None:
    client = FakeServer(metadata=error("NOT_FOUND", "Model nope not found"))
    with pytest.raises(ModelNotFound) as caught:
        await discover_model(client, "nope", server="inference server h:1", configured=CONFIGURED)
    assert str(caught.value) == (
        "inference server h:1 does not serve model 'nope': Model nope not found"
    )


async def test_metadata_of_an_unreachable_server_waits_like_the_config() -> None:
    client = FakeServer(metadata=error("UNAVAILABLE", "connection refused"))
    with pytest.raises(ModelServerUnavailable, match="cannot reach h:1 to read the metadata"):
        await discover_model(client, "scorer", server="h:1")


async def test_metadata_without_a_batch_axis_says_so_and_points_at_the_config() -> None:
    no_axis = metadata([("FEATURES", "FP32", (1, 16))], [("SCORE", "FP32", (-1, 1))])
    with pytest.raises(ModelConfigUnavailable) as caught:
        await discover_model(FakeServer(metadata=no_axis), "scorer", server="h:1")
    text = str(caught.value)
    for words in (
        "h:1 has no ModelConfig RPC (Method not found!)",
        "input FEATURES has shape [1, 16], without a leading -1",
        "declares no batch axis",
        "model.inputs and model.outputs",
        "[[model.inputs]]",
    ):
        assert words in text


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"name": "scorer"}, "it lists no inputs; it lists no outputs"),  # KServe's default
        (metadata([("F", "FP32", (-1, 2))], []), "it lists no outputs"),  # MLServer, no outputs
        (metadata([("F", "FP32", ())], [("S", "FP32", (-1,))]), "input F has shape []"),
        (metadata([("F", "FP32", (-1,))], [("S", "STRING", (-1,))]), "datatype 'STRING'"),
        (metadata([("", "FP32", (-1,))], [("S", "FP32", (-1,))]), "an input has no name"),
        (error("INTERNAL", "kaput"), "its ModelMetadata RPC failed (INTERNAL: kaput)"),
    ],
)
async def test_metadata_that_does_not_describe_the_model(
    answer: dict[str, Any] | InferenceServerException, problem: str
) -> None:
    with pytest.raises(ModelConfigUnavailable) as caught:
        await discover_model(FakeServer(metadata=answer, server=KSERVE), "scorer")
    assert problem in str(caught.value)
    assert "configure the tensor specs yourself" in str(caught.value)
    configured = await discover_model(
        FakeServer(metadata=answer, server=KSERVE), "scorer", configured=CONFIGURED
    )
    assert configured == ModelSpec(
        "scorer",
        "",
        SCORER_INPUTS,
        SCORER_OUTPUTS,
        0,
        source="configured",
    )
    assert configured.server == "kserve 0.21.0"


# --- configured specs against the server's -----------------------------------------------------


async def test_configured_specs_that_agree_keep_the_server_spec() -> None:
    spec = await discover_model(FakeServer(metadata=SCORER_METADATA), "s", configured=CONFIGURED)
    assert spec.source == "model_metadata"
    spec = await discover_model(triton(SCORER_CONFIG), "s", configured=CONFIGURED)
    assert (spec.source, spec.max_batch_size) == ("model_config", 512)


async def test_configured_specs_that_differ_from_the_metadata_stop_start_up() -> None:
    wrong = ConfiguredSpec(
        (TensorSpec("FEATURES", "FP32", (8,)), TensorSpec("COUNT", "INT64", (1,))),
        (TensorSpec("SCORE", "FP64", (1,)), TensorSpec("EXTRA", "INT32", (1,))),
    )
    with pytest.raises(ConfiguredSpecMismatch) as caught:
        await discover_model(
            FakeServer(metadata=SCORER_METADATA), "scorer", server="h:1", configured=wrong
        )
    assert str(caught.value) == (
        "model.inputs/model.outputs disagree with model 'scorer' as h:1 (mlserver 1.7.1) "
        "describes it in its ModelMetadata (configured vs server): "
        "input FEATURES: FEATURES (FP32 [8]) vs FEATURES (FP32 [16]); "
        "output SCORE: SCORE (FP64 [1]) vs SCORE (FP32 [1]); "
        "output EXTRA: EXTRA (INT32 [1]) vs absent; "
        "output LABEL: absent vs LABEL (INT32 [1]). "
        "Correct them, or remove them to use the server's spec"
    )


async def test_configured_specs_that_differ_from_the_model_config_stop_start_up() -> None:
    wrong = ConfiguredSpec(SCORER_INPUTS[:1], SCORER_OUTPUTS)
    with pytest.raises(ConfiguredSpecMismatch, match=r"triton 2\.59\.0.*its ModelConfig.*COUNT"):
        await discover_model(triton(SCORER_CONFIG), "scorer", configured=wrong)
