"""Opening an input (a file or stdin) as a :class:`TableFileReader`: its record batches, streamed
(never the whole file in memory, except Parquet from stdin), with what is known of its size for
a progress bar, and read errors that name the input."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import pyarrow as pa

from rowbatch.tables.csv import csv_batches
from rowbatch.tables.errors import InputError
from rowbatch.tables.formats import COMPRESSION_SUFFIXES, STDIN, InputFormat, infer_format
from rowbatch.tables.jsonl import jsonl_batches
from rowbatch.tables.parquet import parquet_batches
from rowbatch.wire.columns.column_type import ColumnType

BLOCK_BYTES: Final = 8 << 20


class _CountingReader(io.RawIOBase):
    """Counts the bytes read through it (for the progress bar's fraction of a file)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        n = len(data)
        view[:n] = data
        self.count += n
        return n


@dataclass
class TableFileReader:
    """Record batches of one input, with what is known of its size for a progress bar."""

    name: str
    format: InputFormat
    batches: Iterator[pa.RecordBatch]
    total_rows: int | None = None
    """Known up front for Parquet."""
    total_bytes: int | None = None
    """The file's size (for CSV/JSON Lines files; ``fraction`` uses it)."""
    _counter: _CountingReader | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)
    rows_read: int = 0
    """Rows in the batches handed out so far."""
    exhausted: bool = False

    def __post_init__(self) -> None:
        self.batches = self._count(self.batches)

    def _count(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.rows_read += batch.num_rows
            yield batch
        self.exhausted = True

    def estimated_rows(self) -> float | None:
        """The input's row count: exact for Parquet and once the input is read to its end,
        else extrapolated from the bytes read so far (read-ahead included)."""
        if self.total_rows is not None:
            return float(self.total_rows)
        if self.exhausted:
            return float(self.rows_read)
        if self._counter is None or not self.total_bytes or not self.rows_read:
            return None
        read = self._counter.count
        return self.rows_read * self.total_bytes / read if read else None

    def close(self) -> None:
        for close in reversed(self._closers):
            with contextlib.suppress(Exception):
                close()
        self._closers.clear()

    def __enter__(self) -> TableFileReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_error(name: str, fmt: InputFormat, exc: BaseException) -> InputError:
    text = " ".join(str(exc).split())
    hint = ""
    if "conversion error" in text or "changed from" in text or "not convertible" in text:
        hint = (
            "; a column's values do not all have the type of its first rows: declare its type "
            "with --schema NAME:TYPE (e.g. NAME:string)"
        )
    elif "straddling" in text or "block" in text.lower():
        hint = f"; a JSON line may be longer than the read block ({BLOCK_BYTES >> 20} MiB)"
    return InputError(f"{name}: cannot read it as {fmt.value}: {text}{hint}")


def _guarded(
    name: str, fmt: InputFormat, batches: Iterable[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        raise _read_error(name, fmt, exc) from exc


def open_source(
    path: str,
    fmt: InputFormat | None = None,
    *,
    schema: Mapping[str, ColumnType] | None = None,
    batch_rows: int = 65_536,
    stdin: IO[bytes] | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> TableFileReader:
    """Opens ``path`` (``-``: ``stdin``, default ``sys.stdin.buffer``) for streaming; CSV and
    JSON Lines are parsed ``block_bytes`` at a time (a JSON line must fit in one block)."""
    fmt = fmt or infer_format(path)
    name = "<stdin>" if path == STDIN else path
    if path == STDIN and stdin is None:
        stdin = sys.stdin.buffer
    try:
        if fmt is InputFormat.PARQUET:
            batches, total_rows = parquet_batches(path, stdin, batch_rows)
            return TableFileReader(name, fmt, _guarded(name, fmt, batches), total_rows=total_rows)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: cannot open it: {exc.strerror or exc}") from exc
    except (pa.ArrowException, OSError) as exc:
        raise _read_error(name, fmt, exc) from exc
    closers: list[Callable[[], None]] = []
    total_bytes = None
    if stdin is not None:
        raw: IO[bytes] = stdin
    else:
        try:
            raw = Path(path).open("rb")  # noqa: SIM115 - closed by TableFileReader.close
            total_bytes = Path(path).stat().st_size
        except OSError as exc:
            raise InputError(f"{path}: cannot open it: {exc.strerror or exc}") from exc
        closers.append(raw.close)
    counter = _CountingReader(raw)
    stream: Any = pa.PythonFile(counter, mode="r")
    suffix = Path(path).suffix.lower() if path != STDIN else ""
    if suffix in COMPRESSION_SUFFIXES:
        stream = pa.CompressedInputStream(stream, COMPRESSION_SUFFIXES[suffix])
    try:
        batches = _open_text(fmt, stream, schema or {}, block_bytes)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as exc:
        for close in closers:
            close()
        raise _read_error(name, fmt, exc) from exc
    return TableFileReader(
        name,
        fmt,
        _guarded(name, fmt, batches),
        total_bytes=total_bytes,
        _counter=counter,
        _closers=closers,
    )


def _open_text(
    fmt: InputFormat, stream: Any, schema: Mapping[str, ColumnType], block_bytes: int
) -> Iterable[pa.RecordBatch]:
    if fmt is InputFormat.CSV:
        return csv_batches(stream, schema, block_bytes)
    return jsonl_batches(stream, schema, block_bytes)


__all__ = ["TableFileReader", "open_source"]
