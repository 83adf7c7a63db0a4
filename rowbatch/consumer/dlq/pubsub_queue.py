"""The Pub/Sub dead-letter subscription as a ``DeadLetterQueue``.

Pub/Sub has no way to read a subscription without taking a lease (and snapshots/seek are not
in the emulator, and would need more permissions), so reading pulls every message, holds its
lease (extended to ``LEASE_S`` and renewed while the command runs) so it does not come back in
the same read, and nacks what it only looked at when the command ends: the letters are then
deliverable again at once, as they were. ``remove`` acks. While a command reads, the held
letters are invisible to any other reader of the dead-letter subscription; a command killed
midway leaves them leased for at most ``lease_s`` seconds (``--lease``). Each read counts as a
delivery attempt on the dead-letter subscription (give it no dead-letter policy of its own)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud import pubsub_v1
from google.pubsub_v1 import types as pubsub_types
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.dlq.queue import DeadLetterQueueError
from rowbatch.consumer.sources.pubsub.clients import (
    client_address,
    default_publisher,
    default_subscriber,
)
from rowbatch.consumer.sources.pubsub.settings import RPC_CHUNK, PubSubSettings
from rowbatch.pubsub_env import project_of

LEASE_S: Final = 60
"""The default ack deadline held letters get, renewed every third of it: a command killed
midway hides its letters from other readers (and from its own rerun) for at most this long."""
PULL_BATCH: Final = 500
EMPTY_PULLS: Final = 2
"""Consecutive pulls that return nothing before a read decides the queue has no more."""


class PubSubDeadLetterQueue:
    """The dead-letter subscription of a Pub/Sub consumer configuration."""

    def __init__(
        self,
        settings: PubSubSettings,
        *,
        timeout_s: float = 30.0,
        pull_wait_s: float = 3.0,
        lease_s: int = LEASE_S,
        subscriber: pubsub_v1.SubscriberClient | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
    ) -> None:
        self._settings = settings
        self._subscription = settings.dead_letter_subscription_path()
        self._timeout_s = timeout_s
        self._pull_wait_s = pull_wait_s
        self._lease_s = lease_s
        project = project_of(self._subscription)
        self._subscriber = subscriber or default_subscriber(project)
        self._publisher = publisher or default_publisher(project)
        self._publish_api = GapicPublisherClient(transport=self._publisher.transport)
        self._held: dict[str, str] = {}
        """message id -> ack id of every letter read and not yet removed."""
        self._renewing: asyncio.Task[None] | None = None
        self._target: str | None = settings.topic

    @property
    def where(self) -> str:
        return f"Pub/Sub subscription {self._subscription} at {client_address(self._subscriber)}"

    @property
    def default_target(self) -> str:
        if self._target is None:
            self._target = self._call(
                "look up the source topic of",
                self._settings.subscription,
                lambda: (
                    self._subscriber.get_subscription(
                        subscription=self._settings.subscription, timeout=self._timeout_s
                    ).topic
                ),
            )
        return self._target

    def _call(self, doing: str, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except gexc.NotFound as exc:
            raise self._missing(what) from exc
        except gexc.GoogleAPICallError as exc:
            raise DeadLetterQueueError(f"cannot {doing} {what}: {exc}") from exc

    def _missing(self, what: str) -> DeadLetterQueueError:
        return DeadLetterQueueError(
            f"{what} does not exist at {client_address(self._subscriber)} (rowbatch-consumer "
            "admin ensure creates it)"
        )

    def _check(self) -> None:
        """The dead-letter subscription exists and the service answers (a pull that cannot
        connect would look like an empty queue)."""
        try:
            self._subscriber.get_subscription(
                subscription=self._subscription,
                timeout=self._timeout_s,
                retry=Retry(timeout=self._timeout_s, initial=0.2, maximum=2.0),
            )
        except gexc.NotFound as exc:
            raise self._missing(f"the dead-letter subscription {self._subscription}") from exc
        except (gexc.GoogleAPIError, TimeoutError) as exc:
            raise DeadLetterQueueError(
                f"Pub/Sub at {client_address(self._subscriber)} did not answer for "
                f"{self._subscription} within {self._timeout_s:g} s: {type(exc).__name__}: {exc}"
            ) from exc

    async def letters(self) -> AsyncIterator[DeadLetter]:
        await asyncio.to_thread(self._check)
        if self._renewing is None:
            self._renewing = asyncio.create_task(self._renew(), name="dlq-lease-renewal")
        empty = 0
        while empty < EMPTY_PULLS:
            received = await asyncio.to_thread(self._pull)
            fresh = [m for m in received if m.message.message_id not in self._held]
            for m in received:  # one that came back after a lapsed lease: its newest ack id
                if m.message.message_id in self._held:
                    self._held[m.message.message_id] = m.ack_id
            if not fresh:
                empty += 1
                continue
            empty = 0
            for m in fresh:
                self._held[m.message.message_id] = m.ack_id
            try:
                await asyncio.to_thread(self._extend, [m.ack_id for m in received], self._lease_s)
            except gexc.GoogleAPIError as exc:
                raise DeadLetterQueueError(
                    f"cannot hold the letters of {self.where}: {exc}"
                ) from exc
            for m in fresh:
                yield _letter(self._subscription, m.message)

    def _pull(self) -> list[Any]:
        try:
            response = self._subscriber.pull(
                subscription=self._subscription,
                max_messages=PULL_BATCH,
                timeout=self._pull_wait_s,
            )
        except gexc.DeadlineExceeded:
            return []  # nothing within the wait
        except gexc.RetryError as exc:
            if isinstance(exc.cause, gexc.DeadlineExceeded):
                return []
            raise DeadLetterQueueError(f"cannot pull from {self.where}: {exc}") from exc
        except gexc.NotFound as exc:
            raise self._missing(f"the dead-letter subscription {self._subscription}") from exc
        except gexc.GoogleAPICallError as exc:
            raise DeadLetterQueueError(f"cannot pull from {self.where}: {exc}") from exc
        return list(response.received_messages)

    def _extend(self, ack_ids: list[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), RPC_CHUNK):
            self._subscriber.modify_ack_deadline(
                subscription=self._subscription,
                ack_ids=ack_ids[start : start + RPC_CHUNK],
                ack_deadline_seconds=seconds,
                timeout=self._timeout_s,
            )

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(self._lease_s / 3)
            with contextlib.suppress(gexc.GoogleAPICallError):
                await asyncio.to_thread(self._extend, list(self._held.values()), self._lease_s)

    async def publish(self, letter: DeadLetter, topic: str) -> str:
        request = pubsub_types.PublishRequest(
            topic=topic,
            messages=[
                pubsub_types.PubsubMessage(
                    data=letter.payload, attributes=letter.replay_attributes()
                )
            ],
        )

        def call() -> str:
            response = self._publish_api.publish(request=request, timeout=self._timeout_s)
            return f"{topic}/{response.message_ids[0]}"

        try:
            return await asyncio.to_thread(call)
        except gexc.GoogleAPICallError as exc:
            raise DeadLetterQueueError(f"publish of {letter.ref} to {topic}: {exc}") from exc

    async def remove(self, letter: DeadLetter, replayed_as: str) -> None:
        message_id = letter.ref.rsplit("/", 1)[1]
        ack_id = self._held.get(message_id)
        if ack_id is None:
            raise DeadLetterQueueError(f"{letter.ref} is not held by this read")

        def call() -> None:
            self._subscriber.acknowledge(
                subscription=self._subscription, ack_ids=[ack_id], timeout=self._timeout_s
            )

        try:
            await asyncio.to_thread(call)
        except gexc.GoogleAPICallError as exc:
            raise DeadLetterQueueError(f"ack of {letter.ref}: {exc}") from exc
        del self._held[message_id]

    async def close(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            await asyncio.gather(self._renewing, return_exceptions=True)
            self._renewing = None
        held = list(self._held.values())
        self._held.clear()
        # Back in the queue at once; should this fail, their leases lapse within lease_s.
        with contextlib.suppress(gexc.GoogleAPICallError):
            await asyncio.to_thread(self._extend, held, 0)
        self._publisher.transport.close()
        self._subscriber.close()


def _letter(subscription: str, message: Any) -> DeadLetter:
    published = message.publish_time
    return DeadLetter(
        ref=f"{subscription}/{message.message_id}",
        payload=bytes(message.data),
        attributes=dict(message.attributes),
        queued_at=published if published and published.timestamp() > 0 else None,
    )


__all__ = ["LEASE_S", "PubSubDeadLetterQueue"]
