"""A table run's state folder (``<state>/shard-K-of-N/``, a directory or an object-store prefix):
files written whole, once, and never appended to, so the same code serves a local volume and an
object store (where a PUT is atomic). A segment ends with the line ``end``: one cut short by a
kill is ignored when read back. :meth:`StateFolder.write_whole` needs no such line: on a local
disk it writes a hidden temporary file and renames it into place, so a file is there whole or
not at all."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

import pyarrow as pa
import pyarrow.fs as pafs

from rowbatch.consumer.sources.table.plan import TableInputError, open_filesystem

END: Final = "end"


class StateFolder:
    """One folder of files; every method blocks (call them off the event loop)."""

    def __init__(self, location: str, name: str) -> None:
        self.fs, root = open_filesystem(location)
        self.path = root.rstrip("/") + "/" + name
        self.location = location.rstrip("/") + "/" + name
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._seq = 0
        self._lock = threading.Lock()
        self._tag = f"{time.time_ns()}-{os.getpid()}"
        try:
            self.fs.create_dir(self.path, recursive=True)
        except (pa.ArrowException, OSError) as exc:
            raise TableInputError(f"state {self.location}: cannot create it: {exc}") from exc

    def names(self, prefix: str) -> list[str]:
        """The files whose name starts with ``prefix``, in name order."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return sorted(
            i.base_name
            for i in infos
            if i.type == pafs.FileType.File and i.base_name.startswith(prefix)
        )

    def read(self, name: str) -> str | None:
        try:
            with self.fs.open_input_stream(f"{self.path}/{name}") as stream:
                return bytes(stream.read()).decode()
        except FileNotFoundError:
            return None

    def write(self, name: str, text: str) -> None:
        """Writes ``name`` whole; on a local disk it is on stable storage when this returns."""
        target = f"{self.path}/{name}"
        if self._local:
            with Path(target).open("w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            return
        with self.fs.open_output_stream(target) as stream:
            stream.write(text.encode())

    def write_whole(self, name: str, text: str) -> None:
        """Writes ``name`` whole or not at all, on stable storage when this returns: on a local
        disk into ``.<name>.tmp`` (hidden: no prefix of :meth:`names` but ``""`` finds it),
        synced, then renamed into place; on an object store in one PUT, which is atomic."""
        if not self._local:
            self.write(name, text)
            return
        target = Path(self.path) / name
        temporary = target.with_name(f".{name}.tmp")
        with temporary.open("w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        temporary.replace(target)
        directory = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself
        finally:
            os.close(directory)

    def new_name(self, prefix: str, suffix: str = "") -> str:
        """A name no other file of the folder has: ``<prefix>-<time>-<pid>-<seq><suffix>``
        (in write order, within a process)."""
        with self._lock:
            self._seq += 1
            return f"{prefix}-{self._tag}-{self._seq:08d}{suffix}"

    def write_segment(self, prefix: str, lines: Iterable[str]) -> str:
        """A new segment ``<prefix>-<time>-<pid>-<seq>`` of ``lines`` and the ``end`` line."""
        name = self.new_name(prefix)
        self.write(name, "".join(f"{line}\n" for line in lines) + END + "\n")
        return name

    def read_segment(self, name: str) -> list[str] | None:
        """A segment's lines, or None when it was cut short (no ``end``)."""
        text = self.read(name)
        if text is None:
            return None
        lines = text.split("\n")
        if len(lines) < 2 or lines[-2] != END or lines[-1] != "":
            return None
        return lines[:-2]

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            self.fs.delete_file(f"{self.path}/{name}")


__all__ = ["END", "StateFolder"]
