"""What the load generator generates (:class:`LoadSpec`: rows, chunking, table kind and width,
seed, malformed fraction and kinds, chunk id prefix), checked when made."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Literal

from rowbatch.wire.columns.column_type import INT64, STRING, ColumnType
from rowbatch.wire.headers.fields import Encoding, derive_chunk_id

LoadKind = Literal["text", "numeric"]


class MalformedKind(StrEnum):
    BAD_ENCODING = "bad-encoding"
    WRONG_TYPE = "wrong-type"
    MISSING_HEADER = "missing-header"
    ROW_COUNT = "row-count"
    REJECT_MARKER = "reject-marker"


#: The kinds the consumer's decoder catches (``reject-marker`` needs the ``chaos`` model).
DECODE_KINDS: Final = (
    MalformedKind.BAD_ENCODING,
    MalformedKind.WRONG_TYPE,
    MalformedKind.MISSING_HEADER,
    MalformedKind.ROW_COUNT,
)
DEFAULT_REJECT_MARKER: Final = "rowbatch-reject-me"
DEFAULT_WIDTH: Final[Mapping[str, int]] = {"text": 64, "numeric": 16}
_MAX_TEXT_WIDTH: Final = 1 << 20


@dataclass(frozen=True)
class LoadSpec:
    """What to generate; see :mod:`rowbatch.producer.loadgen`."""

    rows: int
    chunk_rows: int = 1000
    kind: LoadKind = "text"
    width: int | None = None
    encoding: Encoding = Encoding.ARROW
    table: str = "loadgen"
    seed: int = 0
    malformed: float = 0.0
    malformed_kinds: tuple[MalformedKind, ...] = DECODE_KINDS
    reject_marker: str | None = None
    id_prefix: str = "loadgen"

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoding", Encoding.parse(self.encoding))
        object.__setattr__(
            self, "malformed_kinds", tuple(MalformedKind(k) for k in self.malformed_kinds)
        )
        if self.rows < 0:
            raise ValueError(f"rows must be >= 0, not {self.rows}")
        if self.chunk_rows < 1:
            raise ValueError(f"chunk rows must be >= 1, not {self.chunk_rows}")
        if self.kind not in DEFAULT_WIDTH:
            raise ValueError(f"kind must be 'text' or 'numeric', not {self.kind!r}")
        if not 1 <= self.row_width <= _MAX_TEXT_WIDTH:
            raise ValueError(f"width must be in 1..{_MAX_TEXT_WIDTH}, not {self.row_width}")
        if not 0.0 <= self.malformed <= 1.0:
            raise ValueError(f"the malformed fraction must be in [0, 1], not {self.malformed}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, not {self.seed}")
        if self.malformed > 0 and not self.malformed_kinds:
            raise ValueError("a malformed fraction needs at least one malformed kind")
        if MalformedKind.REJECT_MARKER in self.malformed_kinds and self.malformed > 0:
            if self.kind != "text":
                raise ValueError(
                    "reject-marker needs --kind text (the chaos model reads a text column)"
                )
            if self.reject_marker is None:
                object.__setattr__(self, "reject_marker", DEFAULT_REJECT_MARKER)
        if self.reject_marker == "":
            raise ValueError("the reject marker must not be empty (it would match every text)")
        derive_chunk_id(self.id_prefix, 0)  # checks the prefix makes valid ids

    @property
    def row_width(self) -> int:
        return self.width if self.width is not None else DEFAULT_WIDTH[self.kind]

    @property
    def chunks(self) -> int:
        return math.ceil(self.rows / self.chunk_rows)

    def schema(self) -> dict[str, ColumnType]:
        """The table's columns: what a consumer of it expects."""
        if self.kind == "text":
            return {"id": INT64, "text": STRING}
        return {"id": INT64, "features": ColumnType.vector(self.row_width), "count": INT64}

    def chunk_id(self, index: int) -> str:
        return derive_chunk_id(self.id_prefix, index)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "chunk_rows": self.chunk_rows,
            "kind": self.kind,
            "width": self.row_width,
            "encoding": "json" if self.encoding is Encoding.JSON else "arrow",
            "table": self.table,
            "seed": self.seed,
            "malformed": self.malformed,
            "malformed_kinds": [k.value for k in self.malformed_kinds],
            "reject_marker": self.reject_marker,
            "id_prefix": self.id_prefix,
        }


__all__ = [
    "DECODE_KINDS",
    "DEFAULT_REJECT_MARKER",
    "DEFAULT_WIDTH",
    "LoadKind",
    "LoadSpec",
    "MalformedKind",
]
