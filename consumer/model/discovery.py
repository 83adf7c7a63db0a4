"""What the consumer knows about the model it calls: tensor and model specs, discovered from the
server's model config (KServe v2 ``ModelConfig`` RPC, Triton's extension), the batch size to
aim for, and the bytes one row costs (for the in-flight memory budget).

Servers without the ``ModelConfig`` RPC (MLServer answers UNIMPLEMENTED) raise
:class:`ModelConfigUnavailable`; for those, configure ``batch_size`` and build a
:class:`ModelSpec` from configured tensor specs instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from tritonclient.utils import InferenceServerException

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

#: Default guess for one BYTES element (4-byte length prefix included), for byte budgets.
DEFAULT_BYTES_ESTIMATE: Final = 256
#: Default guess for a variable (``-1``) dimension, for byte budgets.
DEFAULT_VARIABLE_DIM_ESTIMATE: Final = 1


class ModelDiscoveryError(RuntimeError):
    """The model's spec could not be read from the server."""


class ModelConfigUnavailable(ModelDiscoveryError):
    """The server has no ModelConfig RPC (e.g. MLServer): configure the spec yourself."""


class ModelNotFound(ModelDiscoveryError):
    """The server does not serve the named model (or version)."""


class ModelServerUnavailable(ModelDiscoveryError):
    """The server could not be reached (down, wrong address, not ready)."""


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
    """A model's interface and batching hints, from the server's config or from configuration."""

    name: str
    version: str
    """The version requests go to; ``""`` lets the server pick (the latest ready one)."""
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int
    """0: the model does not batch; its config's first dim is then taken as the row axis."""
    preferred_batch_sizes: tuple[int, ...] = ()
    """``dynamic_batching.preferred_batch_size`` in config order; empty when not set."""
    instance_count: int = 1
    """Model instances the server runs (sum of ``instance_group`` counts)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "preferred_batch_sizes", tuple(self.preferred_batch_sizes))

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)


# --- discovery -------------------------------------------------------------------------------


def _status(exc: InferenceServerException) -> str:
    return str(exc.status() or "").removeprefix("StatusCode.")


def _datatype(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES`` (the KServe v2 name)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _tensor(raw: Mapping[str, Any], batching: bool) -> TensorSpec:
    dims = tuple(int(d) for d in raw.get("dims", ()))
    if not batching and dims:
        dims = dims[1:]  # a non-batching model's first dim is the row axis
    return TensorSpec(raw["name"], _datatype(raw.get("data_type", "TYPE_INVALID")), dims)


def spec_from_config(config: Mapping[str, Any], version: str = "") -> ModelSpec:
    """A :class:`ModelSpec` from the JSON form of Triton's ``ModelConfig`` message (numbers may
    be strings; zero and default fields may be absent)."""
    max_batch_size = int(config.get("max_batch_size") or 0)
    batching = max_batch_size > 0
    dynamic = config.get("dynamic_batching") or {}
    preferred = tuple(int(n) for n in dynamic.get("preferred_batch_size", ()))
    groups = config.get("instance_group") or ()
    instance_count = sum(int(g.get("count") or 1) for g in groups) if groups else 1
    return ModelSpec(
        name=str(config.get("name", "")),
        version=version,
        inputs=tuple(_tensor(t, batching) for t in config.get("input", ())),
        outputs=tuple(_tensor(t, batching) for t in config.get("output", ())),
        max_batch_size=max_batch_size,
        preferred_batch_sizes=preferred,
        instance_count=instance_count,
    )


async def discover_model(
    client: Any,
    name: str,
    version: str = "",
    *,
    server: str = "the inference server",
    client_timeout: float | None = 30.0,
) -> ModelSpec:
    """Reads ``name``'s config from the server behind ``client`` (a
    ``tritonclient.grpc.aio.InferenceServerClient``). ``server`` (its URL) names it in errors.

    Raises :class:`ModelConfigUnavailable` (no ModelConfig RPC), :class:`ModelNotFound`, or
    :class:`ModelServerUnavailable`; other server errors as :class:`ModelDiscoveryError`.
    """
    what = f"model {name!r}" + (f" version {version!r}" if version else "")
    try:
        response = await client.get_model_config(
            name, version, as_json=True, client_timeout=client_timeout
        )
    except InferenceServerException as exc:
        status = _status(exc)
        if status == "UNIMPLEMENTED":
            raise ModelConfigUnavailable(
                f"{server} has no ModelConfig RPC (e.g. MLServer), so the spec of {what} cannot "
                "be discovered: configure batch_size and the model's input/output tensor specs "
                f"(name, datatype, dims) yourself ({exc.message()})"
            ) from exc
        if status == "NOT_FOUND":
            raise ModelNotFound(f"{server} does not serve {what}: {exc.message()}") from exc
        if status in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
            raise ModelServerUnavailable(
                f"cannot reach {server} to read the config of {what} ({status}): {exc.message()}"
            ) from exc
        raise ModelDiscoveryError(
            f"{server} failed to return the config of {what} ({status or 'no status'}): "
            f"{exc.message()}"
        ) from exc
    config = response.get("config", response) if isinstance(response, Mapping) else {}
    spec = spec_from_config(config, version)
    if not spec.inputs or not spec.outputs:
        raise ModelDiscoveryError(
            f"{server} returned a config for {what} without inputs or outputs: {config!r:.300}"
        )
    resolved = version or await _latest_version(client, name, client_timeout)
    return replace(spec, name=spec.name or name, version=resolved)


async def _latest_version(client: Any, name: str, client_timeout: float | None) -> str:
    """The highest version the server lists for ``name`` (what an unversioned request gets
    under the default policy), or ``""`` when the metadata does not say."""
    try:
        metadata = await client.get_model_metadata(
            name, as_json=True, client_timeout=client_timeout
        )
    except InferenceServerException:
        return ""
    versions = [str(v) for v in (metadata or {}).get("versions", ())]
    numeric = [v for v in versions if v.isdigit()]
    return max(numeric, key=int) if numeric else ""


# --- batch size ------------------------------------------------------------------------------


def target_batch_size(spec: ModelSpec, override: int | None = None) -> int:
    """Rows per request: ``override`` if given, else the largest preferred batch size, else
    ``max_batch_size``. Raises :class:`ModelConfigError` when neither the server nor the
    configuration says, or when the override exceeds the model's ``max_batch_size``."""
    if override is not None:
        if override < 1:
            raise ModelConfigError(f"batch_size must be >= 1, not {override}")
        if spec.max_batch_size > 0 and override > spec.max_batch_size:
            raise ModelConfigError(
                f"batch_size {override} exceeds model {spec.name!r}'s max_batch_size "
                f"{spec.max_batch_size}"
            )
        return override
    if spec.preferred_batch_sizes:
        return max(spec.preferred_batch_sizes)
    if spec.max_batch_size > 0:
        return spec.max_batch_size
    raise ModelConfigError(
        f"model {spec.name!r} has max_batch_size 0 (no batching) and no preferred batch size: "
        "configure batch_size"
    )


