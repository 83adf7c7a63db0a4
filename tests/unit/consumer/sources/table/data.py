"""Small tables on the local disk for the table-mode tests: Parquet files with a known row
group layout (``id`` = the row's place in the whole dataset), and readers of what a delivery
carries."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.chunks.decode import decode_chunk


def id_table(first: int, rows: int) -> pa.Table:
    """``id`` (int64) = ``first``.., ``x`` (float32) = id / 2, ``name`` (string)."""
    ids = list(range(first, first + rows))
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "x": pa.array([i / 2 for i in ids], pa.float32()),
            "name": pa.array([f"row {i}" for i in ids], pa.string()),
        }
    )


def write_parquet(path: Path, first: int, rows: int, row_group_rows: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(id_table(first, rows), path, row_group_size=row_group_rows)


def write_dataset(root: Path, layout: Sequence[tuple[str, int]], row_group_rows: int) -> int:
    """One Parquet file per ``(relative path, rows)`` in order, ids continuing across files;
    the number of rows."""
    first = 0
    for relative, rows in layout:
        write_parquet(root / relative, first, rows, row_group_rows)
        first += rows
    return first


def truncate(path: Path, share: float = 0.6) -> bytes:
    """Cuts ``path`` to ``share`` of its bytes (a Parquet file loses its footer); what it
    held, to mend it with."""
    whole = path.read_bytes()
    path.write_bytes(whole[: int(len(whole) * share)])
    return whole


def ids_of(delivery: Delivery) -> list[int]:
    """The ``id`` values of the rows a delivery carries."""
    chunk = decode_chunk(delivery.payload, delivery.attributes)
    return [int(v) for v in chunk.columns["id"]]
