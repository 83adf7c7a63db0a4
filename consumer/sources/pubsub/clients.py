"""The Google Cloud Pub/Sub clients a source builds when none is given: from the environment
(``PUBSUB_EMULATOR_HOST`` selects an emulator), with no message size limit."""

from __future__ import annotations

import os

import grpc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber import SubscriberAsyncClient
from google.pubsub_v1.services.subscriber.transports import (
    SubscriberGrpcAsyncIOTransport,
    SubscriberGrpcTransport,
)

# Streaming-pull responses carry up to ~10 MB of messages (more with attributes): gRPC's
# default 4 MiB receive limit would make the stream fail and reopen forever, silently.
UNLIMITED_MESSAGES = (("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1))


def emulator_channel() -> grpc.Channel | None:
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    return grpc.insecure_channel(host, options=UNLIMITED_MESSAGES) if host else None


def default_subscriber() -> pubsub_v1.SubscriberClient:
    """A subscriber from the environment (``PUBSUB_EMULATOR_HOST`` selects an emulator, with
    no message size limit; otherwise Google's defaults, which have none either)."""
    channel = emulator_channel()
    if channel is None:
        return pubsub_v1.SubscriberClient()
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def default_publisher() -> pubsub_v1.PublisherClient:
    channel = emulator_channel()
    if channel is None:
        return pubsub_v1.PublisherClient()
    return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel))


def default_async_subscriber() -> SubscriberAsyncClient:
    """From the environment, like ``default_subscriber``; call it in the event loop."""
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    if not host:
        return SubscriberAsyncClient()
    channel = grpc.aio.insecure_channel(host, options=UNLIMITED_MESSAGES)
    return SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))
