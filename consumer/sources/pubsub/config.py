"""The configurations of the two Pub/Sub sources (streaming pull: ``PubSubSourceConfig``; unary
pull: ``PubSubPullSourceConfig``), validated on construction with ``PubSubConfigError``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from google.cloud import pubsub_v1

from rowbatch.consumer.sources.base import package_version
from rowbatch.consumer.sources.pubsub.errors import PubSubConfigError
from rowbatch.consumer.sources.pubsub.pull_rpc import RPC_CHUNK

SUBSCRIPTION_RE = re.compile(r"^projects/[^/]+/subscriptions/[^/]{3,}$")
TOPIC_RE = re.compile(r"^projects/[^/]+/topics/[^/]{3,}$")
LEASE_EXTENSION_RANGE = (10.0, 600.0)
"""What Pub/Sub accepts for one lease extension (``FlowControl`` docs)."""


@dataclass(frozen=True)
class PubSubSourceConfig:
    """The streaming-pull source's settings (``source.mode = "streaming"``)."""

    subscription: str
    """Full path: ``projects/P/subscriptions/S``."""
    dead_letter_topic: str | None
    """Full path ``projects/P/topics/T`` poison messages are published to, with the reason.
    ``None`` is allowed only when the subscription has its own dead-letter policy (checked by
    ``PubSubSource.check``): ``dead_letter`` then nacks and Pub/Sub moves the message after
    the policy's max attempts, *without* the reason attributes."""
    max_messages: int = 1000
    """Flow control: most messages received and not yet acked/nacked (buffered + in flight)."""
    max_bytes: int = 64 * 1024 * 1024
    """Flow control: most message bytes received and not yet acked/nacked."""
    max_lease_duration_s: float = 3600.0
    """How long the client keeps extending a held message's ack deadline, counted from
    receipt. Must exceed the worst batch time plus backoff (plus any pause)."""
    min_lease_extension_s: float = 0.0
    """Shortest single ack-deadline extension (10..600 s); 0 = client default (10 s, or 60 s
    with exactly-once delivery)."""
    max_lease_extension_s: float = 0.0
    """Longest single ack-deadline extension (10..600 s); bounds how long a crashed
    consumer's messages wait before redelivery. 0 = client default (up to 600 s, following
    the 99th percentile of ack latency)."""
    max_delivery_attempts: int | None = None
    """``exceeded_attempts`` is true beyond this many deliveries. Only counted by Pub/Sub when
    the subscription has a dead-letter policy; keep it below that policy's own maximum so the
    consumer dead-letters with a reason before Pub/Sub moves the message without one."""
    consumer_version: str = field(default_factory=package_version)
    """Written to ``rowbatch-dlq-consumer-version``."""
    dead_letter_timeout_s: float = 30.0
    """How long ``dead_letter`` waits for the publish confirmation."""
    check_timeout_s: float = 10.0
    """How long ``check`` keeps retrying an unreachable server."""

    def __post_init__(self) -> None:
        _check_paths(self.subscription, self.dead_letter_topic)
        _at_least_one(self, "max_messages", "max_bytes")
        _positive(self, "max_lease_duration_s")
        low, high = LEASE_EXTENSION_RANGE
        for name in ("min_lease_extension_s", "max_lease_extension_s"):
            value = getattr(self, name)
            if value != 0 and not low <= value <= high:
                raise PubSubConfigError(
                    f"{name} must be 0 (client default) or within {low:g}..{high:g} s, not {value}"
                )
        _check_attempts(self.max_delivery_attempts)
        _positive(self, "dead_letter_timeout_s", "check_timeout_s")

    def flow_control(self) -> pubsub_v1.types.FlowControl:
        return pubsub_v1.types.FlowControl(
            max_bytes=self.max_bytes,
            max_messages=self.max_messages,
            max_lease_duration=self.max_lease_duration_s,
            # The client sends these in a protobuf int field: whole seconds only.
            min_duration_per_lease_extension=round(self.min_lease_extension_s),
            max_duration_per_lease_extension=round(self.max_lease_extension_s),
        )


