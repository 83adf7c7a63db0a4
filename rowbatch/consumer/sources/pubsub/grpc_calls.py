"""Pub/Sub's RPCs on a plain grpc.aio channel with the messages of ``wire_types.py``: what the
pull source uses for Pull, Acknowledge, ModifyAckDeadline, the start-up check and the dead
letters' Publish, without google-cloud-pubsub's client layers (~22 MiB of RSS, docs/memory.md).

The channel is the emulator's (``PUBSUB_EMULATOR_HOST``, plain text) or Google Cloud's, made
by ``google.api_core.grpc_helpers_async.create_channel`` with Pub/Sub's scopes and the same
options as google-cloud-pubsub's own transport (TLS, Application Default Credentials), imported
only then. It is opened on the first call, in the event loop. Errors are
``google.api_core.exceptions`` (``from_grpc_error``), as the client library raises them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import grpc
from google.api_core import exceptions as gexc

from rowbatch.consumer.sources.pubsub import wire_types as wt
from rowbatch.consumer.sources.pubsub.calls import SubscriptionInfo
from rowbatch.consumer.sources.pubsub.errors import PubSubCredentialsError
from rowbatch.pubsub_env import (
    GOOGLE_PUBSUB_ADDRESS,
    credentials_message,
    emulator_host,
    is_credentials_error,
)

GOOGLE_SCOPES = (
    "https://www.googleapis.com/auth/cloud-platform",
    "https://www.googleapis.com/auth/pubsub",
)
"""As google-cloud-pubsub's transports ask for."""
CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_metadata_size", 4 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
)
"""As google-cloud-pubsub's transports set them: a Pull response has no size limit (gRPC's
default 4 MiB would fail a large one forever)."""

_SUBSCRIBER = "/google.pubsub.v1.Subscriber/"
_PUBLISHER = "/google.pubsub.v1.Publisher/"


def open_channel(project: str | None) -> grpc.aio.Channel:
    """The emulator's channel, or Google Cloud's with default credentials
    (``PubSubCredentialsError`` when there are none). Call it in the event loop."""
    host = emulator_host()
    if host:
        return grpc.aio.insecure_channel(host, options=CHANNEL_OPTIONS)
    from google.api_core import grpc_helpers_async  # noqa: PLC0415 (Google Cloud only: ~14 MiB)

    try:
        return grpc_helpers_async.create_channel(
            f"{GOOGLE_PUBSUB_ADDRESS}:443",
            default_scopes=GOOGLE_SCOPES,
            default_host=GOOGLE_PUBSUB_ADDRESS,
            options=CHANNEL_OPTIONS,
        )
    except Exception as exc:
        if is_credentials_error(exc):
            raise PubSubCredentialsError(credentials_message(project, exc)) from None
        raise


def _routing(name: str, value: str) -> tuple[tuple[str, str], ...]:
    """The request-params header google-cloud-pubsub sends (routes a call to the resource)."""
    return (("x-goog-request-params", f"{name}={quote(value, safe='/')}"),)


class GrpcCalls:
    """``PubSubCalls`` plus the pull source's three RPCs, on one channel (``open_channel``
    on first use, or ``channel``). One attempt each, no retry."""

    def __init__(self, project: str | None, *, channel: grpc.aio.Channel | None = None) -> None:
        self._project = project
        self._channel = channel
        self._owned = channel is None
        self._methods: dict[str, Any] = {}

    def _method(self, path: str, response: Any) -> Any:
        method = self._methods.get(path)
        if method is None:
            if self._channel is None:
                self._channel = open_channel(self._project)
            method = self._channel.unary_unary(
                path,
                request_serializer=lambda message: message.SerializeToString(),
                response_deserializer=response.FromString,
            )
            self._methods[path] = method
        return method

    async def _call(
        self, path: str, request: Any, response: Any, timeout_s: float, routing: Any
    ) -> Any:
        try:
            return await self._method(path, response)(request, timeout=timeout_s, metadata=routing)
        except grpc.aio.AioRpcError as exc:
            raise gexc.from_grpc_error(exc) from exc  # type: ignore[no-untyped-call]

    async def pull(self, subscription: str, max_messages: int, timeout_s: float) -> Sequence[Any]:
        """Raw ``ReceivedMessage``s (``wire_types``); empty when the long poll ended."""
        request = wt.PullRequest(subscription=subscription, max_messages=max_messages)
        response = await self._call(
            _SUBSCRIBER + "Pull",
            request,
            wt.PullResponse,
            timeout_s,
            _routing("subscription", subscription),
        )
        return response.received_messages  # type: ignore[no-any-return]

    async def acknowledge(self, subscription: str, ack_ids: list[str], timeout_s: float) -> None:
        request = wt.AcknowledgeRequest(subscription=subscription, ack_ids=ack_ids)
        await self._call(
            _SUBSCRIBER + "Acknowledge",
            request,
            wt.Empty,
            timeout_s,
            _routing("subscription", subscription),
        )

    async def modify_ack_deadline(
        self, subscription: str, ack_ids: list[str], seconds: int, timeout_s: float
    ) -> None:
        request = wt.ModifyAckDeadlineRequest(
            subscription=subscription, ack_ids=ack_ids, ack_deadline_seconds=seconds
        )
        await self._call(
            _SUBSCRIBER + "ModifyAckDeadline",
            request,
            wt.Empty,
            timeout_s,
            _routing("subscription", subscription),
        )

    async def get_subscription(self, subscription: str, timeout_s: float) -> SubscriptionInfo:
        found = await self._call(
            _SUBSCRIBER + "GetSubscription",
            wt.GetSubscriptionRequest(subscription=subscription),
            wt.Subscription,
            timeout_s,
            _routing("subscription", subscription),
        )
        policy = found.dead_letter_policy
        return SubscriptionInfo(
            ack_deadline_seconds=found.ack_deadline_seconds,
            enable_message_ordering=found.enable_message_ordering,
            dead_letter_topic=policy.dead_letter_topic,
            max_delivery_attempts=policy.max_delivery_attempts,
        )

    async def get_topic(self, topic: str, timeout_s: float) -> None:
        await self._call(
            _PUBLISHER + "GetTopic",
            wt.GetTopicRequest(topic=topic),
            wt.Topic,
            timeout_s,
            _routing("topic", topic),
        )

    async def publish(
        self, topic: str, data: bytes, attributes: Mapping[str, str], timeout_s: float
    ) -> None:
        request = wt.PublishRequest(
            topic=topic, messages=[wt.PubsubMessage(data=data, attributes=dict(attributes))]
        )
        await self._call(
            _PUBLISHER + "Publish", request, wt.PublishResponse, timeout_s, _routing("topic", topic)
        )

    async def close(self) -> None:
        """Closes the channel if this object opened it (a later call opens another)."""
        if not self._owned:
            return
        channel, self._channel = self._channel, None
        self._methods.clear()
        if channel is not None:
            await channel.close()
