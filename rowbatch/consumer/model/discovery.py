"""What the consumer knows about the model it calls, read from the server at start: the tensor
and model specs, the batch size to aim for, and the bytes one row costs (for the in-flight
memory budget). Works with any KServe v2 / Open Inference Protocol gRPC server:

1. ``ModelConfig`` (Triton's extension): inputs, outputs, ``max_batch_size``, preferred batch
   sizes, instance count (:func:`spec_from_config`).
2. Where that RPC is UNIMPLEMENTED (MLServer, KServe's Python model server): ``ModelMetadata``,
   inputs and outputs with datatype and shape, a leading ``-1`` being the batch axis
   (:mod:`rowbatch.consumer.model.metadata_spec`).
3. Where the metadata does not describe the model (no tensors listed, no batch axis): the
   configured ``model.inputs`` / ``model.outputs`` (:mod:`rowbatch.consumer.model.configured_spec`);
   configured specs that differ from the server's stop start-up.

The server's ServerMetadata (name, version) is recorded on the spec: the defaults for batch size
and requests in flight depend on its kind (:mod:`rowbatch.consumer.model.server_kind`). A model the
server does not serve raises :class:`ModelNotFound`; an unreachable server
:class:`ModelServerUnavailable` (start-up waits for it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, Final

from tritonclient.utils import InferenceServerException

from rowbatch.consumer.model.configured_spec import ConfiguredSpec
from rowbatch.consumer.model.metadata_spec import (
    MetadataUnusable,
    latest_version,
    spec_from_metadata,
)
from rowbatch.consumer.model.spec import (
    DTYPE_SIZES,
    ModelConfigError,
    ModelSpec,
    TensorSpec,
)

__all__ = [
    "DEFAULT_BYTES_ESTIMATE",
    "DEFAULT_VARIABLE_DIM_ESTIMATE",
    "ModelConfigUnavailable",
    "ModelDiscoveryError",
    "ModelNotFound",
    "ModelServerUnavailable",
    "discover_model",
    "input_bytes_per_row",
    "output_bytes_per_row",
    "spec_from_config",
    "tensor_bytes_per_row",
]

log = logging.getLogger(__name__)

#: Default guess for one BYTES element (4-byte length prefix included), for byte budgets.
DEFAULT_BYTES_ESTIMATE: Final = 256
#: Default guess for a variable (``-1``) dimension, for byte budgets.
DEFAULT_VARIABLE_DIM_ESTIMATE: Final = 1

_UNREACHABLE: Final = ("UNAVAILABLE", "DEADLINE_EXCEEDED")


class ModelDiscoveryError(RuntimeError):
    """The model's spec could not be read from the server."""


class ModelConfigUnavailable(ModelDiscoveryError):
    """The server has no ModelConfig RPC, its ModelMetadata does not describe the model, and no
    tensor specs are configured (``model.inputs`` / ``model.outputs``)."""


class ModelNotFound(ModelDiscoveryError):
    """The server does not serve the named model (or version)."""


class ModelServerUnavailable(ModelDiscoveryError):
    """The server could not be reached (down, wrong address, not ready)."""


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
    configured: ConfiguredSpec | None = None,
) -> ModelSpec:
    """Reads ``name``'s spec from the server behind ``client`` (a
    ``tritonclient.grpc.aio.InferenceServerClient``): ModelConfig, else ModelMetadata, else
    ``configured``. ``server`` (its URL) names it in errors.

    Raises :class:`ModelNotFound`, :class:`ModelServerUnavailable`,
    :class:`ModelConfigUnavailable` (nothing describes the model),
    :class:`ConfiguredSpecMismatch` (``configured`` differs from the server's spec); other
    server errors as :class:`ModelDiscoveryError`."""
    what = f"model {name!r}" + (f" version {version!r}" if version else "")
    try:
        response = await client.get_model_config(
            name, version, as_json=True, client_timeout=client_timeout
        )
    except InferenceServerException as exc:
        if _status(exc) != "UNIMPLEMENTED":
            raise _config_error(exc, server, what) from exc
        spec = await _spec_without_config(
            client,
            name,
            version,
            server=server,
            what=what,
            client_timeout=client_timeout,
            configured=configured,
            no_config=exc,
        )
    else:
        config = response.get("config", response) if isinstance(response, Mapping) else {}
        spec = spec_from_config(config, version)
        if not spec.inputs or not spec.outputs:
            raise ModelDiscoveryError(
                f"{server} returned a config for {what} without inputs or outputs: {config!r:.300}"
            )
        resolved = version or await _latest_version(client, name, client_timeout)
        spec = replace(spec, name=spec.name or name, version=resolved)
    server_name, server_version = await _server_metadata(client, server, client_timeout)
    spec = replace(spec, server_name=server_name, server_version=server_version)
    if configured is not None and spec.source != "configured":
        configured.check_agrees(spec, server)
    return spec


