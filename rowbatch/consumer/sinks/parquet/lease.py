"""The Parquet dataset's writer lease: ``_rowbatch/writer.json`` in the dataset names the one
sink writing it (its host and key index) and when it last renewed the lease. The key index keeps
writes idempotent for one writer only, so a second writer anywhere (another host on the same
bucket, a pod rescheduled while the old one still runs) is refused while the lease is fresh, and
a writer that finds its lease taken by another stops instead of writing on.

Best effort on object stores (no create-if-absent through pyarrow): two writers starting within
the same moment are not told apart; everything slower than that is."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import pyarrow.fs as pafs

from rowbatch.consumer.sinks.base import SinkError, SinkUnavailable

LEASE_S: Final = 120.0
"""A lease not renewed for this long has lapsed (its writer is gone): another may take it."""
RENEW_S: Final = LEASE_S / 4
"""A writer renews its lease when it writes or commits this long after the last renewal."""
LEASE_FILE: Final = "_rowbatch/writer.json"


class WriterLease:
    """The lease of the writer ``me`` on the dataset at ``root`` of ``fs``."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        root: str,
        index_path: Path,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._fs = fs
        self._path = f"{root}/{LEASE_FILE}"
        self.me = f"{socket.gethostname()}:{index_path}"
        """Who writes: the host and the key index (a restart on the same host with the same
        index is the same writer; its index lock keeps two processes apart)."""
        self._clock = clock
        self._renewed: float | None = None

    def _holder(self) -> tuple[str, float] | None:
        try:
            with self._fs.open_input_stream(self._path) as src:
                data = json.loads(src.read())
            return str(data["writer"]), float(data["renewed_at"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError):
            return None  # unreadable: nobody's

    def _write(self) -> None:
        now = self._clock()
        self._fs.create_dir(self._path.rpartition("/")[0], recursive=True)
        with self._fs.open_output_stream(self._path) as out:
            out.write(json.dumps({"writer": self.me, "renewed_at": now}).encode())
        self._renewed = now

    def acquire(self) -> None:
        """Takes the lease; :class:`SinkUnavailable` while another writer's is fresh (start-up
        waits for it to end or lapse, ``sink.startup_wait_s``)."""
        held = self._holder()
        if held is not None and held[0] != self.me:
            age = self._clock() - held[1]
            if age < LEASE_S:
                raise SinkUnavailable(
                    f"the Parquet dataset is being written by {held[0]} (its lease renewed "
                    f"{max(0.0, age):.0f} s ago): one writer per dataset; waiting for it to "
                    f"stop or for its lease to lapse ({LEASE_S:.0f} s without renewal)"
                )
        self._write()

    def renew(self) -> None:
        """Renews the lease when due; :class:`SinkError` when another writer took it (this one
        had let it lapse): this sink must not write on."""
        if self._renewed is not None and self._clock() - self._renewed < RENEW_S:
            return
        held = self._holder()
        if held is not None and held[0] != self.me:
            raise SinkError(
                f"the Parquet dataset's writer lease was taken by {held[0]} after this writer's "
                "lapsed: stopping, so that two writers never write one dataset"
            )
        self._write()

    def release(self) -> None:
        """Gives the lease up (only if it is still this writer's)."""
        held = self._holder()
        if held is not None and held[0] == self.me:
            self._fs.delete_file(self._path)
        self._renewed = None
