"""The Parquet dataset's files on a local path or an object store: where a dataset lives, how
a new file is named (hive-partitioned by day), and writing each file atomically (a hidden
temporary name, then a rename)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rowbatch.consumer.sinks.base import utc

#: The partition column: the UTC date of ``processed_at``.
PARTITION: Final = "processed_date"


def locate(url_or_path: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the dataset root for a local path or any URI
    ``pyarrow.fs.FileSystem.from_uri`` knows."""
    if "://" in url_or_path:
        fs, root = pafs.FileSystem.from_uri(url_or_path)
    else:
        fs, root = pafs.LocalFileSystem(), str(Path(url_or_path).resolve())
    return fs, root.rstrip("/") or "/"


def partition(processed_at: datetime) -> str:
    """The partition folder of rows processed at ``processed_at``."""
    return f"{PARTITION}={utc(processed_at).date().isoformat()}"


def part_path(processed_at: datetime) -> str:
    """A new data file's path relative to the root: its day's partition, a name that sorts by
    the time it was written, and a random part so names never collide."""
    return (
        f"{PARTITION}={utc(processed_at).date().isoformat()}/"
        f"part-{datetime.now(UTC):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex}.parquet"
    )


ROW_GROUP_BYTES: Final = 1 << 20
"""Uncompressed bytes per row group. The Parquet writer holds a row group's encoded and
compressed pages until the group closes: about 4 MiB + 2x the group; a whole 8 MiB write as one
group peaked at 20 MiB of Arrow memory, in 1 MiB groups at 6 MiB (docs/memory.md)."""


def row_group_rows(table: pa.Table) -> int:
    """Rows per row group so that one holds about :data:`ROW_GROUP_BYTES`."""
    if table.num_rows == 0:
        return 1
    return max(1, ROW_GROUP_BYTES * int(table.num_rows) // max(1, int(table.nbytes)))


class DatasetFiles:
    """The files under ``root`` on ``fs``, by paths relative to the root."""

    def __init__(self, fs: pafs.FileSystem, root: str, *, compression: str) -> None:
        self.fs = fs
        self.root = root
        self.local = isinstance(fs, pafs.LocalFileSystem)
        self._compression = compression

    def _abs(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    @staticmethod
    def hidden(rel: str, suffix: str) -> str:
        """The hidden name next to ``rel`` that readers skip (files being written)."""
        folder, _, name = rel.rpartition("/")
        return f"{folder}/.{name}.{suffix}"

    def exists(self, rel: str) -> bool:
        return bool(self.fs.get_file_info(self._abs(rel)).type == pafs.FileType.File)

    def remove(self, rel: str) -> None:
        """Deletes the file if it is there."""
        if self.exists(rel):
            self.fs.delete_file(self._abs(rel))

    def delete(self, rel: str) -> None:
        self.fs.delete_file(self._abs(rel))

    def data_files(self) -> Iterator[str]:
        """Relative paths of the dataset's visible ``.parquet`` files."""
        selector = pafs.FileSelector(self.root, allow_not_found=True, recursive=True)
        for info in self.fs.get_file_info(selector):
            rel = info.path[len(self.root) :].lstrip("/")
            hidden = any(part.startswith(("_", ".")) for part in rel.split("/"))
            if info.type == pafs.FileType.File and rel.endswith(".parquet") and not hidden:
                yield rel

    def publish(self, table: pa.Table, rel: str, suffix: str) -> None:
        """Writes ``table`` to a hidden temporary name, then renames it to ``rel`` (atomic)."""
        tmp = self.hidden(rel, suffix)
        folder = self._abs(rel).rpartition("/")[0]
        self.fs.create_dir(folder, recursive=True)
        strings = [f.name for f in table.schema if pa.types.is_string(f.type)]
        with self.fs.open_output_stream(self._abs(tmp)) as out:
            pq.write_table(
                table,
                out,
                compression=self._compression,
                use_dictionary=strings,
                row_group_size=row_group_rows(table),
            )
        if self.local:
            _fsync(self._abs(tmp))
        self.fs.move(self._abs(tmp), self._abs(rel))
        if self.local:
            _fsync(folder)

    def open_output(self, rel: str) -> pafs.NativeFile:
        """A new file at ``rel`` (a hidden name: see :meth:`hidden`) open for writing."""
        self.fs.create_dir(self._abs(rel).rpartition("/")[0], recursive=True)
        return self.fs.open_output_stream(self._abs(rel))

    def finish(self, tmp: str, rel: str) -> None:
        """Renames the written file ``tmp`` to ``rel`` (atomic), durably on a local disk."""
        if self.local:
            _fsync(self._abs(tmp))
        self.fs.move(self._abs(tmp), self._abs(rel))
        if self.local:
            _fsync(self._abs(rel).rpartition("/")[0])

    def read(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        with self.fs.open_input_file(self._abs(rel)) as src:
            return pq.read_table(src, columns=columns)

    def read_schema(self, rel: str) -> pa.Schema:
        with self.fs.open_input_file(self._abs(rel)) as src:
            return pq.read_schema(src)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
