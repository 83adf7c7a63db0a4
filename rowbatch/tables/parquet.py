"""Reading Parquet: record batches with the row count known up front; Parquet needs random
access, so stdin is read into memory first."""

from __future__ import annotations

from collections.abc import Iterable
from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq


def parquet_batches(
    path: str, stdin: IO[bytes] | None, batch_rows: int
) -> tuple[Iterable[pa.RecordBatch], int]:
    """Batches of ``batch_rows`` rows of the file at ``path`` (or of ``stdin`` when given), and
    the file's row count."""
    parquet = pq.ParquetFile(pa.BufferReader(stdin.read()) if stdin else path)
    return parquet.iter_batches(batch_size=batch_rows), parquet.metadata.num_rows


__all__ = ["parquet_batches"]
