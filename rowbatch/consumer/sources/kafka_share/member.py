"""One member of a share group: a share consumer (confluent-kafka's, synchronous, one instance
per thread) on a thread of its own. It polls a batch of records, hands them to the source,
and acknowledges each as the source settles it (accept, release, reject); only once every
record of the batch is acknowledged does it commit the acknowledgements and poll again (in
explicit mode the client refuses a poll before). While paused it does not poll: records are
never released to wait out an outage (a release counts a delivery)."""

from __future__ import annotations

import enum
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.5
"""How long one poll waits for records (and how soon a member notices a stop or a pause)."""
COMMIT_TIMEOUT_S = 10.0


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


Handoff = Callable[["Member", Sequence[ShareRecord]], None]
"""Given each poll's records (called on the member's thread; the source passes them to its
event loop)."""


class Member:
    """A share consumer on its thread. ``ack_types`` maps :class:`Ack` to the client's
    ``AcknowledgeType`` values; ``on_late_ack`` is told of each acknowledgement the broker
    refused at commit (its lock had expired: the record was delivered again meanwhile)."""

    def __init__(
        self,
        index: int,
        client: Callable[[], ShareClient],
        topic: str,
        handoff: Handoff,
        ack_types: dict[Ack, Any],
        on_late_ack: Callable[[int], None] = lambda n: None,
    ) -> None:
        self.index = index
        self._client = client
        self._topic = topic
        self._handoff = handoff
        self._ack_types = ack_types
        self._on_late_ack = on_late_ack
        self._acks: queue.SimpleQueue[tuple[tuple[int, int], Ack] | None] = queue.SimpleQueue()
        self._running = threading.Event()
        self._running.set()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rowbatch-share-{index}")
        self.failure: BaseException | None = None
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
        try:
            client = self._client()
        except BaseException as exc:  # noqa: BLE001  # the source reports it (its deliveries end)
            self.failure = exc
            return
        try:
            client.subscribe([self._topic])
            while True:
                if not self._running.wait(POLL_TIMEOUT_S):
                    continue  # paused: no poll, nothing released
                if self._stopping.is_set():
                    break
                self._one_batch(client)
        except BaseException as exc:
            self.failure = exc
            log.exception("share consumer %d failed", self.index)
        finally:
            try:
                client.close()
            except Exception:
                log.exception("closing share consumer %d failed", self.index)

    def _one_batch(self, client: ShareClient) -> None:
        held: dict[tuple[int, int], Any] = {}
        for message in client.poll(POLL_TIMEOUT_S):
            error = message.error()
            if error is not None:
                log.warning("share consumer %d: %s", self.index, error)
                continue
            held[(message.partition() or 0, message.offset() or 0)] = message
        if not held:
            return
        self.records += len(held)
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
            self._on_late_ack(len(refused))
            log.warning(
                "share consumer %d: the broker refused acknowledgements of %d partition(s) "
                "(their locks had run out: the records were delivered again): %s",
                self.index,
                len(refused),
                refused[0][1],
            )
