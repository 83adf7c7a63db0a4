"""A :class:`ModelSpec` from the Open Inference Protocol's ``ModelMetadata`` answer (every
KServe v2 server has it; MLServer and KServe lack Triton's ``ModelConfig``), as
``tritonclient``'s JSON form renders it: inputs and outputs with ``name``, ``datatype`` and
``shape``, where 64-bit numbers may come as strings. A shape's leading ``-1`` is the batch axis;
the rest are the row's dims.

Metadata is *unusable* (:class:`MetadataUnusable`, saying why) when it lists no inputs or no
outputs (KServe's default ``get_input_types``/``get_output_types``, an MLServer model without
``inputs``/``outputs`` in its model-settings.json), a datatype that is not KServe v2, or a
shape without a leading ``-1``: such a model declares no batch axis, so rows cannot be stacked
along it. Discovery then falls back to the configured ``model.inputs`` / ``model.outputs``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rowbatch.consumer.model.spec import DATATYPES, ModelSpec, TensorSpec


class MetadataUnusable(ValueError):
    """The metadata does not describe the model well enough to build requests from it."""


def spec_from_metadata(metadata: Mapping[str, Any], name: str, version: str = "") -> ModelSpec:
    """The spec the metadata describes (``source="model_metadata"``, ``max_batch_size`` 0:
    not known). ``name`` stands in when the metadata has none; ``version`` is the requested
    one, else the highest numeric one the metadata lists, else ``""``.

    Raises :class:`MetadataUnusable` naming every tensor that cannot be used."""
    problems: list[str] = []
    inputs = _tensors("input", metadata.get("inputs") or (), problems)
    outputs = _tensors("output", metadata.get("outputs") or (), problems)
    for kind, found in (("inputs", inputs), ("outputs", outputs)):
        if not found and not metadata.get(kind):
            problems.append(f"it lists no {kind}")
    if problems:
        raise MetadataUnusable("; ".join(problems))
    return ModelSpec(
        name=str(metadata.get("name") or name),
        version=version or latest_version(metadata),
        inputs=inputs,
        outputs=outputs,
        max_batch_size=0,
        source="model_metadata",
    )


def latest_version(metadata: Mapping[str, Any]) -> str:
    """The highest numeric version ``metadata`` lists (what an unversioned request gets under
    Triton's default policy), or ``""`` when it lists none."""
    versions = [str(v) for v in metadata.get("versions") or ()]
    numeric = [v for v in versions if v.isdigit()]
    return max(numeric, key=int) if numeric else ""


def _tensors(
    kind: str, raw: Iterable[Mapping[str, Any]], problems: list[str]
) -> tuple[TensorSpec, ...]:
    tensors: list[TensorSpec] = []
    for entry in raw:
        name = str(entry.get("name", ""))
        datatype = str(entry.get("datatype", ""))
        try:
            shape = [int(d) for d in entry.get("shape") or ()]
        except (TypeError, ValueError):
            problems.append(f"{kind} {name} has shape {entry.get('shape')!r}, not integers")
            continue
        if not name:
            problems.append(f"an {kind} has no name: {dict(entry)!r:.100}")
        elif datatype not in DATATYPES:
            problems.append(f"{kind} {name} has datatype {datatype!r}, not a KServe v2 datatype")
        elif not shape or shape[0] != -1:
            problems.append(
                f"{kind} {name} has shape {shape}, without a leading -1: the model declares "
                "no batch axis"
            )
        else:
            tensors.append(TensorSpec(name, datatype, tuple(shape[1:])))
    return tuple(tensors)
