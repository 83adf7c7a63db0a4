"""The values ``rowbatch-consumer compare`` reduces a comparison table to
(:mod:`.compare`), and :mod:`.compare_report` prints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Kind = Literal["class", "numeric", "vector"]
Floats = NDArray[np.float64]


class NotComparable(ValueError):
    """The table is not a comparison table, or a tolerance names no numeric output of it."""


@dataclass(frozen=True)
class Tolerance:
    atol: float = 1e-6
    rtol: float = 0.0


@dataclass(frozen=True)
class Quantiles:
    min: float
    p50: float
    p90: float
    p99: float
    max: float


@dataclass(frozen=True)
class Histogram:
    edges: tuple[float, ...]
    """``len(counts) + 1`` bin edges; the last bin holds its upper edge."""
    counts: tuple[int, ...]


@dataclass(frozen=True)
class Differing:
    """A row whose answers differ (flipped, or outside the tolerance)."""

    key: tuple[Any, ...]
    """The row's :attr:`Comparison.key_columns` values."""
    production: Any = None
    """Scalars only."""
    candidate: Any = None
    abs_difference: float | None = None
    """Numeric: ``|candidate - production|``; vector: the row's largest element one."""
    cosine: float | None = None


@dataclass(frozen=True)
class Confusion:
    pairs: tuple[tuple[Any, Any, int], ...]
    """``(production, candidate, rows)``, most rows first: every pair when each side has at
    most :data:`MATRIX_VALUES` values, else the :data:`TOP_PAIRS` most common."""
    distinct: int
    """Distinct pairs in all."""

    @property
    def complete(self) -> bool:
        return len(self.pairs) == self.distinct


@dataclass(frozen=True)
class OutputFigures:
    name: str
    kind: Kind
    type: str
    """``float32``, ``int32``, ``string``, ``float32[384]`` (a vector)..."""
    compared: int
    """Rows with both answers."""
    missing: int
    """Rows without one (the candidate failed, or the production value is NULL)."""
    agree: int
    differing: tuple[Differing, ...]
    """The first ``--flipped`` of the ``compared - agree`` rows that differ: in key order
    (class), largest difference first (numeric, vector)."""
    tolerance: Tolerance | None = None
    difference: Quantiles | None = None
    """Numeric: of ``candidate - production``."""
    abs_difference: Quantiles | None = None
    """Numeric: of ``|candidate - production|``; vector: of each row's largest one."""
    cosine: Quantiles | None = None
    histogram: Histogram | None = None
    confusion: Confusion | None = None

    @property
    def differing_total(self) -> int:
        return self.compared - self.agree

    @property
    def agreement(self) -> float | None:
        return self.agree / self.compared if self.compared else None


@dataclass(frozen=True)
class VersionFigures:
    production_version: str | None
    candidate_model: str | None
    candidate_version: str | None
    rows: int
    candidate_failed: int
    latency_ms: Quantiles | None
    """Of ``latency_ms`` (the production request's time; ``None``: no value)."""
    candidate_latency_ms: Quantiles | None


@dataclass(frozen=True)
class Comparison:
    rows: int
    candidate_failed: int
    """Rows the candidate failed (``candidate_error`` not NULL)."""
    errors: tuple[tuple[str, int], ...]
    """The :data:`TOP_ERRORS` most common candidate errors and their rows."""
    distinct_errors: int
    versions: tuple[VersionFigures, ...]
    key_columns: tuple[str, ...]
    """``chunk_id``, ``row_index`` and the passthrough columns."""
    outputs: tuple[OutputFigures, ...]
