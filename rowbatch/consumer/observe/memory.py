"""Where the process's memory is, by the tool made for each part, for the memory split
(``rowbatch_memory_bytes{part}``, docs/memory.md):

- ``rss``: the process's resident set (``/proc/self/statm``);
- ``malloc_in_use``: what glibc's malloc has handed out and not had back (``mallinfo2``:
  ``uordblks + hblkhd``): numpy arrays, Python objects above 512 bytes, pyarrow buffers
  (the system pool), gRPC and protobuf buffers, SQLite and libpq;
- ``malloc_kept``: what malloc holds freed and has not given back to the system
  (``fordblks``): the allocator's slack, in RSS as far as it was touched;
- ``arrow_pool``: what pyarrow's pool has handed out (``bytes_allocated``), when pyarrow is
  loaded;
- ``python_traced``: what ``tracemalloc`` traces (Python objects and numpy data), only while
  tracing (``PYTHONTRACEMALLOC=1``: slow, for diagnosis).

And the one knob that makes RSS follow what is in use: :func:`return_freed_memory` fixes
glibc's mmap threshold (so large buffers are mapped and unmapped, never left in an arena)
and :func:`trim` hands the arenas' free tops back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

_PAGE: Final = os.sysconf("SC_PAGE_SIZE")
_STATM: Final = Path("/proc/self/statm")
M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
M_ARENA_MAX: Final = -8

MMAP_THRESHOLD_BYTES: Final = 256 * 1024
"""Allocations of at least this many bytes get their own mapping, returned to the system when
freed. glibc's default starts at 128 KiB but *raises* the threshold to the size of every
mapped block freed (up to 32 MiB), after which a batch's megabytes of outputs, pages and COPY
buffers come from the arenas and stay in RSS once freed (fragmented, trimmed only from the
top). Fixing it stops that; 256 KiB keeps small objects (every Python object, 1-row
messages) in the arenas, where they are fast."""
TRIM_THRESHOLD_BYTES: Final = 4 * 1024 * 1024
"""Free memory at the top of the main arena above this is given back at once (glibc's default
128 KiB also stops adjusting once the mmap threshold is fixed; 4 MiB avoids trimming and
growing the heap at every batch)."""
ARENA_MAX: Final = 2
"""At most this many malloc arenas (glibc's default: 8 per core). Every thread that allocates
(the sink's worker threads, gRPC's, the Pub/Sub client's) otherwise gets an arena of its own,
each keeping its own free memory."""


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "mallinfo2") or not hasattr(libc, "mallopt"):
        return None  # not glibc (musl), or glibc < 2.33
    libc.mallinfo2.restype = _MallInfo2
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


_LIBC: Final = _libc()


@dataclass(frozen=True)
class MemorySplit:
    """One reading of the process's memory, in bytes (-1: not known on this platform)."""

    rss: int
    malloc_in_use: int
    malloc_kept: int
    arrow_pool: int
    python_traced: int

    def parts(self) -> dict[str, int]:
        return {
            "rss": self.rss,
            "malloc_in_use": self.malloc_in_use,
            "malloc_kept": self.malloc_kept,
            "arrow_pool": self.arrow_pool,
            "python_traced": self.python_traced,
        }


def rss_bytes() -> int:
    try:
        return int(_STATM.read_text(encoding="ascii").split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return -1


def _arrow_allocated() -> int:
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None:
        return 0
    return int(pyarrow.default_memory_pool().bytes_allocated())


def read_split() -> MemorySplit:
    """The process's memory now (cheap: a file read and one ``mallinfo2``)."""
    in_use = kept = -1
    if _LIBC is not None:
        info = _LIBC.mallinfo2()
        in_use, kept = info.uordblks + info.hblkhd, info.fordblks
    traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else -1
    return MemorySplit(rss_bytes(), in_use, kept, _arrow_allocated(), traced)


def return_freed_memory(mallopt: Callable[[int, int], int] | None = None) -> bool:
    """Make freed memory leave RSS: a fixed mmap threshold, a trim threshold and at most
    ``ARENA_MAX`` arenas (see the constants). Returns whether glibc took the settings (not on
    another libc). Call once at start-up, before the pipeline's threads start."""
    if mallopt is None:
        if _LIBC is None:
            return False
        mallopt = _LIBC.mallopt
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (M_ARENA_MAX, ARENA_MAX),
        )
    )
    if not ok:
        log.warning("mallopt refused a setting: freed memory may stay in RSS")
    return use_system_arrow_pool() and ok


def use_system_arrow_pool() -> bool:
    """pyarrow's buffers from malloc (its ``system`` pool) instead of its bundled allocator,
    which keeps freed memory for reuse: then the mmap threshold returns them too, and
    ``malloc_in_use`` counts them. Returns whether pyarrow took it (not when absent)."""
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")  # if imported later
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None:
        return True
    try:
        pyarrow.set_memory_pool(pyarrow.system_memory_pool())
    except (AttributeError, NotImplementedError):
        return False
    return True


def trim() -> None:
    """Give the free memory at the top of malloc's arenas back to the system."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class MemoryCollector:
    """``rowbatch_memory_bytes{part}``: :func:`read_split` at every scrape."""

    def __init__(self, read: Callable[[], MemorySplit] = read_split) -> None:
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "rowbatch_memory_bytes",
            "The process's memory by part (docs/memory.md): rss, malloc_in_use, malloc_kept "
            "(freed, kept by the allocator), arrow_pool, python_traced (-1: not measured)",
            labels=["part"],
        )
        for part, value in self._read().parts().items():
            family.add_metric([part], value)
        yield family


TRACE_DIR_ENV: Final = "ROWBATCH_TRACEMALLOC_DIR"
"""Where :func:`dump_traced` writes (default: the system's temporary directory)."""


def dump_traced(
    directory: Path | None = None, *, top: int = 40, clock: Callable[[], float] | None = None
) -> Path | None:
    """While ``tracemalloc`` traces (``PYTHONTRACEMALLOC=N``, N frames a trace), write the
    ``top`` allocation sites by bytes still allocated (grouped by traceback) to a text file
    ``rowbatch-tracemalloc-<pid>-<ms>.txt`` in ``directory`` (``$ROWBATCH_TRACEMALLOC_DIR``,
    else the temporary directory) and return its path; ``None`` when not tracing. The service
    calls it on SIGUSR1: compare two dumps (ready, peak) to see what the volume allocates."""
    if not tracemalloc.is_tracing():
        return None
    import tempfile  # noqa: PLC0415
    import time  # noqa: PLC0415

    where = directory or Path(os.environ.get(TRACE_DIR_ENV) or tempfile.gettempdir())
    now = (clock or time.time)()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        (tracemalloc.Filter(inclusive=False, filename_pattern=tracemalloc.__file__),)
    )
    stats = snapshot.statistics("traceback")
    total = sum(stat.size for stat in stats)
    lines = [
        f"traced {total:,} bytes in {sum(s.count for s in stats):,} blocks, "
        f"{len(stats):,} sites; top {top} by size (rss {rss_bytes():,})"
    ]
    for stat in stats[:top]:
        lines.append(f"{stat.size:>14,} B {stat.count:>10,} blocks")
        lines.extend(f"    {line}" for line in stat.traceback.format(most_recent_first=True))
    path = where / f"rowbatch-tracemalloc-{os.getpid()}-{int(now * 1000)}.txt"
    path.write_text("\n".join(lines) + "\n")
    return path
