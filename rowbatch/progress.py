"""A progress line (rows, rows/s, ETA) and a final summary, for the publishing CLI and the
consumer's table runs.

No dependency: one line on stderr, redrawn with ``\\r`` at most every ``interval_s`` on a
terminal (``bar``), or written as a plain line every ``log_interval_s`` (``log``, for logs of
jobs). The clock is injectable so tests need no sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal, TextIO

from rowbatch.timing import Clock

ProgressMode = Literal["auto", "bar", "log", "none"]

_BAR_WIDTH: Final = 24


def format_duration(seconds: float) -> str:
    whole = max(round(seconds), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"  # pragma: no cover


class Progress:
    """Tracks acknowledged rows/chunks/bytes and draws them.

    ``total_rows`` (known for Parquet, for the load generator) gives a bar and an ETA;
    otherwise ``estimate_rows`` (extrapolated from the bytes of the file read so far) does.
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        mode: ProgressMode = "auto",
        total_rows: int | None = None,
        estimate_rows: Callable[[], float | None] | None = None,
        clock: Clock = time.monotonic,
        interval_s: float = 0.2,
        log_interval_s: float = 10.0,
    ) -> None:
        if mode == "auto":
            isatty = getattr(stream, "isatty", None)
            mode = "bar" if callable(isatty) and isatty() else "none"
        self._stream = stream
        self.mode = mode
        self.total_rows = total_rows
        self._estimate = estimate_rows
        self._clock = clock
        self._interval = interval_s if mode == "bar" else log_interval_s
        self._started = clock()
        # A log line comes after the first interval; a bar is drawn at once.
        self._last_draw: float | None = None if mode == "bar" else self._started
        self._width = 0
        self.rows = 0
        self.chunks = 0
        self.bytes = 0

    def add(self, *, rows: int, chunks: int = 1, nbytes: int = 0) -> None:
        self.rows += rows
        self.chunks += chunks
        self.bytes += nbytes
        now = self._clock()
        if self.mode != "none" and (
            self._last_draw is None or now - self._last_draw >= self._interval
        ):
            self._draw(now)

    def _total(self) -> tuple[float | None, bool]:
        """The total rows and whether it is exact."""
        if self.total_rows is not None:
            return float(self.total_rows), True
        if self._estimate is not None:
            return self._estimate(), False
        return None, False

    def render(self, now: float | None = None) -> str:
        now = self._clock() if now is None else now
        elapsed = max(now - self._started, 1e-9)
        rate = self.rows / elapsed
        parts = []
        total, exact = self._total()
        done: float | None = None
        if total:
            done = min(self.rows / total, 1.0)
            parts.append(f"{self.rows:,}/{'' if exact else '~'}{total:,.0f} rows")
        else:
            parts.append(f"{self.rows:,} rows")
        if done is not None:
            filled = int(done * _BAR_WIDTH)
            parts.append(f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {done * 100:3.0f}%")
        parts.append(f"{rate:,.0f} rows/s")
        if done is not None and 0 < done < 1:
            parts.append(f"ETA {format_duration(elapsed * (1 - done) / done)}")
        parts.append(f"{self.chunks:,} chunks, {format_bytes(self.bytes)}")
        parts.append(format_duration(elapsed))
        return "  ".join(parts)

    def _draw(self, now: float) -> None:
        self._last_draw = now
        line = self.render(now)
        if self.mode == "bar":
            pad = max(self._width - len(line), 0)
            self._stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def finish(self) -> None:
        """Draws the final state and ends the bar's line."""
        if self.mode == "none":
            return
        self._draw(self._clock())
        if self.mode == "bar":
            self._stream.write("\n")
            self._stream.flush()


@dataclass(frozen=True)
class Summary:
    """What a publishing run did; ``line()`` is the human summary the CLI prints."""

    broker: str
    topic: str
    encoding: str
    rows: int
    chunks: int
    bytes: int
    seconds: float
    id_prefix: str
    complete: bool = True

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        verb = "published" if self.complete else "published before the error"
        return (
            f"{verb}: {self.rows:,} rows, {self.chunks:,} chunks, {self.bytes:,} bytes in "
            f"{self.seconds:.2f} s = {self.rows_per_s:,.0f} rows/s ({self.encoding}, "
            f"{self.broker} topic {self.topic}, chunk ids {self.id_prefix}:N)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "broker": self.broker,
            "topic": self.topic,
            "encoding": self.encoding,
            "rows": self.rows,
            "chunks": self.chunks,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 6),
            "rows_per_s": round(self.rows_per_s, 1),
            "id_prefix": self.id_prefix,
            "complete": self.complete,
        }


__all__ = ["Progress", "ProgressMode", "Summary", "format_bytes", "format_duration"]
