"""The Pull, Acknowledge and ModifyAckDeadline calls of the unary-pull source (``pull.py``):
on the source's own grpc.aio channel (``GrpcCalls``, the default), on a given
``SubscriberAsyncClient``, or on the blocking client in worker threads."""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rowbatch.consumer.sources.pubsub.grpc_calls import GrpcCalls

if TYPE_CHECKING:
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

PULL_TIMEOUT_S = 10.0
"""Client deadline of one Pull (a long poll on an empty subscription)."""
RPC_TIMEOUT_S = 30.0
"""Client deadline of one Acknowledge or ModifyAckDeadline."""

ReceivedMessage = Any
"""A raw protobuf ``ReceivedMessage``: ``wire_types.ReceivedMessage``, or the library's
(``google.pubsub_v1.types.ReceivedMessage.pb``); the same fields."""


class PullRpc(Protocol):
    """The three RPCs the source needs (a fake in unit tests)."""

    async def pull(self, max_messages: int) -> Sequence[ReceivedMessage]:
        """Raw ``ReceivedMessage`` protobufs; empty when the long poll ended without any."""

    async def acknowledge(self, ack_ids: list[str]) -> None: ...

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None: ...

    async def close(self) -> None: ...


class _ClientRpc(ABC):
    """The three requests, the same on both clients; ``_call`` sends one. No client-side
    retry: the source retries."""

    def __init__(self, subscription: str) -> None:
        self._sub = subscription

    @abstractmethod
    async def _call(self, method: str, request: dict[str, Any], deadline_s: float) -> Any:
        """The client's ``method`` with ``request``, no retry, a deadline of ``deadline_s``."""

    async def pull(self, max_messages: int) -> Sequence[ReceivedMessage]:
        request = {"subscription": self._sub, "max_messages": max_messages}
        response = await self._call("pull", request, PULL_TIMEOUT_S)
        return type(response).pb(response).received_messages  # type: ignore[no-any-return]

    async def acknowledge(self, ack_ids: list[str]) -> None:
        request = {"subscription": self._sub, "ack_ids": ack_ids}
        await self._call("acknowledge", request, RPC_TIMEOUT_S)

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        request = {"subscription": self._sub, "ack_ids": ack_ids, "ack_deadline_seconds": seconds}
        await self._call("modify_ack_deadline", request, RPC_TIMEOUT_S)


class AsyncClientRpc(_ClientRpc):
    """A given ``SubscriberAsyncClient`` (grpc.aio); not closed here."""

    def __init__(self, client: SubscriberAsyncClient, subscription: str) -> None:
        super().__init__(subscription)
        self._client = client

    async def _call(self, method: str, request: dict[str, Any], deadline_s: float) -> Any:
        return await getattr(self._client, method)(request=request, retry=None, timeout=deadline_s)

    async def close(self) -> None:
        """The caller's client: closed by the caller."""


class ThreadedClientRpc(_ClientRpc):
    """The blocking ``SubscriberClient`` in worker threads."""

    def __init__(self, client: pubsub_v1.SubscriberClient, subscription: str) -> None:
        super().__init__(subscription)
        self._client = client

    async def _call(self, method: str, request: dict[str, Any], deadline_s: float) -> Any:
        call = getattr(self._client, method)
        return await asyncio.to_thread(call, request=request, retry=None, timeout=deadline_s)

    async def close(self) -> None:
        """The subscriber is closed by the source (it also serves ``check``)."""


class ChannelRpc:
    """The three calls on ``GrpcCalls`` (the source's own channel; the source closes it)."""

    def __init__(self, calls: GrpcCalls, subscription: str) -> None:
        self._calls = calls
        self._sub = subscription

    async def pull(self, max_messages: int) -> Sequence[ReceivedMessage]:
        return await self._calls.pull(self._sub, max_messages, PULL_TIMEOUT_S)

    async def acknowledge(self, ack_ids: list[str]) -> None:
        await self._calls.acknowledge(self._sub, ack_ids, RPC_TIMEOUT_S)

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        await self._calls.modify_ack_deadline(self._sub, ack_ids, seconds, RPC_TIMEOUT_S)

    async def close(self) -> None:
        """The channel is closed by the source (it also serves the check and dead letters)."""


def open_rpc(
    client: Literal["asyncio", "threads"],
    subscription: str,
    *,
    calls: GrpcCalls | None,
    subscriber: pubsub_v1.SubscriberClient | None,
    async_subscriber: SubscriberAsyncClient | None,
) -> PullRpc:
    """The calls on the client ``client`` names: the blocking ``subscriber`` in worker
    threads; or on the event loop, ``async_subscriber`` when given, else ``calls`` (the
    source's own channel). Call it in the event loop."""
    if client == "threads":
        assert subscriber is not None
        return ThreadedClientRpc(subscriber, subscription)
    if async_subscriber is not None:
        return AsyncClientRpc(async_subscriber, subscription)
    assert calls is not None
    return ChannelRpc(calls, subscription)
