"""A piece of a table as the chunk the engine reads (Arrow IPC payload and headers, exactly what a
producer would publish), and the rows that cannot be one: a piece that does not convert to the
wire types is cut in halves until every failing row stands alone, so one bad value costs its
own row, not its chunk's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.consumer.sources.table.reader import Piece
from rowbatch.tables.convert import wire_columns
from rowbatch.tables.errors import InputError
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.columns.column_type import ColumnType
from rowbatch.wire.dead_letter import ReasonClass
from rowbatch.wire.errors import WireError


@dataclass
class Encoded:
    """What :func:`encode_piece` made of a piece."""

    chunks: list[tuple[Piece, EncodedChunk]] = field(default_factory=list)
    """The parts that encode, in row order (the whole piece when nothing failed)."""
    bad: list[tuple[Piece, DeadLetterReason]] = field(default_factory=list)
    """Single rows that do not, with why."""


def _encode(piece: Piece, table: str, schema: Mapping[str, ColumnType]) -> EncodedChunk:
    columns, types = wire_columns(
        piece.table, schema, source=piece.unit.file.relative, first_row=piece.first_row
    )
    return encode_chunk(table, columns, "arrow", piece.chunk_id, schema=types)


MALFORMED_LINE: Final = "malformed_line"
"""The dead-letter code of a line of a text file that is no row (:attr:`Piece.bad_line`)."""


def _reason(exc: Exception) -> DeadLetterReason:
    code = exc.reason if isinstance(exc, WireError) else "invalid_value"
    return DeadLetterReason(ReasonClass.UNDECODABLE, f"{code}: {exc}", code)


def encode_piece(piece: Piece, table: str, schema: Mapping[str, ColumnType]) -> Encoded:
    """The piece as chunks: one, unless some rows do not convert (bisected; see the module's
    docstring). Each part keeps its rows' keys: its id is ``<file>@<its first row>``."""
    out = Encoded()
    if piece.bad_line is not None:
        reason = DeadLetterReason(ReasonClass.UNDECODABLE, piece.bad_line.message, MALFORMED_LINE)
        out.bad.append((piece, reason))
        return out

    def visit(part: Piece) -> None:
        try:
            out.chunks.append((part, _encode(part, table, schema)))
        except (InputError, WireError) as exc:
            if part.rows == 1:
                out.bad.append((part, _reason(exc)))
                return
            half = part.rows // 2
            visit(part.part(0, half))
            visit(part.part(half, part.rows - half))

    visit(piece)
    return out


__all__ = ["MALFORMED_LINE", "Encoded", "encode_piece"]