@dataclass(frozen=True)
class PubSubPullSourceConfig:
    """The unary-pull source's settings (``source.mode = "pull"``, the default)."""

    subscription: str
    """Full path: ``projects/P/subscriptions/S``."""
    dead_letter_topic: str | None
    """As for the streaming source: ``None`` only with a subscription dead-letter policy."""
    max_messages: int = 1000
    """Flow control: most messages held (received, not yet acked/nacked)."""
    max_bytes: int = 64 * 1024 * 1024
    """Flow control: no pull starts while held message bytes reach this."""
    max_lease_duration_s: float = 3600.0
    """How long a held message's lease is kept, counted from receipt."""
    lease_extension_s: float = 60.0
    """Each extension sets the ack deadline this far ahead (10..600 s): also how long a
    crashed consumer's messages wait before redelivery."""
    max_delivery_attempts: int | None = None
    consumer_version: str = field(default_factory=package_version)
    dead_letter_timeout_s: float = 30.0
    check_timeout_s: float = 10.0
    pull_concurrency: int = 2
    """Pull calls in flight at once."""
    pull_max_messages: int = 1000
    """Most messages asked for by one Pull (each also bounded by the room flow control
    leaves, shared by the pulls in flight)."""
    ack_delay_s: float = 0.01
    """Longest an ack or nack waits to be batched with others."""
    ack_max_ids: int = 1000
    """Ack ids per Acknowledge/ModifyAckDeadline call (at most 1,000)."""
    rpc_retry_s: float = 60.0
    """How long a failed ack/nack call is retried before it is given up (and logged)."""
    close_pull_wait_s: float = 1.0
    """``close`` lets a Pull in flight return this long (its messages are then nacked at
    once) before cancelling it: messages of a cancelled Pull come back only after the
    subscription's ack deadline."""
    client: Literal["asyncio", "threads"] = "asyncio"
    """``asyncio``: ``SubscriberAsyncClient`` on grpc.aio; ``threads``: the blocking client in
    worker threads (see ``python -m bench.pubsub_intake`` for which costs less)."""

    def __post_init__(self) -> None:
        _check_paths(self.subscription, self.dead_letter_topic)
        _at_least_one(self, "max_messages", "max_bytes", "pull_concurrency", "pull_max_messages")
        if not 1 <= self.ack_max_ids <= RPC_CHUNK:
            raise PubSubConfigError(f"ack_max_ids must be 1..{RPC_CHUNK}, not {self.ack_max_ids}")
        if not 10 <= self.lease_extension_s <= 600:
            raise PubSubConfigError(
                f"lease_extension_s must be within 10..600 s, not {self.lease_extension_s}"
            )
        _check_attempts(self.max_delivery_attempts)
        _positive(
            self, "max_lease_duration_s", "dead_letter_timeout_s", "check_timeout_s", "rpc_retry_s"
        )
        for name in ("ack_delay_s", "close_pull_wait_s"):
            if getattr(self, name) < 0:
                raise PubSubConfigError(f"{name} must be >= 0, not {getattr(self, name)}")
        if self.client not in ("asyncio", "threads"):
            raise PubSubConfigError(f"client must be 'asyncio' or 'threads', not {self.client!r}")


def _check_paths(subscription: str, dead_letter_topic: str | None) -> None:
    if not SUBSCRIPTION_RE.match(subscription):
        raise PubSubConfigError(
            f"subscription must be a full path 'projects/P/subscriptions/S', not {subscription!r}"
        )
    if dead_letter_topic is not None and not TOPIC_RE.match(dead_letter_topic):
        raise PubSubConfigError(
            f"dead_letter_topic must be a full path 'projects/P/topics/T', "
            f"not {dead_letter_topic!r}"
        )


def _check_attempts(max_delivery_attempts: int | None) -> None:
    if max_delivery_attempts is not None and max_delivery_attempts < 1:
        raise PubSubConfigError(
            f"max_delivery_attempts must be >= 1 or None, not {max_delivery_attempts}"
        )


def _at_least_one(config: object, *names: str) -> None:
    for name in names:
        if getattr(config, name) < 1:
            raise PubSubConfigError(f"{name} must be >= 1, not {getattr(config, name)}")


def _positive(config: object, *names: str) -> None:
    for name in names:
        if getattr(config, name) <= 0:
            raise PubSubConfigError(f"{name} must be > 0, not {getattr(config, name)}")
