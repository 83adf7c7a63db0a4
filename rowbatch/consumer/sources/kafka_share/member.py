"""One member of a share group: a share consumer (confluent-kafka's, synchronous, one instance
per thread) on a thread of its own. It polls a batch of records, hands them to the source,
and acknowledges each as the source settles it (accept, release, reject); only once every
record of the batch is acknowledged does it commit the acknowledgements and poll again (in
explicit mode the client refuses a poll before). While paused it does not poll: records are
never released to wait out an outage (a release counts a delivery).

A client that fails while running (a poll or a commit raising) is closed and made again after a
backoff, for as long as the source runs: what it held unacknowledged comes back from the broker
once its lock runs out (acknowledgements for it that arrive later are dropped, or land on its
redelivery, which the idempotent sink makes harmless). A client that cannot even be made (its
configuration refused) ends the member: :attr:`Member.failure` says why."""

from __future__ import annotations

import enum
import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rowbatch.timing import Backoff

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
"""How long one poll waits for records (and how soon a member notices a stop or a pause)."""
COMMIT_TIMEOUT_S = 10.0
RESTART_BACKOFF = Backoff(initial_s=1.0, max_s=30.0)
"""Waits between remaking a failed share consumer (reset by a batch taken)."""
WARN_EVERY_S = 60.0
"""A poll error of one kind is logged at most once a minute (a broker outage is an error on
every poll)."""


class Ack(enum.Enum):
    ACCEPT = "accept"
    RELEASE = "release"
    REJECT = "reject"


