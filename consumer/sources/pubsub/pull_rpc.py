"""The Pull, Acknowledge and ModifyAckDeadline calls of the unary-pull source
(``pubsub_pull.py``), on the asyncio client or on the blocking client in worker threads."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from typing import Any, Protocol

import grpc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcAsyncIOTransport
from google.pubsub_v1.types import PullResponse

from consumer.sources.pubsub.shared import UNLIMITED_MESSAGES

PULL_TIMEOUT_S = 10.0
"""Client deadline of one Pull (a long poll on an empty subscription)."""
RPC_TIMEOUT_S = 30.0

ReceivedMessage = Any
"""``google.pubsub_v1.types.ReceivedMessage`` as a raw protobuf (``ReceivedMessage.pb``)."""


class PullRpc(Protocol):
    """The three RPCs the source needs (a fake in unit tests)."""

    async def pull(self, max_messages: int) -> Sequence[ReceivedMessage]:
        """Raw ``ReceivedMessage`` protobufs; empty when the long poll ended without any."""

    async def acknowledge(self, ack_ids: list[str]) -> None: ...

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None: ...

    async def close(self) -> None: ...


class AsyncClientRpc:
    """``SubscriberAsyncClient`` (grpc.aio). No client-side retry: the source retries."""

    def __init__(self, client: SubscriberAsyncClient, subscription: str, *, owned: bool) -> None:
        self._client = client
        self._sub = subscription
        self._owned = owned

    async def pull(self, max_messages: int) -> Sequence[ReceivedMessage]:
        response = await self._client.pull(
            request={"subscription": self._sub, "max_messages": max_messages},
            retry=None,
            timeout=PULL_TIMEOUT_S,
        )
        return PullResponse.pb(response).received_messages  # type: ignore[no-any-return]

    async def acknowledge(self, ack_ids: list[str]) -> None:
        await self._client.acknowledge(
            request={"subscription": self._sub, "ack_ids": ack_ids},
            retry=None,
            timeout=RPC_TIMEOUT_S,
        )

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        await self._client.modify_ack_deadline(
            request={
                "subscription": self._sub,
                "ack_ids": ack_ids,
                "ack_deadline_seconds": seconds,
            },
            retry=None,
            timeout=RPC_TIMEOUT_S,
        )

    async def close(self) -> None:
        if self._owned:
            await self._client.transport.close()  # type: ignore[no-untyped-call]


class ThreadedClientRpc:
    """The blocking ``SubscriberClient`` in worker threads."""

    def __init__(self, client: pubsub_v1.SubscriberClient, subscription: str) -> None:
        self._client = client
        self._sub = subscription

    async def pull(self, max_messages: int) -> Sequence[ReceivedMessage]:
        response = await asyncio.to_thread(
            self._client.pull,
            request={"subscription": self._sub, "max_messages": max_messages},
            retry=None,
            timeout=PULL_TIMEOUT_S,
        )
        return PullResponse.pb(response).received_messages  # type: ignore[no-any-return]

    async def acknowledge(self, ack_ids: list[str]) -> None:
        await asyncio.to_thread(
            self._client.acknowledge,
            request={"subscription": self._sub, "ack_ids": ack_ids},
            retry=None,
            timeout=RPC_TIMEOUT_S,
        )

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        await asyncio.to_thread(
            self._client.modify_ack_deadline,
            request={
                "subscription": self._sub,
                "ack_ids": ack_ids,
                "ack_deadline_seconds": seconds,
            },
            retry=None,
            timeout=RPC_TIMEOUT_S,
        )

    async def close(self) -> None:
        """The subscriber is closed by the source (it also serves ``check``)."""


def default_async_subscriber() -> SubscriberAsyncClient:
    """From the environment, like ``default_subscriber``; call it in the event loop."""
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    if not host:
        return SubscriberAsyncClient()
    channel = grpc.aio.insecure_channel(host, options=UNLIMITED_MESSAGES)
    return SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))


__all__ = [
    "AsyncClientRpc",
    "PullRpc",
    "ReceivedMessage",
    "ThreadedClientRpc",
    "default_async_subscriber",
]
