"""The model's interface as the consumer sees it: :class:`TensorSpec` (one input or output),
:class:`ModelSpec` (the model, its batching hints and where the spec came from), and the KServe
v2 datatypes with their element sizes. Discovery (:mod:`rowbatch.consumer.model.discovery`) builds
them from the server or from configuration."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

#: Bytes of one element, per KServe v2 datatype (BYTES is variable: see ``bytes_estimate``).
DTYPE_SIZES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "BOOL": 1,
        "UINT8": 1,
        "INT8": 1,
        "UINT16": 2,
        "INT16": 2,
        "FP16": 2,
        "BF16": 2,
        "UINT32": 4,
        "INT32": 4,
        "FP32": 4,
        "UINT64": 8,
        "INT64": 8,
        "FP64": 8,
    }
)

#: Every KServe v2 datatype the consumer can send or receive.
DATATYPES: Final[frozenset[str]] = frozenset({*DTYPE_SIZES, "BYTES"})

SpecSource = Literal["model_config", "model_metadata", "configured"]
"""Where a :class:`ModelSpec` came from: the server's ``ModelConfig`` RPC (Triton), its
``ModelMetadata`` RPC (any Open Inference Protocol server), or ``model.inputs`` /
``model.outputs`` in the configuration."""

#: How ``rowbatch-consumer check`` and the logs name each :data:`SpecSource`.
SOURCE_NAMES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "model_config": "ModelConfig",
        "model_metadata": "ModelMetadata",
        "configured": "configuration (model.inputs/model.outputs)",
    }
)


class ModelConfigError(ValueError):
    """A model config or a configured override that the consumer cannot work with."""


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as the client sees it."""

    name: str
    datatype: str
    """KServe v2 datatype: ``FP32``, ``INT64``, ``BYTES``, ``BOOL``..."""
    dims: tuple[int, ...]
    """Shape of one row, without the batch dimension; ``-1`` marks a variable dimension."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dims", tuple(int(d) for d in self.dims))

    def __str__(self) -> str:
        return f"{self.name} ({self.datatype} {list(self.dims)})"


@dataclass(frozen=True)
class ModelSpec:
    """A model's interface and batching hints, from the server or from configuration."""

    name: str
    version: str
    """The version requests go to and results are labelled with; ``""`` lets the server pick
    (results then carry the version each response names)."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    """From ModelConfig: 0 means the model does not batch (its config's first dim is then taken
    as the row axis). From metadata or configuration: 0, not known."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """``dynamic_batching.preferred_batch_size`` in config order; empty when not set."""
    instance_count: int = 1
    """Model instances the server runs (sum of ``instance_group`` counts)."""
    source: SpecSource = "model_config"
    """Where the inputs and outputs came from."""
    server_name: str = field(default="", compare=False)
    """The server's own name from its ServerMetadata (``triton``, ``mlserver``, ``kserve``);
    ``""`` when it did not say. Like ``server_version``, not part of equality: the same model
    on two servers has equal specs."""
    server_version: str = field(default="", compare=False)
    """The server's version from its ServerMetadata."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "preferred_batch_sizes", tuple(self.preferred_batch_sizes))

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    @property
    def server(self) -> str:
        """The server as ``name version`` (``"mlserver 1.7.1"``), or ``"unknown server"``."""
        return " ".join(p for p in (self.server_name, self.server_version) if p) or (
            "unknown server"
        )
