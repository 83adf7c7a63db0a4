"""The ``[source]`` settings of offline table mode (``kind = "table"``): a stored table (Parquet,
CSV or JSON Lines; a file, a directory or a hive-partitioned dataset, local or in an object store)
read once through the same engine, with its progress kept under ``state`` so a killed run
resumes, and split into ``shards`` for an Indexed Job."""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, model_validator

from rowbatch.consumer.section import Section

JOB_INDEX_VARIABLE = "JOB_COMPLETION_INDEX"
"""Set by Kubernetes in each pod of an Indexed Job: the pod's shard when ``shard`` is unset."""


class TableSettings(Section):
    """A stored table read once, in chunks of ``chunk_rows`` rows with stable keys
    (``chunk_id`` = ``<file>@<first row>``, ``row_index`` within the chunk), so a re-run
    writes nothing twice."""

    kind: Literal["table"] = "table"
    input: str = Field(min_length=1)
    """A file, a directory (every data file under it, hive partitions included, in path
    order) or an object-store URL (``s3://bucket/prefix/``, ``gs://...``; pyarrow's
    filesystems, credentials from the usual environment; for an S3-compatible server add
    ``?endpoint_override=host:port&scheme=http``)."""
    format: Literal["auto", "parquet", "csv", "jsonl"] = "auto"
    """``auto``: from the file names (``.parquet``, ``.csv``, ``.jsonl``, compressed
    ``.gz``/``.zst``... for the text formats)."""
    schema_text: str = Field(default="", alias="schema")
    """CSV/JSON Lines: declared column types, ``id:int64,features:vector[float32,16]``
    (``rowbatch-producer``'s ``--schema``); undeclared columns are inferred."""
    table: str = Field(default="backfill", min_length=1)
    """The chunks' table name (the wire header; the result table is ``[sink] table``)."""
    chunk_rows: int = Field(default=1024, ge=1, le=1_000_000)
    """Rows per chunk: the unit of progress (a kill redoes at most the chunks in flight)
    and of the keys. Changing it for a run in progress is refused (the keys would change)."""
    state: str = Field(default="rowbatch-state", min_length=1)
    """Where progress and dead letters are kept: a directory or an object-store URL, one
    folder per shard (``shard-K-of-N/``). Must outlive a pod (a volume, or an object store)
    for a rerun to resume."""
    shards: int = Field(default=1, ge=1, le=100_000)
    """How many workers split the input (by file and Parquet row group, deterministically)."""
    shard: int | None = Field(default=None, ge=0)
    """This worker's shard; unset: ``$JOB_COMPLETION_INDEX`` (an Indexed Job), else 0."""
    new_run: bool = False
    """Start over (forget the progress under ``state`` for this shard) instead of resuming;
    needed when the model, its version, the binding or ``chunk_rows`` changed."""
    max_delivery_attempts: int = Field(default=5, ge=1)
    """A chunk the model fails for good (an error that is neither transient nor about its
    rows: Triton's INTERNAL, an OpenAI-compatible server's 500) goes round again this many
    times at most; then its rows are dead-lettered as ``too-many-attempts`` (a table run
    ends; a broker's consumer has the same setting)."""
    read_ahead_chunks: int = Field(default=8, ge=1, le=1024)
    """Chunks read and encoded ahead of the engine (besides the engine's own work bound)."""
    progress_interval_s: float = Field(default=10.0, gt=0)
    """How often a progress line is logged (a terminal gets a live bar instead)."""

    model_config = Section.model_config | {"populate_by_name": True}

    @model_validator(mode="after")
    def _shard_in_range(self) -> TableSettings:
        if self.shard is not None and self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} is not below shards = {self.shards}")
        return self

    def shard_index(self) -> int:
        """This worker's shard: ``shard``, else ``$JOB_COMPLETION_INDEX``, else 0."""
        if self.shard is not None:
            return self.shard
        text = os.environ.get(JOB_INDEX_VARIABLE)
        if text is None:
            if self.shards > 1:
                raise ValueError(
                    f"shards = {self.shards} but no shard is given: set [source] shard, "
                    f"--shard K/N, or run as an Indexed Job (${JOB_INDEX_VARIABLE})"
                )
            return 0
        if not text.isdigit() or int(text) >= self.shards:
            raise ValueError(
                f"${JOB_INDEX_VARIABLE} = {text!r} is not a shard index below shards = "
                f"{self.shards} (the Job's completions must equal [source] shards)"
            )
        return int(text)


def table_write_rows(batch_rows: int, in_flight: int, write_concurrency: int) -> int:
    """Most rows of one sink write in a table run whose ``[sink] max_write_rows`` is not set:
    the writes under way together hold at most one batch per in-flight slot (one per writer
    when there are more writers than slots). Their rows are what a kill can make a rerun redo
    (written, not yet recorded in the progress)."""
    return batch_rows * max(1, in_flight // write_concurrency)


__all__ = ["JOB_INDEX_VARIABLE", "TableSettings", "table_write_rows"]
