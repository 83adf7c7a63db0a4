"""Per-message completion: a message may span several batches; it is settled (acked, or
dead-lettered) only when every one of its rows is resolved (written, or failed)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery


@dataclass
class Entry:
    """One in-flight message."""

    key: int
    delivery: Delivery
    chunk_id: str
    rows: int
    reserved_bytes: int
    """What the message holds of the memory budget; released when it is settled."""
    accepted_at: float
    unresolved: int = field(init=False)
    failure: DeadLetterReason | None = None
    """Set when the message failed for good as a whole: it is dead-lettered whole."""
    written_rows: int = 0
    row_keys: NDArray[np.int64] | None = None
    """A row part's keys in its parent chunk (``chunk_id`` is the parent's); None: row ``i``
    is keyed ``i``."""
    failed_rows: tuple[tuple[int, DeadLetterReason], ...] = ()
    """Rows (indexes in the message) that failed for good on their own, with why: the message
    is acked once its other rows are written and these are dead-lettered as a row part (a
    tuple, grown only on failure: nothing is allocated for it per message)."""
    positions: NDArray[np.int64] | None = None
    """The message's indexes of the rows queued when some were set apart at intake (failed
    from the start, in ``failed_rows``, or queued last as error rows); None: the queued row
    ``i`` is the message's row ``i``."""

    def in_message(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Queued rows ``[start, stop)`` as runs ``[low, high)`` of the message's rows."""
        positions = self.positions
        if positions is None:
            return [(start, stop)]
        rows = positions[start:stop].tolist()
        runs: list[tuple[int, int]] = []
        for row in rows:
            if runs and runs[-1][1] == row:
                runs[-1] = (runs[-1][0], row + 1)
            else:
                runs.append((row, row + 1))
        return runs

    def __post_init__(self) -> None:
        self.unresolved = self.rows


class Ledger:
    def __init__(self) -> None:
        self._entries: dict[int, Entry] = {}
        self._keys = itertools.count()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: int) -> bool:
        return key in self._entries

    def open(
        self,
        delivery: Delivery,
        chunk_id: str,
        rows: int,
        reserved_bytes: int,
        accepted_at: float,
        row_keys: NDArray[np.int64] | None = None,
        failed_rows: tuple[tuple[int, DeadLetterReason], ...] = (),
        positions: NDArray[np.int64] | None = None,
    ) -> Entry:
        """Message ``delivery`` of ``rows`` rows, in flight. ``failed_rows``: those that failed
        already (at intake; resolved from the start); ``positions``: the message's index of
        each row queued, where the queue's order is not the message's (rows set apart at
        intake: left out, or queued after the others as error rows)."""
        entry = Entry(next(self._keys), delivery, chunk_id, rows, reserved_bytes, accepted_at)
        if row_keys is not None:
            entry.row_keys = row_keys
        if failed_rows:
            entry.failed_rows = failed_rows
            entry.unresolved -= len(failed_rows)
        entry.positions = positions
        self._entries[entry.key] = entry
        return entry

    def get(self, key: int) -> Entry:
        return self._entries[key]

    def written(self, key: int, rows: int) -> Entry | None:
        """``rows`` of message ``key`` are durably written; returns the entry once it is
        complete (and forgets it). A message already abandoned is ignored."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        entry.written_rows += rows
        return self._resolve(entry, rows)

    def failed(self, key: int, rows: int, reason: DeadLetterReason) -> Entry | None:
        """``rows`` of message ``key`` failed for good; the message will be dead-lettered.
        Returns the entry once every row is resolved (and forgets it)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.failure is None:
            entry.failure = reason
        return self._resolve(entry, rows)

    def failed_rows(
        self, key: int, start: int, stop: int, reason: DeadLetterReason
    ) -> Entry | None:
        """Queued rows ``[start, stop)`` of message ``key`` failed for good on their own: they
        will be dead-lettered as a row part and the rest of the message written and acked.
        Returns the entry once every row is resolved (and forgets it)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        positions = entry.positions
        rows = range(start, stop) if positions is None else positions[start:stop].tolist()
        entry.failed_rows += tuple((row, reason) for row in rows)
        return self._resolve(entry, stop - start)

    def _resolve(self, entry: Entry, rows: int) -> Entry | None:
        if rows > entry.unresolved:
            raise ValueError(
                f"message {entry.delivery.message_id}: {rows} rows resolved but only "
                f"{entry.unresolved} were outstanding"
            )
        entry.unresolved -= rows
        if entry.unresolved == 0:
            del self._entries[entry.key]
            return entry
        return None

    def abandon(self, key: int) -> Entry:
        """Forget message ``key`` whatever its rows' state (it will be nacked and redelivered;
        rows written meanwhile are rewritten idempotently)."""
        return self._entries.pop(key)

    def unsettled(self) -> list[Entry]:
        """Messages not yet complete (for shutdown: they are nacked)."""
        return list(self._entries.values())

    def oldest_accepted_at(self) -> float | None:
        return min((e.accepted_at for e in self._entries.values()), default=None)

    def oldest_published_at(self) -> float | None:
        """The publish time (Unix seconds) of the oldest message not yet settled: the age of
        the oldest row received and not yet written is now minus this."""
        return min((e.delivery.publish_time for e in self._entries.values()), default=None)
