"""What a table run reads: the input's data files (a file, a directory or a hive-partitioned
dataset, local or in an object store, through pyarrow's filesystems), cut into units (a Parquet
row group, or a whole CSV / JSON Lines file), and the units of one shard: unit ``i`` of the
input's path-ordered list belongs to shard ``i mod N``, so N workers cover every row once and
the split does not depend on who asks.

A Parquet file whose footer cannot be read while the store finds the file (truncated, corrupt,
not Parquet) is that file's failure, not the input's: it is planned as one unit of the whole
file (``row_group`` None, rows unknown), which the run reads at its turn, row group after row
group, cut as its row groups would be; it then fails as unreadable (a dead-letter record, the
run not complete) unless the file was mended meanwhile. Only an input that cannot be listed,
holds no data file, or whose file the store no longer finds refuses the plan."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import defaultdict
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Final

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rowbatch.tables.formats import COMPRESSION_SUFFIXES, InputFormat
from rowbatch.wire.headers.fields import MAX_CHUNK_ID_LEN

_DATA_SUFFIXES: Final = {
    ".parquet": InputFormat.PARQUET,
    ".pq": InputFormat.PARQUET,
    ".csv": InputFormat.CSV,
    ".jsonl": InputFormat.JSONL,
    ".ndjson": InputFormat.JSONL,
    ".json": InputFormat.JSONL,
}
_KEY_SAFE: Final = re.compile(r"[\x21-\x3f\x41-\x7e]+")  # printable, no space, no "@"
_KEY_MAX: Final = MAX_CHUNK_ID_LEN - 24  # room for "@<first row>" and a split's suffix
_HIVE_PART: Final = re.compile(r"([^=/]+)=([^/]*)")
_FOOTER_THREADS: Final = 8

log = logging.getLogger(__name__)


class TableInputError(ValueError):
    """The input cannot be read as a table: the message names the path and what is wrong."""


@dataclass(frozen=True)
class DataFile:
    """One data file of the input."""

    path: str
    """Its path on ``filesystem`` (what pyarrow opens)."""
    relative: str
    """Its path below the input (the file's own name for a single-file input)."""
    format: InputFormat
    key: str
    """The file's part of every chunk id: ``relative`` when it is short printable ASCII
    without spaces or ``@``, else ``h-`` and 16 hex digits of its SHA-256."""
    partitions: tuple[tuple[str, str], ...] = ()
    """Hive partition columns from the path (``date=2024-05-01/``): name, value (text)."""


@dataclass(frozen=True)
class Unit:
    """What one shard reads as a whole: a Parquet row group, or a whole text file."""

    index: int
    """Its place in the input's unit list (the shard is ``index mod shards``)."""
    file: DataFile
    row_group: int | None
    """The Parquet row group; None for a whole file: a CSV / JSON Lines file, or a Parquet
    file whose footer could not be read when the run was planned (:attr:`whole_parquet`)."""
    first_row: int
    """The unit's first row within its file."""
    rows: int | None
    """Known for a row group; None for a whole file until it is read."""

    @property
    def whole_parquet(self) -> bool:
        """A whole Parquet file as one unit (its footer could not be read when planned)."""
        return self.row_group is None and self.file.format is InputFormat.PARQUET


@dataclass(frozen=True)
class TablePlan:
    """The input as units, and the filesystem they are read through."""

    input: str
    filesystem: pafs.FileSystem
    files: tuple[DataFile, ...]
    units: tuple[Unit, ...]

    def shard(self, index: int, count: int) -> tuple[Unit, ...]:
        """The units of shard ``index`` of ``count``."""
        return tuple(u for u in self.units if u.index % count == index)

    def read_whole(self, relatives: Collection[str]) -> TablePlan:
        """This plan with the Parquet files of ``relatives`` each one whole unit (their row
        groups, if their footers were read, joined), the units numbered again: what a sharded
        run planned when those files could not be opened (see the layout module)."""
        by_file: dict[str, list[Unit]] = defaultdict(list)
        for unit in self.units:
            by_file[unit.file.path].append(unit)
        units: list[Unit] = []
        for file in self.files:
            if file.format is InputFormat.PARQUET and file.relative in relatives:
                units.append(Unit(len(units), file, None, 0, None))
            else:
                first = len(units)
                units += [replace(u, index=first + i) for i, u in enumerate(by_file[file.path])]
        return replace(self, units=tuple(units))

    @property
    def known_rows(self) -> int | None:
        """Rows in the whole input, when every unit's count is known (Parquet)."""
        if any(u.rows is None for u in self.units):
            return None
        return sum(u.rows or 0 for u in self.units)


def file_key(relative: str) -> str:
    """The chunk-id prefix of a file (see :attr:`DataFile.key`)."""
    if len(relative) <= _KEY_MAX and _KEY_SAFE.fullmatch(relative):
        return relative
    return "h-" + hashlib.sha256(relative.encode()).hexdigest()[:16]


def open_filesystem(location: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and path of a local path or an object-store URL."""
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location)  # noqa: PTH100
    try:
        fs, path = pafs.FileSystem.from_uri(location)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise TableInputError(f"{location}: cannot open it: {exc}") from exc
    return fs, path


def _format_of(relative: str, declared: str) -> InputFormat | None:
    suffixes = [s.lower() for s in PurePosixPath(relative).suffixes]
    if suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes.pop()
    found = _DATA_SUFFIXES.get(suffixes[-1]) if suffixes else None
    if declared == "auto":
        return found
    wanted = InputFormat(declared)
    if found is not None and found is not wanted:
        return None  # e.g. a _metadata.json beside Parquet files
    return wanted


def _hidden(relative: str) -> bool:
    """Spark's and Hive's markers and temporary files: ``_SUCCESS``, ``.part-0.crc``,
    ``_temporary/``."""
    return any(part.startswith(("_", ".")) for part in PurePosixPath(relative).parts)


def list_files(location: str, fmt: str = "auto") -> tuple[pafs.FileSystem, list[DataFile]]:
    """The data files of ``location`` in path order; raises :class:`TableInputError` when it
    does not exist or holds no data file."""
    fs, root = open_filesystem(location)
    try:
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.NotFound:
            raise TableInputError(f"{location}: no such file or directory")
        if info.type == pafs.FileType.File:
            entries = [(root, PurePosixPath(root).name)]
        else:
            listing = fs.get_file_info(pafs.FileSelector(root, recursive=True))
            prefix = root.rstrip("/") + "/"
            entries = sorted(
                (i.path, i.path[len(prefix) :] if i.path.startswith(prefix) else i.base_name)
                for i in listing
                if i.type == pafs.FileType.File
            )
    except (pa.ArrowException, OSError) as exc:
        raise TableInputError(f"{location}: cannot list it: {exc}") from exc
    files = []
    for path, relative in entries:
        if info.type != pafs.FileType.File and _hidden(relative):
            continue
        found = _format_of(relative, fmt)
        if found is None:
            if info.type == pafs.FileType.File:
                raise TableInputError(
                    f"{location}: cannot tell its format from the name: set [source] format "
                    "to parquet, csv or jsonl"
                )
            continue
        parts = tuple(
            (m.group(1), m.group(2))
            for part in PurePosixPath(relative).parts[:-1]
            if (m := _HIVE_PART.fullmatch(part))
        )
        files.append(DataFile(path, relative, found, file_key(relative), parts))
    if not files:
        raise TableInputError(
            f"{location}: no data files (.parquet, .csv, .jsonl, optionally compressed) in it"
        )
    keys = [f.key for f in files]
    if len(set(keys)) != len(keys):  # two 16-hex-digit hashes alike: not in this universe
        raise TableInputError(f"{location}: two files share a chunk-id prefix")
    return fs, files


def _found(fs: pafs.FileSystem, path: str) -> bool:
    """Whether the store answers and finds ``path`` as a file."""
    try:
        return bool(fs.get_file_info(path).type == pafs.FileType.File)
    except (pa.ArrowException, OSError):
        return False


def _row_groups(fs: pafs.FileSystem, file: DataFile) -> list[int] | None:
    """The rows of each row group; None when the footer cannot be read but the store finds
    the file (its content is at fault: the file's own failure, met again at its turn).
    Raises :class:`TableInputError` when the store does not find it (gone, or down)."""
    try:
        with fs.open_input_file(file.path) as handle:
            meta = pq.ParquetFile(handle).metadata
            return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, OSError) and not _found(fs, file.path):
            raise TableInputError(f"{file.path}: cannot read it as Parquet: {exc}") from exc
        log.warning(
            "%s: cannot read it as Parquet (%s); planned as one unit, read at its turn",
            file.path,
            exc,
        )
        return None


def plan_table(location: str, fmt: str = "auto") -> TablePlan:
    """The input's units in order: each Parquet file's row groups (footers read in parallel;
    a file whose footer cannot be read whole), and each text file whole."""
    fs, files = list_files(location, fmt)
    parquet = [f for f in files if f.format is InputFormat.PARQUET]
    with ThreadPoolExecutor(_FOOTER_THREADS) as pool:
        groups = dict(zip(parquet, pool.map(lambda f: _row_groups(fs, f), parquet), strict=True))
    units: list[Unit] = []
    for file in files:
        found = groups.get(file)
        if found is None:  # a text file, or a Parquet file that cannot be opened
            units.append(Unit(len(units), file, None, 0, None))
            continue
        first = 0
        for group, rows in enumerate(found):
            units.append(Unit(len(units), file, group, first, rows))
            first += rows
    return TablePlan(location, fs, tuple(files), tuple(units))


def describe_units(units: Sequence[Unit]) -> str:
    """``3 files, 12 row groups`` (``, 1 Parquet file read whole``) for logs."""
    files = len({u.file.path for u in units})
    groups = sum(1 for u in units if u.row_group is not None)
    whole = sum(1 for u in units if u.whole_parquet)
    text = f"{files} file{'s' * (files != 1)}"
    text += f", {groups} row group{'s' * (groups != 1)}" if groups else ""
    return text + (f", {whole} Parquet file{'s' * (whole != 1)} read whole" if whole else "")


__all__ = [
    "DataFile",
    "TableInputError",
    "TablePlan",
    "Unit",
    "describe_units",
    "file_key",
    "list_files",
    "open_filesystem",
    "plan_table",
]
