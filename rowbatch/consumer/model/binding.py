"""The model binding: which table column feeds which model input, which model output becomes
which result column, and which input columns pass through to the result row; and its check
against the model's spec at start-up (:func:`check_binding`). The per-message check is in
:mod:`rowbatch.consumer.model.chunk_check`, tensor building per batch in
:mod:`rowbatch.consumer.model.tensors`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from rowbatch.consumer.model.spec import ModelSpec

#: Result-table columns the consumer writes itself; no output or passthrough may take them.
RESERVED_COLUMNS: Final = frozenset(
    {"chunk_id", "row_index", "source_message_id", "model_name", "model_version", "processed_at"}
)


class BindingError(ValueError):
    """The configured binding does not fit the model (raised at start-up)."""

    def __init__(self, model: str, problems: Sequence[str]) -> None:
        super().__init__(f"binding does not fit model {model!r}: " + "; ".join(problems))
        self.model = model
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Binding:
    """How table columns map onto the model and model outputs onto the result table."""

    inputs: Mapping[str, str]
    """Table column -> model input."""
    outputs: Mapping[str, str]
    """Model output -> result column."""
    passthrough: tuple[str, ...] = ()
    """Input columns copied unchanged into the result row (keys, typically)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", MappingProxyType(dict(self.inputs)))
        object.__setattr__(self, "outputs", MappingProxyType(dict(self.outputs)))
        object.__setattr__(self, "passthrough", tuple(self.passthrough))

    @property
    def columns(self) -> tuple[str, ...]:
        """Every table column the consumer reads: bound inputs, then passthrough ones."""
        bound = tuple(self.inputs)
        return bound + tuple(c for c in self.passthrough if c not in self.inputs)

    @property
    def result_columns(self) -> tuple[str, ...]:
        """The result table's non-reserved columns: passthrough first, then outputs."""
        return self.passthrough + tuple(self.outputs.values())


def check_binding(spec: ModelSpec, binding: Binding) -> None:
    """Raises :class:`BindingError` listing every way ``binding`` does not fit ``spec``."""
    problems: list[str] = []
    input_names = [t.name for t in spec.inputs]
    output_names = [t.name for t in spec.outputs]
    fed: dict[str, str] = {}
    for column, model_input in binding.inputs.items():
        if model_input not in input_names:
            problems.append(
                f"column {column!r} is bound to model input {model_input!r}, which the model "
                f"does not have (inputs: {input_names})"
            )
        elif model_input in fed:
            problems.append(
                f"model input {model_input!r} is bound to two columns, {fed[model_input]!r} and "
                f"{column!r}"
            )
        else:
            fed[model_input] = column
    problems.extend(
        f"model input {t} is not bound to any column" for t in spec.inputs if t.name not in fed
    )
    if not binding.outputs:
        problems.append(f"no model output is bound to a result column (outputs: {output_names})")
    for model_output in binding.outputs:
        if model_output not in output_names:
            problems.append(
                f"model output {model_output!r} is bound, but the model does not have it "
                f"(outputs: {output_names})"
            )
    seen: set[str] = set()
    for result in binding.result_columns:
        if result in RESERVED_COLUMNS:
            problems.append(
                f"result column {result!r} clashes with a column the consumer writes itself "
                f"({sorted(RESERVED_COLUMNS)})"
            )
        elif result in seen:
            problems.append(f"result column {result!r} appears twice (passthrough and outputs)")
        seen.add(result)
    if problems:
        raise BindingError(spec.name, problems)
