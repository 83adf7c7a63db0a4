"""The input formats (CSV, JSON Lines, Parquet), told from a file's name, and the compressed
files read as such (``.gz``, ``.bz2``, ``.zst``, ``.lz4``)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Final

from rowbatch.tables.errors import InputError

STDIN: Final = "-"
COMPRESSION_SUFFIXES: Final = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".lz4": "lz4"}


class InputFormat(StrEnum):
    CSV = "csv"
    JSONL = "jsonl"
    PARQUET = "parquet"


_SUFFIX_FORMATS: Final = {
    ".csv": InputFormat.CSV,
    ".jsonl": InputFormat.JSONL,
    ".ndjson": InputFormat.JSONL,
    ".json": InputFormat.JSONL,
    ".parquet": InputFormat.PARQUET,
    ".pq": InputFormat.PARQUET,
}


def infer_format(path: str) -> InputFormat:
    """The format from the file name (``data.csv``, ``rows.jsonl.gz``, ``t.parquet``)."""
    if path == STDIN:
        raise InputError("reading stdin: give the format with --format csv|jsonl|parquet")
    suffixes = [s.lower() for s in Path(path).suffixes]
    if suffixes and suffixes[-1] in COMPRESSION_SUFFIXES:
        suffixes.pop()
    fmt = _SUFFIX_FORMATS.get(suffixes[-1]) if suffixes else None
    if fmt is None:
        raise InputError(
            f"{path}: cannot tell the format from the file name; give --format csv|jsonl|parquet"
        )
    return fmt


__all__ = ["COMPRESSION_SUFFIXES", "STDIN", "InputFormat", "infer_format"]
