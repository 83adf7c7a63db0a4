"""Tensor specs from configuration (``model.inputs`` / ``model.outputs``), for servers whose
ModelConfig and ModelMetadata do not describe the model (KServe's Python model server by
default, an MLServer model without tensors in its model-settings.json, a model that declares no
batch axis).

Rule: when the server describes the model too, both must agree (names, datatypes, dims of every
input and output); a difference stops start-up naming the tensor and both values, since
requests built from a wrong spec would fail or, worse, be misread. The server's spec (with its
batching hints) is then used. When the server does not describe it, the configured one is.
"""

from __future__ import annotations

from dataclasses import dataclass

from rowbatch.consumer.model.spec import SOURCE_NAMES, ModelConfigError, ModelSpec, TensorSpec
from rowbatch.consumer.model.spec_match import tensor_differences


class ConfiguredSpecMismatch(ModelConfigError):
    """``model.inputs`` / ``model.outputs`` differ from what the server reports."""


@dataclass(frozen=True)
class ConfiguredSpec:
    """``model.inputs`` and ``model.outputs``: dims are one row's, without the batch axis."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def spec(self, name: str, version: str = "") -> ModelSpec:
        """A :class:`ModelSpec` of these tensors (``source="configured"``; no
        ``max_batch_size`` known)."""
        return ModelSpec(
            name=name,
            version=version,
            inputs=self.inputs,
            outputs=self.outputs,
            max_batch_size=0,
            source="configured",
        )

    def check_agrees(self, discovered: ModelSpec, server: str) -> None:
        """Raises :class:`ConfiguredSpecMismatch` when ``discovered`` (read from ``server``)
        has other inputs or outputs than these."""
        found = tensor_differences("input", self.inputs, discovered.inputs)
        found += tensor_differences("output", self.outputs, discovered.outputs)
        if found:
            raise ConfiguredSpecMismatch(
                f"model.inputs/model.outputs disagree with model {discovered.name!r} as "
                f"{server} ({discovered.server}) describes it in its "
                f"{SOURCE_NAMES[discovered.source]} (configured vs server): "
                + "; ".join(found)
                + ". Correct them, or remove them to use the server's spec"
            )
