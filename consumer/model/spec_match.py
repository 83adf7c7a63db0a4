"""Whether several model servers serve the same model: the parts of the spec a request depends
on (inputs and outputs with their datatypes and dims, ``max_batch_size``) must be equal on every
endpoint; a difference is named with both endpoints."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from consumer.model.discovery import ModelConfigError, ModelSpec, TensorSpec

log = logging.getLogger(__name__)


class EndpointSpecMismatch(ModelConfigError):
    """Two endpoints serve the model with different specs."""


def spec_differences(a: ModelSpec, b: ModelSpec) -> list[str]:
    """What differs between ``a`` and ``b`` in what requests depend on, each as ``what: a vs
    b``; empty when they match."""
    found = _tensor_differences("input", a.inputs, b.inputs)
    found += _tensor_differences("output", a.outputs, b.outputs)
    if a.max_batch_size != b.max_batch_size:
        found.append(f"max_batch_size: {a.max_batch_size} vs {b.max_batch_size}")
    return found


def _tensor_differences(
    kind: str, a: tuple[TensorSpec, ...], b: tuple[TensorSpec, ...]
) -> list[str]:
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
