"""Put the consumer's libraries in a known page-cache state before a memory measurement.

A process's peak RSS (VmHWM) counts the pages of the shared libraries it maps, and how many it
maps is the kernel's choice: a library that was read whole beforehand (pip copying it, a
checksum, ``cat``) sits in the page cache in large folios, and each fault then maps more of it.
The same consumer measured 50 MiB of library file pages from a cold cache and 89 MiB in a fresh
clone's CI venv (docs/memory.md). :func:`evict_libraries` drops the clean, unmapped pages of
every shared library under the interpreter's prefix and the venv (``posix_fadvise``
``DONTNEED``; no privilege needed), so the process maps them as from a cold cache, the state the
memory promise is stated for. Pages another running process maps stay (the kernel keeps them)."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Evicted:
    """What :func:`evict_libraries` asked the kernel to drop."""

    files: int
    bytes: int

    def describe(self) -> str:
        return f"{self.files} shared libraries ({self.bytes / 2**20:,.0f} MiB) evicted"


def _libraries(roots: list[Path]) -> list[Path]:
    seen: set[Path] = set()
    found: list[Path] = []
    for root in roots:
        for path in root.rglob("*.so*"):
            real = path.resolve()
            if real in seen or not real.is_file():
                continue
            seen.add(real)
            found.append(real)
    return found


def evict_libraries(roots: list[Path] | None = None) -> Evicted:
    """Drop the cached pages of the shared libraries under ``roots`` (default: the venv and the
    base interpreter's prefix) that no process maps."""
    if roots is None:
        roots = sorted({Path(sys.prefix), Path(sys.base_prefix)})
    files = total = 0
    for path in _libraries(roots):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            files += 1
            total += os.fstat(fd).st_size
        except OSError:
            pass
        finally:
            os.close(fd)
    return Evicted(files, total)
