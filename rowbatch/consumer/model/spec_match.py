"""Whether several model servers serve the same model: the parts of the spec a request depends
on (inputs and outputs with their datatypes and dims, and ``max_batch_size`` where both specs
come from ModelConfig) must be equal on every endpoint; a difference is named with both
endpoints. Specs from ModelMetadata or configuration know no ``max_batch_size``, so theirs is
not compared."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from rowbatch.consumer.model.spec import ModelConfigError, ModelSpec, TensorSpec

log = logging.getLogger(__name__)


class EndpointSpecMismatch(ModelConfigError):
    """Two endpoints serve the model with different specs."""


def spec_differences(a: ModelSpec, b: ModelSpec) -> list[str]:
    """What differs between ``a`` and ``b`` in what requests depend on, each as ``what: a vs
    b``; empty when they match."""
    found = tensor_differences("input", a.inputs, b.inputs)
    found += tensor_differences("output", a.outputs, b.outputs)
    both_configs = a.source == b.source == "model_config"
    if both_configs and a.max_batch_size != b.max_batch_size:
        found.append(f"max_batch_size: {a.max_batch_size} vs {b.max_batch_size}")
    return found


def tensor_differences(
    kind: str, a: tuple[TensorSpec, ...], b: tuple[TensorSpec, ...]
) -> list[str]:
    """Each ``kind`` tensor that is in only one of ``a`` and ``b``, or differs in datatype or
    dims, as ``kind name: a's vs b's``."""
    mine = {t.name: t for t in a}
    theirs = {t.name: t for t in b}
    found: list[str] = []
    for name in [*mine, *(n for n in theirs if n not in mine)]:
        left, right = mine.get(name), theirs.get(name)
        if left is None or right is None:
            found.append(f"{kind} {name}: {left or 'absent'} vs {right or 'absent'}")
        elif (left.datatype, left.dims) != (right.datatype, right.dims):
            found.append(f"{kind} {name}: {left} vs {right}")
    return found


def describe_mismatch(model: str, first: str, other: str, differences: list[str]) -> str:
    """One message naming both endpoints (``first`` on the left of every ``vs``)."""
    return f"model {model!r} differs between inference endpoints {first} and {other}: " + "; ".join(
        differences
    )


def same_spec(specs: Mapping[str, ModelSpec]) -> ModelSpec:
    """The spec every endpoint in ``specs`` (endpoint -> its spec, in configured order) serves;
    the first one's. Raises :class:`EndpointSpecMismatch` naming the first endpoint, one that
    differs, and how. Differences that do not change requests (preferred batch sizes, instance
    counts, the version an unversioned request gets) are logged, not refused."""
    if not specs:
        raise ValueError("no endpoint spec to compare")
    (first, reference), *others = specs.items()
    for endpoint, spec in others:
        differences = spec_differences(reference, spec)
        if differences:
            raise EndpointSpecMismatch(
                describe_mismatch(reference.name, first, endpoint, differences)
            )
        if spec.version != reference.version:
            log.warning(
                "inference endpoints %s and %s serve model %r in versions %r and %r; results "
                "are labelled %r",
                first,
                endpoint,
                reference.name,
                reference.version,
                spec.version,
                reference.version,
            )
        if (spec.server, spec.source) != (reference.server, reference.source):
            log.warning(
                "inference endpoints %s and %s are %s (spec from %s) and %s (spec from %s); "
                "each gets the in-flight default of its own kind",
                first,
                endpoint,
                reference.server,
                reference.source,
                spec.server,
                spec.source,
            )
        if spec.preferred_batch_sizes != reference.preferred_batch_sizes:
            log.warning(
                "inference endpoints %s and %s prefer batch sizes %s and %s; aiming at %s's",
                first,
                endpoint,
                list(reference.preferred_batch_sizes),
                list(spec.preferred_batch_sizes),
                first,
            )
    return reference
