"""The Google Cloud Pub/Sub clients a source builds when none is given: from the environment
(PUBSUB_EMULATOR_HOST selects an emulator), with no message size limit. Without the emulator
and without Google credentials they raise ``PubSubCredentialsError``, one line saying what to
set, instead of google-auth's exception."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.auth.exceptions import DefaultCredentialsError

from rowbatch.consumer.sources.pubsub.errors import PubSubCredentialsError
from rowbatch.pubsub_env import (
    GOOGLE_PUBSUB_ADDRESS,
    CredentialsLookup,
    credentials_message,
    emulator_host,
    google_default_credentials,
    missing_credentials,
)

if TYPE_CHECKING:
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.subscriber import SubscriberAsyncClient

# Streaming-pull responses carry up to ~10 MB of messages (more with attributes): gRPC's
# default 4 MiB receive limit would make the stream fail and reopen forever, silently.
UNLIMITED_MESSAGES = (("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1))

C = TypeVar("C")


def emulator_channel() -> grpc.Channel | None:
    host = emulator_host()
    return grpc.insecure_channel(host, options=UNLIMITED_MESSAGES) if host else None


def check_credentials(
    project: str | None, *, lookup: CredentialsLookup = google_default_credentials
) -> None:
    """``PubSubCredentialsError`` when neither the emulator is named nor Google credentials
    are found (blocking: it may ask the GCE metadata server)."""
    problem = missing_credentials(project, lookup=lookup)
    if problem is not None:
        raise PubSubCredentialsError(problem)


def client_address(client: Any | None = None) -> str:
    """Where a client (or, without one, the pull source's own channel) talks to, for
    messages: the emulator's host:port when PUBSUB_EMULATOR_HOST is set (a client on an
    emulator channel still reports Google's endpoint as its target), else the client's
    target (Google Cloud's endpoint)."""
    if client is None:
        return emulator_host() or f"{GOOGLE_PUBSUB_ADDRESS}:443"
    return emulator_host() or str(client.target)


def _made(make: Callable[[], C], project: str | None) -> C:
    try:
        return make()
    except DefaultCredentialsError as exc:
        raise PubSubCredentialsError(credentials_message(project, exc)) from None


def default_subscriber(project: str | None = None) -> pubsub_v1.SubscriberClient:
    """A subscriber from the environment (PUBSUB_EMULATOR_HOST selects an emulator, with
    no message size limit; otherwise Google's defaults, which have none either). ``project``
    is named in the error when there are no credentials."""
    from google.cloud import pubsub_v1  # noqa: PLC0415 (the library: ~22 MiB)
    from google.pubsub_v1.services.subscriber.transports import (  # noqa: PLC0415
        SubscriberGrpcTransport,
    )

    channel = emulator_channel()
    if channel is None:
        return _made(pubsub_v1.SubscriberClient, project)
    return pubsub_v1.SubscriberClient(transport=SubscriberGrpcTransport(channel=channel))


def default_publisher(project: str | None = None) -> pubsub_v1.PublisherClient:
    from google.cloud import pubsub_v1  # noqa: PLC0415 (the library: ~22 MiB)
    from google.pubsub_v1.services.publisher.transports import (  # noqa: PLC0415
        PublisherGrpcTransport,
    )

    channel = emulator_channel()
    if channel is None:
        return _made(pubsub_v1.PublisherClient, project)
    return pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=channel))


def default_async_subscriber(project: str | None = None) -> SubscriberAsyncClient:
    """From the environment, like ``default_subscriber``; call it in the event loop."""
    from google.pubsub_v1.services.subscriber import SubscriberAsyncClient  # noqa: PLC0415
    from google.pubsub_v1.services.subscriber.transports import (  # noqa: PLC0415
        SubscriberGrpcAsyncIOTransport,
    )

    host = emulator_host()
    if not host:
        return _made(SubscriberAsyncClient, project)
    channel = grpc.aio.insecure_channel(host, options=UNLIMITED_MESSAGES)
    return SubscriberAsyncClient(transport=SubscriberGrpcAsyncIOTransport(channel=channel))
