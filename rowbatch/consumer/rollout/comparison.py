"""The shadow's comparison table: one row per shadowed row, keyed like the result table
(``chunk_id``, ``row_index``), with the passthrough columns, each output column ``c`` twice
(``c``: production's value, ``c__candidate``: the candidate's, null where it failed), the
production version, both requests' times and the candidate's error; ``model_name`` and
``model_version`` name the candidate. Written through the same sink as the results, so it is
idempotent on its key too."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.engine.results import ERROR_COLUMNS
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, TableSpec

CANDIDATE_SUFFIX: Final = "__candidate"
"""The candidate's value of output column ``c`` is in ``c__candidate``."""
PRODUCTION_VERSION: Final = "production_version"
LATENCY: Final = "latency_ms"
CANDIDATE_LATENCY: Final = "candidate_latency_ms"
CANDIDATE_ERROR: Final = "candidate_error"


def comparison_spec(results: TableSpec, name: str) -> TableSpec:
    """The comparison table beside the result table ``results``."""
    outputs: list[ColumnSpec] = []
    for column in results.outputs:
        if column.name in ERROR_COLUMNS:
            continue
        outputs += [column, ColumnSpec(column.name + CANDIDATE_SUFFIX, column.dtype, column.dim)]
    outputs += [
        ColumnSpec(PRODUCTION_VERSION, "object"),
        ColumnSpec(LATENCY, "float64"),
        ColumnSpec(CANDIDATE_LATENCY, "float64"),
        ColumnSpec(CANDIDATE_ERROR, "object"),
    ]
    return TableSpec(name, results.passthrough, tuple(outputs))


@dataclass(frozen=True, eq=False)
class Shadowed:
    """Rows production answered, held for the candidate."""

    chunk_id: NDArray[np.object_]
    row_index: NDArray[np.int64]
    message_id: NDArray[np.object_]
    columns: Mapping[str, NDArray[Any]]
    """The rows' columns (the model's inputs and the passthrough)."""
    nulls: Mapping[str, NDArray[np.bool_]]
    production: Mapping[str, NDArray[Any]]
    """Production's outputs, by model output name."""
    production_version: str
    latency_s: float

    def __len__(self) -> int:
        return int(self.row_index.shape[0])

    @property
    def nbytes(self) -> int:
        """What the rows hold (object arrays: their pointers and a guess of 64 bytes a value)."""
        arrays = (*self.columns.values(), *self.nulls.values(), *self.production.values())
        return sum(a.nbytes + (64 * a.size if a.dtype == object else 0) for a in arrays) + (
            len(self) * 3 * 72
        )


@dataclass(frozen=True)
class ComparisonLayout:
    """How shadowed rows become comparison rows."""

    outputs: Mapping[str, str]
    """Model output -> result column."""
    passthrough: tuple[str, ...]
    candidate_name: str
    candidate_version: str
    """Configured; ``""``: as each answer names it."""

    def rows(
        self,
        shadowed: Shadowed,
        candidate: Mapping[str, NDArray[Any]] | None,
        *,
        version: str,
        seconds: float,
        error: str | None,
        at: float,
    ) -> ResultRows:
        """The comparison rows of ``shadowed``, with the candidate's outputs (``None``: it
        failed with ``error``)."""
        n = len(shadowed)
        outputs: dict[str, NDArray[Any]] = {}
        nulls = {k: m for k, m in shadowed.nulls.items() if k in self.passthrough}
        for out, column in self.outputs.items():
            mine = shadowed.production[out]
            outputs[column] = mine
            if candidate is None:
                outputs[column + CANDIDATE_SUFFIX] = np.zeros_like(mine)
                nulls[column + CANDIDATE_SUFFIX] = np.ones(n, np.bool_)
            else:
                outputs[column + CANDIDATE_SUFFIX] = candidate[out]
        outputs[PRODUCTION_VERSION] = np.full(n, shadowed.production_version, dtype=object)
        outputs[LATENCY] = np.full(n, shadowed.latency_s * 1000.0)
        outputs[CANDIDATE_LATENCY] = np.full(n, seconds * 1000.0)
        outputs[CANDIDATE_ERROR] = np.full(n, error, dtype=object)
        if error is None:
            nulls[CANDIDATE_ERROR] = np.ones(n, np.bool_)
        return ResultRows(
            chunk_id=shadowed.chunk_id,
            row_index=shadowed.row_index,
            source_message_id=shadowed.message_id,
            passthrough={k: shadowed.columns[k] for k in self.passthrough},
            outputs=outputs,
            nulls=nulls,
            model_name=self.candidate_name,
            model_version=self.candidate_version or version,
            processed_at=datetime.fromtimestamp(at, UTC),
        )


def agreeing(production: NDArray[Any], candidate: NDArray[Any]) -> NDArray[np.bool_]:
    """Per row: the candidate's value equals production's (floats within 1e-6; every element
    of a vector)."""
    if production.dtype.kind == "f":
        same = np.isclose(production, candidate, rtol=0.0, atol=1e-6, equal_nan=True)
    else:
        same = np.asarray(production == candidate)
    if same.ndim > 1:
        same = same.reshape(same.shape[0], -1).all(axis=1)
    return np.asarray(same, dtype=np.bool_)
