"""Planning the messages of a run: each chunk's rows, split to the message limit when valid, or
made malformed as planned; lazily, chunk by chunk."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rowbatch.producer.loadgen.generate import generate_columns
from rowbatch.producer.loadgen.malformed import malformed_message, plan_malformed, with_marker
from rowbatch.producer.loadgen.spec import LoadSpec, MalformedKind
from rowbatch.producer.publishers.messages import Message
from rowbatch.wire.chunks.encode import EncodedChunk
from rowbatch.wire.chunks.split import split_rows


@dataclass(frozen=True)
class PlannedMessage:
    """One message to send, with what the manifest needs to know of it."""

    message: Message
    chunk_id: str
    rows: int
    first_id: int
    kind: MalformedKind | None = None
    reason: str | None = None
    marker_id: int | None = None


def plan_chunk(
    spec: LoadSpec,
    index: int,
    kind: MalformedKind | None,
    *,
    max_chunk_bytes: int,
) -> list[PlannedMessage]:
    """The message(s) for chunk ``index``: valid chunks are split to fit ``max_chunk_bytes``;
    malformed ones are one message each and checked to fail as documented."""
    columns = generate_columns(spec, index)
    first = index * spec.chunk_rows
    rows = len(columns["id"])
    chunk_id = spec.chunk_id(index)
    if kind is None or kind is MalformedKind.REJECT_MARKER:
        marker_row = None
        if kind is MalformedKind.REJECT_MARKER:
            rng = np.random.default_rng([spec.seed, 2, index])
            marker_row = int(rng.integers(0, rows))
            columns = with_marker(columns, marker_row, spec.reject_marker or "")
        parts = split_rows_for(spec, columns, chunk_id, max_chunk_bytes)
        out = []
        start = 0
        for part in parts:
            n = part.headers.row_count
            holds_marker = marker_row is not None and start <= marker_row < start + n
            out.append(
                PlannedMessage(
                    part,
                    part.headers.chunk_id,
                    n,
                    first + start,
                    kind if holds_marker else None,
                    None,
                    first + marker_row if holds_marker and marker_row is not None else None,
                )
            )
            start += n
        return out
    message, reason = malformed_message(
        spec, kind, columns, chunk_id, rows, max_chunk_bytes=max_chunk_bytes
    )
    return [PlannedMessage(message, chunk_id, rows, first, kind, reason)]


def split_rows_for(
    spec: LoadSpec, columns: Mapping[str, pa.Array], chunk_id: str, max_chunk_bytes: int
) -> list[EncodedChunk]:
    return split_rows(
        spec.table,
        columns,
        spec.encoding,
        chunk_id,
        max_bytes=max_chunk_bytes,
        schema=spec.schema(),
    )


def plan_messages(spec: LoadSpec, *, max_chunk_bytes: int) -> Iterator[PlannedMessage]:
    """Every message of the run, chunk by chunk, lazily."""
    malformed = plan_malformed(spec)
    for index in range(spec.chunks):
        yield from plan_chunk(spec, index, malformed.get(index), max_chunk_bytes=max_chunk_bytes)


__all__ = ["PlannedMessage", "plan_chunk", "plan_messages", "split_rows_for"]
