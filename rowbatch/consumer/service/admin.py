"""``rowbatch-consumer admin ensure --config X.toml [--dry-run]``: create on the broker what the
consumer configuration needs when it is absent, and check it when it is present, naming every
difference (nothing that exists is changed).

Pub/Sub: the topic (``source.topic``), the dead-letter topic, a subscription on it that keeps
the dead letters, and the subscription with its ack deadline, retry policy and dead-letter
policy. Kafka: the topic (partitions, replication factor, ``retention.ms``) and its
dead-letter topic (``<topic>.dlq`` by default). A Kafka share group (``kind = "kafka-share"``):
the same two topics, and the group's ``share.auto.offset.reset`` and
``share.record.lock.duration.ms`` where they are not set on the group yet (unless
``configure_group = false``; a value set on the group to something else differs).

Exit codes: 0 everything exists as configured (or was created; a dry run: could be);
1 the broker refused a call; 2 bad configuration; 3 something exists but differs;
4 the broker did not answer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from rowbatch.consumer.service.config import ConfigError, SourceSettings, load_config
from rowbatch.consumer.sources.admin_plan import AdminFailed, AdminUnreachable, Plan, Step
from rowbatch.consumer.sources.base import SourceConfigError
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.pubsub_env import project_of

if TYPE_CHECKING:  # each broker's client is imported only when its source is configured
    from rowbatch.consumer.sources.pubsub.admin import PubSubLayout

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_CONFIG = 2
EXIT_DIFFERS = 3
EXIT_UNREACHABLE = 4


def pubsub_layout(settings: PubSubSettings) -> PubSubLayout:
    """What ``settings`` needs on Pub/Sub; ``ConfigError`` when a field the creation needs
    is missing."""
    from rowbatch.consumer.sources.pubsub.admin import PubSubLayout, SubscriptionSpec  # noqa: PLC0415

    if settings.topic is None or settings.dead_letter_topic is None:
        what = {"topic": "what the subscription reads", "dead_letter_topic": "for dead letters"}
        missing = [f"source.{n} ({w})" for n, w in what.items() if getattr(settings, n) is None]
        raise ConfigError(f"admin ensure needs {' and '.join(missing)}")
    return PubSubLayout(
        topic=settings.topic,
        dead_letter_topic=settings.dead_letter_topic,
        subscription=SubscriptionSpec(
            name=settings.subscription,
            topic=settings.topic,
            ack_deadline_s=settings.ack_deadline_s,
            retry_backoff_s=(settings.retry_min_backoff_s, settings.retry_max_backoff_s),
            dead_letter_topic=settings.dead_letter_topic,
            max_delivery_attempts=settings.dead_letter_policy_attempts(),
        ),
        dead_letter_subscription=SubscriptionSpec(
            name=settings.dead_letter_subscription_path(), topic=settings.dead_letter_topic
        ),
    )


def _ensure_pubsub(settings: PubSubSettings, *, dry_run: bool, timeout_s: float) -> Plan:
    from rowbatch.consumer.sources.pubsub.admin import GooglePubSubAdmin  # noqa: PLC0415
    from rowbatch.consumer.sources.pubsub.admin import ensure as ensure_pubsub  # noqa: PLC0415

    layout = pubsub_layout(settings)
    admin = GooglePubSubAdmin(timeout_s=timeout_s, project=project_of(settings.subscription))
    try:
        return ensure_pubsub(admin, layout, dry_run=dry_run)
    finally:
        admin.close()


async def _ensure_kafka(settings: KafkaSettings, *, dry_run: bool, timeout_s: float) -> Plan:
    from rowbatch.consumer.sources.kafka.admin import AioKafkaAdmin, TopicSpec  # noqa: PLC0415
    from rowbatch.consumer.sources.kafka.admin import ensure as ensure_kafka  # noqa: PLC0415

    topics = [
        (
            "topic",
            TopicSpec(
                settings.topic,
                settings.partitions,
                settings.replication_factor,
                settings.retention_ms,
            ),
        ),
        (
            "dead-letter topic",
            TopicSpec(
                settings.dlq_topic,
                settings.dead_letter_partitions,
                settings.replication_factor,
                settings.retention_ms,
            ),
        ),
    ]
    async with AioKafkaAdmin(settings.client_options(), timeout_s=timeout_s) as admin:
        return await ensure_kafka(admin, topics, dry_run=dry_run)


async def _ensure_kafka_share(
    settings: KafkaShareSettings, *, dry_run: bool, timeout_s: float
) -> Plan:
    """The topics as for the classic source (the same brokers, security and layout), then the
    share group's configs."""
    planned = await _ensure_kafka(settings.classic_view(), dry_run=dry_run, timeout_s=timeout_s)
    if not settings.configure_group:
        note = (
            f"configure_group = false: the configs of share group {settings.group_id!r} are "
            "left as they are"
        )
        return dataclasses.replace(planned, notes=(*planned.notes, note))
    group = await asyncio.to_thread(
        _ensure_share_group, settings, dry_run=dry_run, timeout_s=timeout_s
    )
    return dataclasses.replace(planned, steps=(*planned.steps, group))


