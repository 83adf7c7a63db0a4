"""What the model server answered for one batch: the outputs and the version that answered,
as one value (no attribute riding on a dict)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numpy.typing import NDArray


@dataclass(frozen=True, slots=True)
class Answer:
    """One request's answer: the requested outputs by name (rows first, as the server shaped
    them) and the version of the model that answered (the response's ``model_version``; ``""``
    when the server does not say)."""

    outputs: Mapping[str, NDArray[Any]]
    model_version: str = ""

    def rows(self) -> int:
        """Rows answered: the first output's first dimension (0 without outputs)."""
        first = next(iter(self.outputs.values()), None)
        return 0 if first is None else (first.shape[0] if first.ndim else 1)