@dataclass(frozen=True, eq=False)
class ShareRecord:
    """A record as the member took it from the client (the client's message objects stay on
    its thread)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]
    delivery_count: int
    timestamp_ms: int


class ShareMessage(Protocol):
    """What the member reads of a ``confluent_kafka.Message``."""

    def error(self) -> Any: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes]] | None: ...
    def timestamp(self) -> tuple[int, int]: ...
    def delivery_count(self) -> int: ...


class ShareClient(Protocol):
    """The part of ``confluent_kafka.ShareConsumer`` a member uses."""

    def subscribe(self, topics: list[str]) -> None: ...
    def poll(self, timeout: float) -> Iterable[ShareMessage]: ...
    def acknowledge(self, message: Any, ack_type: Any) -> None: ...
    def commit_sync(self, timeout: float) -> Any: ...
    def close(self) -> None: ...


def record_of(message: ShareMessage) -> ShareRecord:
    _, timestamp = message.timestamp()
    return ShareRecord(
        topic=message.topic() or "",
        partition=message.partition() or 0,
        offset=message.offset() or 0,
        key=message.key(),
        value=message.value() or b"",
        headers=list(message.headers() or []),
        delivery_count=message.delivery_count(),
        timestamp_ms=timestamp,
    )


def _ignore(_: object) -> None:
    pass


@dataclass(frozen=True)
class MemberEvents:
    """What a member tells its source besides records: ``late_acks(n)``, acknowledgements of
    ``n`` partitions the broker refused at commit (their locks had run out: the records were
    delivered again meanwhile); ``restarted(exc)``, its client failed and is being remade."""

    late_acks: Callable[[int], None] = _ignore
    restarted: Callable[[BaseException], None] = _ignore


Handoff = Callable[["Member", Sequence[ShareRecord]], None]
"""Given each poll's records (called on the member's thread; the source passes them to its
event loop)."""


class Member:
    """A share consumer on its thread. ``ack_types`` maps :class:`Ack` to the client's
    ``AcknowledgeType`` values; ``events`` hears of refused acknowledgements and restarts."""

    def __init__(
        self,
        index: int,
        client: Callable[[], ShareClient],
        topic: str,
        handoff: Handoff,
        ack_types: dict[Ack, Any],
        *,
        events: MemberEvents | None = None,
        backoff: Backoff = RESTART_BACKOFF,
        rng: random.Random | None = None,
    ) -> None:
        self.index = index
        self._client = client
        self._topic = topic
        self._handoff = handoff
        self._ack_types = ack_types
        self._events = events or MemberEvents()
        self._backoff = backoff
        self._rng = rng
        self._failures = 0
        """Failures since the last batch taken (the backoff's attempt)."""
        self._warned: dict[str, float] = {}
        self._acks: queue.SimpleQueue[tuple[tuple[int, int], Ack] | None] = queue.SimpleQueue()
        self._running = threading.Event()
        self._running.set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rowbatch-share-{index}")
        self.failure: BaseException | None = None
        """Why the member ended for good: its client could not be made."""
        self.restarts = 0
        self.holding = False
        """Records of this member's last poll are in the pipeline, not all acknowledged."""
        self.records = 0
        """Records this member took (for reports of each member's share)."""

    def start(self) -> None:
        self._thread.start()

    def settle(self, partition: int, offset: int, ack: Ack) -> None:
        """Acknowledge a record this member handed off (any thread)."""
        self._acks.put(((partition, offset), ack))

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def stop(self) -> None:
        """Ask the thread to end: what it holds unacknowledged is released."""
        self._stopping.set()
        self._running.set()
        self._acks.put(None)

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                client = self._client()
            except BaseException as exc:  # noqa: BLE001  # the source reports it (its deliveries end)
                self.failure = exc
                return
            try:
                self._consume(client)
            except Exception as exc:  # noqa: BLE001  # remade after a backoff, below
                self._failed(exc)
            finally:
                try:
                    client.close()
                except Exception:
                    log.exception("closing share consumer %d failed", self.index)

    def _consume(self, client: ShareClient) -> None:
        client.subscribe([self._topic])
        while True:
            if not self._running.wait(POLL_TIMEOUT_S):
                continue  # paused: no poll, nothing released
            if self._stopping.is_set():
                return
            self._one_batch(client)

    def _failed(self, exc: Exception) -> None:
        """A running client failed: wait (stop cuts it short), then the caller remakes it."""
        self._failures += 1
        self.restarts += 1
        delay = self._backoff.wait(self._failures, self._rng)
        log.warning(
            "share consumer %d failed (%s: %s); what it held unacknowledged comes back once its "
            "lock runs out; making a new one in %.1f s",
            self.index,
            type(exc).__name__,
            exc,
            delay,
            exc_info=exc,
        )
        self._events.restarted(exc)
        self._stopping.wait(delay)

    def _one_batch(self, client: ShareClient) -> None:
        held: dict[tuple[int, int], Any] = {}
        for message in client.poll(POLL_TIMEOUT_S):
            error = message.error()
            if error is not None:
                self._warn(error)
                continue
            held[(message.partition() or 0, message.offset() or 0)] = message
        if not held:
            return
        self._failures = 0
        self.records += len(held)
        self.holding = True
        try:
            self._settle_batch(client, held)
        finally:
            self.holding = False

    def _settle_batch(self, client: ShareClient, held: dict[tuple[int, int], Any]) -> None:
        self._handoff(self, [record_of(m) for m in held.values()])
        while held and not self._stopping.is_set():
            self._apply(client, held, self._acks.get())
        while held:  # stopping: what was settled meanwhile as settled...
            try:
                self._apply(client, held, self._acks.get_nowait())
            except queue.Empty:
                break
        for message in held.values():  # ...and the rest given back
            client.acknowledge(message, self._ack_types[Ack.RELEASE])
        self._commit(client)

    def _warn(self, error: Any) -> None:
        """A poll's error, logged once a minute per kind (the client retries on its own)."""
        kind = str(error.code()) if hasattr(error, "code") else str(error)
        now = time.monotonic()
        last = self._warned.get(kind)
        if last is None or now - last >= WARN_EVERY_S:
            self._warned[kind] = now
            log.warning("share consumer %d: %s", self.index, error)

    def _apply(
        self,
        client: ShareClient,
        held: dict[tuple[int, int], Any],
        item: tuple[tuple[int, int], Ack] | None,
    ) -> None:
        if item is None:  # a wake-up (stop)
            return
        key, ack = item
        message = held.pop(key, None)
        if message is not None:
            client.acknowledge(message, self._ack_types[ack])

    def _commit(self, client: ShareClient) -> None:
        result = client.commit_sync(COMMIT_TIMEOUT_S)
        refused = [
            (tp, error)
            for tp, error in (result.items() if isinstance(result, dict) else ())
            if error is not None
        ]
        if refused:
            self._events.late_acks(len(refused))
            log.warning(
                "share consumer %d: the broker refused acknowledgements of %d partition(s) "
                "(their locks had run out: the records were delivered again): %s",
                self.index,
                len(refused),
                refused[0][1],
            )
