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


@dataclass(frozen=True, slots=True)
class RowError:
    """Why one row failed on its own: the fine reason code written to its dead letter
    (``prompt_too_long``, ``invalid_request``, ``unparseable_output``, ``null_not_allowed``)
    and the server's (or the parser's) own words."""

    code: str
    message: str
    fatal: bool = False
    """The request failed for good without saying the row is bad (a 500, an answer that does
    not fit): the row's message is nacked and redelivered, not dead-lettered."""


class RowsFailed(Exception):
    """A batch whose rows were answered one by one (or in groups) and some failed on their own:
    ``answer`` holds every row's outputs (a failed row's are placeholders, never written),
    ``failed`` each failed row's position in the batch and why. The engine writes the rest and
    fails those rows alone (dead-lettered as a row part of their message); no bisection."""

    def __init__(self, answer: Answer, failed: Mapping[int, RowError]) -> None:
        first = next(iter(failed.values()), RowError("", ""))
        super().__init__(f"{len(failed)} row(s) failed on their own: {first.message}")
        self.answer = answer
        self.failed = dict(failed)
