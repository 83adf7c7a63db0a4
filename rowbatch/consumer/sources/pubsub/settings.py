"""The ``[source]`` settings of a Google Cloud Pub/Sub subscription (``kind = "pubsub"``), for
both modes (``pull``: ``PubSubPullSource``, ``streaming``: ``PubSubSource``), with what
``rowbatch-consumer admin ensure`` creates for it. The one settings type: the sources take it
as it is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from rowbatch.consumer.section import MiB
from rowbatch.consumer.sources.scaling_settings import ScalingInputs

if TYPE_CHECKING:
    from google.cloud.pubsub_v1.types import FlowControl

TOPIC_PATTERN = r"^projects/[^/]+/topics/[^/]{3,}$"
SUBSCRIPTION_PATTERN = r"^projects/[^/]+/subscriptions/[^/]{3,}$"
RPC_CHUNK = 1000
"""Most ack ids in one Acknowledge/ModifyAckDeadline request (the request size limit is
512 KB)."""


class PubSubSettings(ScalingInputs):
    """A Pub/Sub subscription; the autoscaling inputs shared with Kafka are
    :class:`ScalingInputs`."""

    kind: Literal["pubsub"] = "pubsub"
    subscription: str = Field(pattern=SUBSCRIPTION_PATTERN)
    """Full path: ``projects/P/subscriptions/S``."""
    dead_letter_topic: str | None = Field(default=None, pattern=TOPIC_PATTERN)
    """Full path of the topic poison messages go to (``projects/P/topics/T``). May be left out
    only when the subscription has its own dead-letter policy (poison is then nacked until
    Pub/Sub moves it)."""
    max_messages: int = Field(default=1000, ge=1)
    """Flow control: most messages held (leased, not yet acked) at once."""
    max_bytes: int = Field(default=64 * MiB, ge=1024)
    """Flow control: most payload bytes held at once."""
    max_lease_duration_s: float = Field(default=3600.0, gt=0)
    """How long a held message's ack deadline keeps being extended; must exceed the worst
    batch time plus backoff."""
    max_lease_extension_s: float = Field(default=60.0, ge=10, le=600)
    """Longest single ack-deadline extension: bounds how long a crashed consumer's messages
    wait before Pub/Sub redelivers them."""
    max_delivery_attempts: int | None = Field(default=None, ge=1)
    """Dead-letter a message delivered more often than this (needs a subscription with a
    dead-letter policy, which is what makes Pub/Sub count attempts)."""
    mode: Literal["pull", "streaming"] = "pull"
    """``pull``: unary Pull calls with batched acks and leases kept by rowbatch
    (``sources/pubsub/pull.py``; ~10x less CPU per message, see docs/consumer.md,
    "Pub/Sub pull mode"); ``streaming``: google-cloud-pubsub's streaming pull
    (``sources/pubsub/streaming.py``)."""
    pull_concurrency: int = Field(default=2, ge=1, le=16)
    """Pull mode: Pull calls in flight at once."""
    pull_max_messages: int = Field(default=1000, ge=1, le=1000)
    """Pull mode: most messages one Pull asks for (also bounded by ``max_messages``)."""
    ack_delay_ms: float = Field(default=10.0, ge=0, le=1000)
    """Pull mode: longest an ack/nack waits to share an Acknowledge/ModifyAckDeadline call
    (up to 1,000 ids each)."""
    target_latency_s: float = Field(default=10.0, gt=0)
    """For ``rowbatch_replica_load``/``rowbatch_desired_replicas``: how long the backlog may
    take to clear (docs/autoscaling.md: 10 s holds a 30 s objective best)."""
    # Tuning: rarely changed.
    ack_max_ids: int = Field(default=RPC_CHUNK, ge=1, le=RPC_CHUNK)
    """Pull mode: ack ids per Acknowledge/ModifyAckDeadline call (Pub/Sub takes 1,000)."""
    rpc_retry_s: float = Field(default=60.0, gt=0)
    """Pull mode: how long a failed ack/nack call is retried before it is given up and logged
    (the message then comes back after its ack deadline; the idempotent sink absorbs it)."""
    close_pull_wait_s: float = Field(default=1.0, ge=0)
    """Pull mode: on shutdown, how long a Pull in flight may return (its messages are nacked
    at once) before it is cancelled; those of a cancelled Pull come back only after the ack
    deadline."""
    client: Literal["asyncio", "threads"] = "asyncio"
    """Pull mode: ``asyncio``: ``SubscriberAsyncClient`` on grpc.aio; ``threads``: the
    blocking client in worker threads (``python -m bench.pubsub_intake`` compares them)."""
    dead_letter_timeout_s: float = Field(default=30.0, gt=0)
    """How long a dead letter's publish may take to be confirmed (else the original is
    nacked, not acked)."""
    check_timeout_s: float = Field(default=10.0, gt=0)
    """How long the start-up check keeps retrying an unreachable Pub/Sub before it reports
    the subscription unreachable."""
    startup_wait_s: float = Field(default=300.0, ge=0)
    """How long start-up waits for a Pub/Sub that does not answer (the check again, with
    backoff) before giving up with an error."""
    # What ``admin ensure`` creates and checks; the consumer itself does not read these.
    topic: str | None = Field(default=None, pattern=TOPIC_PATTERN)
    """The topic the subscription reads (``projects/P/topics/T``). ``admin ensure`` needs it;
    the consumer does not."""
    ack_deadline_s: int = Field(default=60, ge=10, le=600)
    """The subscription's ack deadline (Pub/Sub allows 10-600 s). The consumer extends the
    leases of what it holds, so this bounds only how long the messages of a crashed consumer
    wait before Pub/Sub redelivers them."""
    retry_min_backoff_s: float = Field(default=1.0, gt=0, le=600)
    """The subscription's retry policy: a nacked message is redelivered after an exponential
    backoff from this (Pub/Sub allows up to 600 s)..."""
    retry_max_backoff_s: float = Field(default=60.0, ge=0, le=600)
    """...up to this. Short by default: the consumer nacks what it holds when it stops, and
    the other replicas should get it back within seconds."""
    policy_max_delivery_attempts: int | None = Field(default=None, ge=5, le=100)
    """The subscription's dead-letter policy: Pub/Sub moves a message delivered this often
    to ``dead_letter_topic`` (5-100). Default: ``max_delivery_attempts`` + 1 (at least 5),
    so the consumer dead-letters first, with a reason; the policy catches messages that
    kill the consumer before it can."""
    dead_letter_subscription: str | None = Field(default=None, pattern=SUBSCRIPTION_PATTERN)
    """A subscription on ``dead_letter_topic`` that keeps the dead letters (Pub/Sub drops
    messages published to a topic without subscriptions). Default: the subscription's name
    with ``-dlq`` appended."""

    @model_validator(mode="after")
    def _admin_consistent(self) -> PubSubSettings:
        if self.retry_min_backoff_s > self.retry_max_backoff_s:
            raise ValueError("retry_min_backoff_s must not exceed retry_max_backoff_s")
        if (
            self.policy_max_delivery_attempts is not None
            and self.max_delivery_attempts is not None
            and self.max_delivery_attempts >= self.policy_max_delivery_attempts
        ):
            raise ValueError(
                "max_delivery_attempts must be below policy_max_delivery_attempts (the "
                "consumer dead-letters with a reason before Pub/Sub moves the message)"
            )
        if self.topic is not None and self.topic == self.dead_letter_topic:
            raise ValueError("dead_letter_topic must differ from topic")
        return self

    def dead_letter_policy_attempts(self) -> int:
        """The dead-letter policy's ``max_delivery_attempts`` that ``admin ensure`` sets."""
        if self.policy_max_delivery_attempts is not None:
            return self.policy_max_delivery_attempts
        if self.max_delivery_attempts is None:
            return 5
        return min(100, max(5, self.max_delivery_attempts + 1))

    def flow_control(self) -> FlowControl:
        """Streaming mode: the client library's flow control (whole seconds: the client sends
        them in protobuf int fields)."""
        from google.cloud.pubsub_v1.types import FlowControl  # noqa: PLC0415 (lazy: ~40 MiB)

        return FlowControl(
            max_bytes=self.max_bytes,
            max_messages=self.max_messages,
            max_lease_duration=self.max_lease_duration_s,
            max_duration_per_lease_extension=round(self.max_lease_extension_s),
        )

    def dead_letter_subscription_path(self) -> str:
        """The subscription that keeps the dead letters (see ``dead_letter_subscription``)."""
        return self.dead_letter_subscription or f"{self.subscription}-dlq"
