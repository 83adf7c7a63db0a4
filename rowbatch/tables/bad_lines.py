"""Reading a text input (CSV, JSON Lines) so that a malformed line costs that line only: the
input is cut into blocks that end where a line (a CSV record) ends, each block parsed whole by
Arrow (the fast path); only a block that fails is read again line by line, its good lines kept
and each bad one handed out as a :class:`BadLine` in its place (its data row index counted, so
the rows after it keep theirs)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import pyarrow as pa

TEXT_MAX: Final = 1000
"""A bad line's text is kept up to this many characters."""


@dataclass(frozen=True)
class BadLine:
    """A line of the input that is no row: where it is and why."""

    row: int
    """Its data row index in the file (0-based; bad lines count, so the rows keep theirs)."""
    line: int
    """The file's line it begins on (1-based; a CSV header is line 1)."""
    text: str
    """Its raw text, up to :data:`TEXT_MAX` characters."""
    message: str
    """``line 150001: expected 5 fields, found 6``."""


def clip(raw: bytes) -> str:
    """A line's raw text for a :class:`BadLine`: decoded (bad bytes replaced), without its
    line break, at most :data:`TEXT_MAX` characters."""
    text = raw[: TEXT_MAX * 4].decode("utf-8", errors="replace").rstrip("\r\n")
    return text if len(text) <= TEXT_MAX else text[: TEXT_MAX - 3] + "..."


def count_lines(data: bytes) -> int:
    """Line breaks in ``data`` (``\\n``, ``\\r\\n`` or a lone ``\\r``)."""
    n = data.count(b"\n")
    if b"\r" in data:
        n += data.count(b"\r") - data.count(b"\r\n")
    return n


class Blocks:
    """``stream`` read ``block_bytes`` at a time, handed out in blocks that end where ``cut``
    says the last whole record ends (the index after it; 0: none yet, so the block grows);
    :meth:`unread` gives the tail of a block back, to begin the next one."""

    def __init__(self, stream: Any, block_bytes: int, cut: Callable[[bytes], int]) -> None:
        self._stream = stream
        self._block_bytes = block_bytes
        self._cut = cut
        self._pending = b""
        self.at_end = False
        """The last block handed out ends the input."""

    def unread(self, tail: bytes) -> None:
        self._pending = tail + self._pending
        self.at_end = False

    def next(self) -> bytes | None:
        """The next block, or None at the input's end."""
        while True:
            data = b"" if self.at_end else self._stream.read(self._block_bytes)
            if not data:
                block, self._pending = self._pending, b""
                self.at_end = True
                return block or None
            buf = self._pending + data if self._pending else bytes(data)
            end = self._cut(buf)
            if end:
                self._pending = buf[end:]
                return buf[:end]
            self._pending = buf  # a record longer than a block: read on


T = TypeVar("T")


def bisect(
    items: Sequence[T], parse: Callable[[Sequence[T]], pa.Table | None]
) -> Iterator[pa.Table | T]:
    """``items`` parsed by ``parse`` (None: they do not parse), in order: the tables of the
    runs that parse, and each item that does not parse alone; runs that fail are cut in
    halves (the left one first)."""
    if not items:
        return
    table = parse(items)
    if table is not None:
        yield table
    elif len(items) == 1:
        yield items[0]
    else:
        half = len(items) // 2
        yield from bisect(items[:half], parse)
        yield from bisect(items[half:], parse)


__all__ = ["TEXT_MAX", "BadLine", "Blocks", "bisect", "clip", "count_lines"]
