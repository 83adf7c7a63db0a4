"""The ``Sink`` seam: result tables with idempotent writes keyed on ``(chunk_id, row_index)``.

The result row (one per input row) is:

============================  =================================================================
column                        meaning
============================  =================================================================
``chunk_id`` (text)           the wire contract's idempotency key; with ``row_index`` the
                              primary key, so a redelivered or re-sent chunk never duplicates
``row_index`` (int)           the row's position inside its chunk
``source_message_id`` (text)  the broker's message id (Pub/Sub id or topic/partition/offset)
passthrough key columns       copied from the input row, as configured
output columns                one per model output, as configured (vectors as arrays)
``model_name`` (text)
``model_version`` (text)
``processed_at`` (timestamp)  UTC, when the batch's inference answered
============================  =================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray


@dataclass(frozen=True)
class ColumnSpec:
    """A result column's type, from the model config (outputs) or the wire schema (passthrough).

    ``dtype`` is a numpy dtype name (``float32``, ``int64``, ``bool``, ``object`` for text);
    ``dim`` is 0 for scalars and the vector length for fixed-size vectors."""

    name: str
    dtype: str
    dim: int = 0


@dataclass(frozen=True)
class TableSpec:
    """The result table's name and its non-key columns (passthrough first, then outputs)."""

    name: str
    passthrough: tuple[ColumnSpec, ...]
    outputs: tuple[ColumnSpec, ...]


@dataclass(frozen=True, eq=False)
class ResultRows:
    """Result rows for one written batch; every array has ``len(chunk_id)`` rows (vectors are
    2-D: rows x dim). ``nulls`` maps a passthrough column to its null mask when it has nulls."""

    chunk_id: NDArray[np.object_]
    row_index: NDArray[np.int64]
    source_message_id: NDArray[np.object_]
    passthrough: Mapping[str, NDArray[Any]]
    outputs: Mapping[str, NDArray[Any]]
    nulls: Mapping[str, NDArray[np.bool_]]
    model_name: str
    model_version: str
    processed_at: datetime

    def __len__(self) -> int:
        return int(self.chunk_id.shape[0])


class Sink(Protocol):
    """A result table. ``write`` is idempotent on ``(chunk_id, row_index)``: rows already there
    are left as they are, so a redelivered message never duplicates a row."""

    async def open(self, table: TableSpec) -> None:
        """Connect and create the table if it is absent (check it fits if present)."""

    async def write(self, rows: ResultRows) -> None:
        """Durably write the rows (committed when this returns)."""

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        """Remove every row of these chunks: used when a message that was partly written is
        dead-lettered, so its rows end up in exactly one place."""

    async def close(self) -> None: ...
