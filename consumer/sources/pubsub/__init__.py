"""The Google Cloud Pub/Sub source: unary pull (the default, ``PubSubPullSource``) or
streaming pull (``PubSubSource``), with lease extension and dead letters published with their
reason."""

from rowbatch.consumer.sources.pubsub.clients import check_credentials
from rowbatch.consumer.sources.pubsub.config import PubSubPullSourceConfig, PubSubSourceConfig
from rowbatch.consumer.sources.pubsub.errors import (
    DeadLetterFailed,
    PubSubConfigError,
    PubSubCredentialsError,
    PubSubPullError,
    PubSubSourceError,
    PubSubStreamError,
    PubSubUnreachable,
)
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource

__all__ = [
    "DeadLetterFailed",
    "PubSubConfigError",
    "PubSubCredentialsError",
    "PubSubPullError",
    "PubSubPullSource",
    "PubSubPullSourceConfig",
    "PubSubSource",
    "PubSubSourceConfig",
    "PubSubSourceError",
    "PubSubStreamError",
    "PubSubUnreachable",
    "check_credentials",
]
