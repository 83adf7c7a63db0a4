"""The ``publish`` subcommand: a CSV, JSON Lines or Parquet file (or stdin) read, converted and
split chunk by chunk in a worker thread, and published under chunk ids that stay the same when
the same file is published again with the same settings."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, TextIO

import pyarrow as pa

from rowbatch.producer.cli.parser import ENCODINGS
from rowbatch.producer.cli.running import Outcome, Submit, Tally, UsageError, run_to_outcome
from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.splitting import split_for
from rowbatch.progress import Progress
from rowbatch.tables.convert import wire_columns
from rowbatch.tables.errors import InputError
from rowbatch.tables.formats import STDIN, InputFormat
from rowbatch.tables.rechunk import rechunk
from rowbatch.tables.schema import parse_schema
from rowbatch.tables.source import TableFileReader, open_source
from rowbatch.timing import Clock
from rowbatch.wire.chunks.encode import EncodedChunk, EncodeOptions
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.errors import RowTooLarge, WireError
from rowbatch.wire.headers.fields import MAX_TABLE_LEN, Encoding, check_table, derive_chunk_id

_UNSAFE: Final = re.compile(r"[^A-Za-z0-9_.-]+")


def _sanitize(text: str, limit: int = 40) -> str:
    return _UNSAFE.sub("_", text).strip("._-")[:limit] or "rows"


def default_id_prefix(opts: argparse.Namespace, max_chunk_bytes: int) -> str:
    """``<file stem>-<12 hex>``: the same file (path, size, mtime) published with the same
    settings gets the same prefix, hence the same chunk ids."""
    if opts.file == STDIN:
        return f"stdin-{uuid.uuid4().hex[:12]}"
    path = Path(opts.file).resolve()
    stat = path.stat()
    key = json.dumps(
        [
            str(path),
            stat.st_size,
            stat.st_mtime_ns,
            opts.chunk_rows,
            opts.encoding,
            opts.arrow_compression,
            opts.schema,
            opts.table,
            opts.ordering_key,
            max_chunk_bytes,
        ]
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    stem = path.name.split(".")[0]
    return f"{_sanitize(stem)}-{digest}"


def _table_name(opts: argparse.Namespace) -> str:
    if opts.table:
        name = str(opts.table)
    elif opts.file == STDIN:
        raise UsageError("reading stdin: give the table name with --table NAME")
    else:
        name = _sanitize(Path(opts.file).name.split(".")[0], MAX_TABLE_LEN)
    try:
        return check_table(name)
    except WireError as exc:
        raise UsageError(f"--table: {exc}") from None


@dataclass
class _ChunkReader:
    """Reads, converts and splits the input chunk by chunk (runs in a worker thread)."""

    source: TableFileReader
    tables: Iterator[pa.Table]
    publisher: Publisher
    table: str
    encoding: Encoding
    schema: dict[str, ColumnType] | None
    id_prefix: str
    ordering_key: str | None
    compression: Any
    seq: int = 0
    next_row: int = 0

    def next_chunks(self) -> list[EncodedChunk] | None:
        table = next(self.tables, None)
        if table is None:
            return None
        first_row = self.next_row
        self.next_row += table.num_rows
        columns, types = wire_columns(
            table, self.schema, source=self.source.name, first_row=first_row
        )
        chunk_id = derive_chunk_id(self.id_prefix, self.seq)
        self.seq += 1
        try:
            return split_for(
                self.publisher,
                self.table,
                columns,
                self.encoding,
                chunk_id,
                schema=types,
                options=EncodeOptions(ordering_key=self.ordering_key, compression=self.compression),
            )
        except RowTooLarge as exc:
            row = "a row" if exc.row_index is None else f"data row {first_row + exc.row_index + 1}"
            raise InputError(
                f"{self.source.name}: {row} alone encodes to {exc.size:,} bytes with its "
                f"headers, over the {exc.max_bytes:,}-byte limit of one message on "
                f"{self.publisher.broker} topic {self.publisher.topic!r}; it cannot be "
                "published (shorten the row; or, if the broker allows more, raise "
                "--max-message-bytes)"
            ) from None
        except WireError as exc:
            raise InputError(
                f"{self.source.name} (data rows {first_row + 1}..{self.next_row}): {exc}"
            ) from None


async def run_publish(
    opts: argparse.Namespace,
    publisher: Publisher,
    *,
    stdin: IO[bytes] | None = None,
    stderr: TextIO,
    clock: Clock = time.monotonic,
) -> Outcome:
    """``publish``: the file, chunk by chunk. Raises InputError/PublishError (the partial
    summary is in the exception's ``outcome`` attribute)."""
    table = _table_name(opts)
    schema = parse_schema(opts.schema) if opts.schema else None
    fmt = InputFormat(opts.format) if opts.format else None
    encoding = ENCODINGS[opts.encoding]
    if opts.arrow_compression and encoding is not Encoding.ARROW:
        raise UsageError("--arrow-compression needs --encoding arrow")
    if opts.id_prefix is not None:
        try:
            derive_chunk_id(opts.id_prefix, 0)
        except WireError as exc:
            raise UsageError(f"--id-prefix: {exc}") from None
    started = clock()
    source = await asyncio.to_thread(
        open_source,
        opts.file,
        fmt,
        schema=schema,
        batch_rows=max(opts.chunk_rows, 1024),
        stdin=stdin,
    )
    with source:
        prefix = opts.id_prefix or default_id_prefix(opts, publisher.max_chunk_bytes)
        progress = Progress(
            stderr,
            mode=opts.progress,
            total_rows=source.total_rows,
            estimate_rows=source.estimated_rows,
            clock=clock,
        )
        tally = Tally(progress, started)
        reader = _ChunkReader(
            source,
            rechunk(source.batches, opts.chunk_rows),
            publisher,
            table,
            encoding,
            schema,
            prefix,
            opts.ordering_key,
            opts.arrow_compression,
        )

        async def feed(submit: Submit) -> None:
            while (chunks := await asyncio.to_thread(reader.next_chunks)) is not None:
                for chunk in chunks:
                    await submit(chunk, chunk.headers.row_count)

        return await run_to_outcome(publisher, tally, feed, opts, prefix, clock=clock)


__all__ = ["default_id_prefix", "run_publish"]
