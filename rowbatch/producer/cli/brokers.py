"""The publisher the command-line options describe: Pub/Sub or Kafka, with their limits, retries
and timeouts."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rowbatch.producer.cli.running import UsageError
from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.kafka import KafkaPublisher, KafkaPublisherSettings
from rowbatch.producer.publishers.pubsub import PubSubPublisher, PubSubPublisherSettings
from rowbatch.producer.publishers.retry import PublishRetry

PublisherFactory = Callable[[argparse.Namespace], Publisher]


def make_publisher(opts: argparse.Namespace) -> Publisher:
    """The publisher the options describe (not started)."""
    retry = PublishRetry(attempts=opts.retries)
    if opts.broker == "pubsub":
        if opts.compression != "none":
            raise UsageError("--compression is for Kafka; Pub/Sub compresses on the wire itself")
        kwargs: dict[str, Any] = {}
        if opts.max_message_bytes is not None:
            kwargs["max_message_bytes"] = opts.max_message_bytes
        try:
            return PubSubPublisher(
                opts.topic,
                project=opts.project,
                emulator_host=opts.emulator_host,
                settings=PubSubPublisherSettings(
                    ordering=opts.ordering_key is not None,
                    retry=retry,
                    connect_timeout_s=opts.connect_timeout,
                    **kwargs,
                ),
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if not opts.bootstrap:
        raise UsageError("--broker kafka needs --bootstrap HOST:PORT (or $KAFKA_BOOTSTRAP_SERVERS)")
    kwargs = {}
    if opts.max_message_bytes is not None:
        kwargs["max_message_bytes"] = opts.max_message_bytes
    try:
        return KafkaPublisher(
            opts.bootstrap,
            opts.topic,
            settings=KafkaPublisherSettings(
                compression=None if opts.compression == "none" else opts.compression,
                connect_timeout_s=opts.connect_timeout,
                retry=retry,
                **kwargs,
            ),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


__all__ = ["PublisherFactory", "make_publisher"]