def default_in_flight(spec: ModelSpec, target: int) -> int:
    """Batches to keep in flight when ``max_in_flight`` is not configured: enough that every
    model instance can run one execution of the size Triton's dynamic batcher may merge
    requests into (``max_batch_size``) while another as large waits in its queue. With fewer,
    the batcher merges everything queued into one execution and the instance idles while the
    answers travel back and the next requests come in. At least 2 per instance."""
    instances = max(spec.instance_count, 1)
    merged = max(spec.max_batch_size, target)
    return max(2 * instances, -(-2 * instances * merged // max(target, 1)))


# --- bytes per row ---------------------------------------------------------------------------


def tensor_bytes_per_row(
    tensor: TensorSpec,
    *,
    bytes_estimate: int = DEFAULT_BYTES_ESTIMATE,
    variable_dim_estimate: int = DEFAULT_VARIABLE_DIM_ESTIMATE,
) -> int:
    """Bytes of one row of ``tensor``: elements x element size. BYTES elements count
    ``bytes_estimate`` each and ``-1`` dims count ``variable_dim_estimate``."""
    elements = math.prod(variable_dim_estimate if d < 0 else d for d in tensor.dims)
    size = bytes_estimate if tensor.datatype == "BYTES" else DTYPE_SIZES.get(tensor.datatype)
    if size is None:
        raise ModelConfigError(f"tensor {tensor}: unknown datatype {tensor.datatype!r}")
    return elements * size


def _sum_bytes(tensors: Iterable[TensorSpec], bytes_estimate: int, variable_dim: int) -> int:
    return sum(
        tensor_bytes_per_row(t, bytes_estimate=bytes_estimate, variable_dim_estimate=variable_dim)
        for t in tensors
    )


def output_bytes_per_row(
    spec: ModelSpec,
    *,
    bytes_estimate: int = DEFAULT_BYTES_ESTIMATE,
    variable_dim_estimate: int = DEFAULT_VARIABLE_DIM_ESTIMATE,
) -> int:
    """Bytes the model's outputs take per row (see :func:`tensor_bytes_per_row`)."""
    return _sum_bytes(spec.outputs, bytes_estimate, variable_dim_estimate)


def input_bytes_per_row(
    spec: ModelSpec,
    *,
    bytes_estimate: int = DEFAULT_BYTES_ESTIMATE,
    variable_dim_estimate: int = DEFAULT_VARIABLE_DIM_ESTIMATE,
) -> int:
    """Bytes the model's inputs take per row (see :func:`tensor_bytes_per_row`)."""
    return _sum_bytes(spec.inputs, bytes_estimate, variable_dim_estimate)