def _ensure_share_group(settings: KafkaShareSettings, *, dry_run: bool, timeout_s: float) -> Step:
    from rowbatch.consumer.sources.kafka_share import group_config  # noqa: PLC0415

    configs = group_config.ConfluentGroupConfigs.of(settings, timeout_s=timeout_s)
    return group_config.ensure(
        configs, settings.group_id, group_config.wanted(settings), dry_run=dry_run
    )


async def ensure_source(
    settings: SourceSettings, *, dry_run: bool = False, timeout_s: float = 30.0
) -> Plan:
    """Create what the ``[source]`` settings need on their broker, check what exists, and
    return the plan (what was created, what differs). For the demo, tests and the CLI."""
    if isinstance(settings, PubSubSettings):
        return await asyncio.to_thread(
            _ensure_pubsub, settings, dry_run=dry_run, timeout_s=timeout_s
        )
    if isinstance(settings, KafkaShareSettings):
        return await _ensure_kafka_share(settings, dry_run=dry_run, timeout_s=timeout_s)
    if not isinstance(settings, KafkaSettings):
        raise SourceConfigError(
            f"admin ensure: [source] kind = {settings.kind!r} reads a stored table and has no "
            "broker to set up"
        )
    return await _ensure_kafka(settings, dry_run=dry_run, timeout_s=timeout_s)


def ensure_broker(
    config_path: Path | None,
    *,
    dry_run: bool = False,
    timeout_s: float = 30.0,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Run ``admin ensure``: print the plan (and what was done) to ``out``, errors to
    ``err``; return the exit code (see the module docstring)."""
    try:
        config = load_config(config_path)
        source = config.source
        planned = asyncio.run(ensure_source(source, dry_run=dry_run, timeout_s=timeout_s))
    except (ConfigError, SourceConfigError) as exc:
        print(f"error: {exc}", file=err)
        return EXIT_CONFIG
    except AdminUnreachable as exc:
        print(f"error: {exc}", file=err)
        return EXIT_UNREACHABLE
    except AdminFailed as exc:
        print(f"error: {exc}", file=err)
        return EXIT_REFUSED
    for line in planned.lines():
        print(line, file=out)
    creates, differs = len(planned.to_create), len(planned.differing)
    if dry_run:
        print(f"dry run: nothing changed ({creates} to create, {differs} differ)", file=out)
    else:
        print(f"created {creates}; {differs} differ", file=out)
    if differs:
        print(
            f"error: {differs} existing resource(s) differ from the configuration (listed "
            f"above as DIFFERS); admin ensure changes nothing that exists: change the "
            f"resource by hand or the configuration",
            file=err,
        )
        return EXIT_DIFFERS
    return EXIT_OK
