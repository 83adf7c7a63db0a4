"""The Parquet sink writes row groups of about 1 MiB, so the writer's encode buffers stay a
small constant instead of ~2.5x each write (docs/memory.md); narrow rows keep one group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rowbatch.consumer.sinks.parquet.files import ROW_GROUP_BYTES, DatasetFiles, row_group_rows


def wide(rows: int, dim: int = 4096) -> pa.Table:
    flat = pa.array(np.arange(rows * dim, dtype=np.float32))
    return pa.table(
        {"id": pa.array(np.arange(rows)), "y": pa.FixedSizeListArray.from_arrays(flat, dim)}
    )


def test_a_wide_write_is_split_into_row_groups_of_about_a_mebibyte(tmp_path: Path) -> None:
    table = wide(512)  # 8 MiB of outputs
    files = DatasetFiles(pafs.LocalFileSystem(), str(tmp_path), compression="snappy")
    files.publish(table, "part.parquet", "tmp")
    meta = pq.ParquetFile(tmp_path / "part.parquet").metadata
    assert meta.num_rows == 512
    assert 8 <= meta.num_row_groups <= 9  # 8 MiB of floats plus the ids
    sizes = [meta.row_group(i).total_byte_size for i in range(meta.num_row_groups)]
    assert max(sizes) <= 1.1 * ROW_GROUP_BYTES


def test_narrow_rows_keep_one_group_per_write() -> None:
    table = pa.table({"id": pa.array(np.arange(2000)), "score": pa.array(np.ones(2000))})
    assert row_group_rows(table) >= table.num_rows
    assert row_group_rows(pa.table({"id": pa.array([], pa.int64())})) == 1