def _config_error(exc: InferenceServerException, server: str, what: str) -> ModelDiscoveryError:
    status = _status(exc)
    if status == "NOT_FOUND":
        return ModelNotFound(f"{server} does not serve {what}: {exc.message()}")
    if status in _UNREACHABLE:
        return ModelServerUnavailable(
            f"cannot reach {server} to read the config of {what} ({status}): {exc.message()}"
        )
    return ModelDiscoveryError(
        f"{server} failed to return the config of {what} ({status or 'no status'}): {exc.message()}"
    )


async def _spec_without_config(
    client: Any,
    name: str,
    version: str,
    *,
    server: str,
    what: str,
    client_timeout: float | None,
    configured: ConfiguredSpec | None,
    no_config: InferenceServerException,
) -> ModelSpec:
    """The spec from ModelMetadata, else from ``configured``, for a server without
    ModelConfig."""
    try:
        metadata = await client.get_model_metadata(
            name, version, as_json=True, client_timeout=client_timeout
        )
    except InferenceServerException as exc:
        status = _status(exc)
        if status == "NOT_FOUND":
            raise ModelNotFound(f"{server} does not serve {what}: {exc.message()}") from exc
        if status in _UNREACHABLE:
            raise ModelServerUnavailable(
                f"cannot reach {server} to read the metadata of {what} ({status}): {exc.message()}"
            ) from exc
        problem = f"its ModelMetadata RPC failed ({status or 'no status'}: {exc.message()})"
    else:
        try:
            spec = spec_from_metadata(metadata or {}, name, version)
        except MetadataUnusable as exc:
            problem = f"its ModelMetadata does not describe it: {exc}"
        else:
            return spec
    if configured is not None:
        log.info("%s: using model.inputs/model.outputs for %s, since %s", server, what, problem)
        return configured.spec(name, version)
    raise ModelConfigUnavailable(
        f"{server} has no ModelConfig RPC ({no_config.message()}) and {problem}, so the spec of "
        f"{what} cannot be discovered: declare its inputs and outputs on the server with a "
        "leading -1 (the batch axis) in each shape, or configure the tensor specs yourself: "
        "model.inputs and model.outputs ([[model.inputs]] tables of name, datatype and dims, "
        "dims without the batch axis)"
    ) from no_config


async def _latest_version(client: Any, name: str, client_timeout: float | None) -> str:
    """The highest version the server lists for ``name`` (what an unversioned request gets
    under the default policy), or ``""`` when the metadata does not say."""
    try:
        metadata = await client.get_model_metadata(
            name, as_json=True, client_timeout=client_timeout
        )
    except InferenceServerException:
        return ""
    return latest_version(metadata or {})


async def _server_metadata(
    client: Any, server: str, client_timeout: float | None
) -> tuple[str, str]:
    """The server's name and version from ServerMetadata; ``("", "")`` when it does not say."""
    try:
        answer = await client.get_server_metadata(as_json=True, client_timeout=client_timeout)
    except InferenceServerException as exc:
        status = _status(exc)
        if status in _UNREACHABLE:
            raise ModelServerUnavailable(
                f"cannot reach {server} to read its metadata ({status}): {exc.message()}"
            ) from exc
        log.debug("%s answered no ServerMetadata (%s): %s", server, status, exc.message())
        return "", ""
    answer = answer if isinstance(answer, Mapping) else {}
    return str(answer.get("name") or ""), str(answer.get("version") or "")


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
