"""The two aiokafka clients of the Kafka source, the group consumer and the dead-letter
producer: created on first use, started within ``check_timeout_s`` (a failed start raises
``KafkaUnreachable`` with the brokers' own reasons), the start-up topic check, and stopping."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiokafka.errors import KafkaError

from rowbatch.consumer.sources.kafka.causes import ConnectCauses, connect_causes
from rowbatch.consumer.sources.kafka.errors import (
    KafkaConfigError,
    KafkaSourceError,
    KafkaUnreachable,
)
from rowbatch.consumer.sources.kafka.settings import KafkaSettings

_LOG = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 30.0


class KafkaClients:
    """The consumer and producer of one source. ``closed()`` says whether the source is
    closed (no client is started then); ``consumer_factory``/``producer_factory`` make the
    aiokafka clients from their options."""

    def __init__(
        self,
        config: KafkaSettings,
        *,
        consumer_factory: Callable[..., Any],
        producer_factory: Callable[..., Any],
        closed: Callable[[], bool],
    ) -> None:
        self._config = config
        self._consumer_factory = consumer_factory
        self._producer_factory = producer_factory
        self._closed = closed
        self._start_lock = asyncio.Lock()
        self.consumer: Any = None
        self.producer: Any = None
        self.consumer_started = False
        self._producer_started = False

    def started_consumer(self) -> Any | None:
        """The consumer once it is started, else None."""
        return self.consumer if self.consumer_started else None

    async def check_topics(self) -> None:
        """The brokers answer (``KafkaUnreachable`` naming them, within ``check_timeout_s``)
        and the topic and the dead-letter topic exist (``KafkaConfigError`` naming the
        missing ones)."""
        config = self._config
        producer = await self.ensure_producer()
        try:
            async with asyncio.timeout(config.check_timeout_s):
                cluster = await producer.client.fetch_all_metadata()
        except (KafkaError, OSError, TimeoutError) as exc:
            raise self._unreachable(exc, "reading topic metadata") from exc
        missing = [
            t for t in (config.topic, config.dlq_topic) if not cluster.partitions_for_topic(t)
        ]
        if missing:
            known = sorted(t for t in cluster.topics() if not t.startswith("__"))
            shown = ", ".join(known[:10]) + (", ..." if len(known) > 10 else "")
            names = " and ".join(repr(t) for t in missing)
            raise KafkaConfigError(
                f"Kafka topic{'s' if len(missing) > 1 else ''} {names} "
                f"do{'' if len(missing) > 1 else 'es'} not exist on "
                f"{config.bootstrap_servers} (topics there: {shown or 'none'}); the "
                f"dead-letter topic is source.dead_letter_topic (default '<topic>.dlq')"
            )

    async def ensure_producer(self) -> Any:
        """The dead-letter producer, started."""
        async with self._start_lock:
            if self._closed():
                raise KafkaSourceError("the Kafka source is closed")
            if self.producer is None:
                self.producer = self._producer_factory(**self._config.producer_options())
            if not self._producer_started:
                with connect_causes(self._config.bootstrap_servers) as causes:
                    try:
                        async with asyncio.timeout(self._config.check_timeout_s):
                            await self.producer.start()
                    except (KafkaError, OSError, TimeoutError) as exc:
                        # aiokafka cannot start a client twice: stop it, make a new one later.
                        producer, self.producer = self.producer, None
                        with contextlib.suppress(Exception):
                            await producer.stop()
                        doing = "starting the dead-letter producer"
                        raise self._unreachable(exc, doing, causes) from exc
                self._producer_started = True
            return self.producer

    async def ensure_consumer(self, listener: Any, on_start: Callable[[], None]) -> Any:
        """The group consumer, subscribed to the topic with ``listener`` and started (which
        joins the group); ``on_start()`` is called once, when it has just started."""
        config = self._config
        async with self._start_lock:
            if self._closed():
                raise KafkaSourceError("the Kafka source is closed")
            if self.consumer_started:
                return self.consumer
            consumer = self._consumer_factory(**config.consumer_options())
            self.consumer = consumer
            consumer.subscribe([config.topic], listener=listener)
            with connect_causes(config.bootstrap_servers) as causes:
                try:  # waits for the group's assignment: a rebalance may take a while
                    async with asyncio.timeout(config.join_timeout_s):
                        await consumer.start()
                except (KafkaError, OSError, TimeoutError) as exc:
                    self.consumer = None
                    with contextlib.suppress(Exception):
                        await consumer.stop()
                    doing = f"joining group {config.group_id!r}"
                    raise self._unreachable(exc, doing, causes, config.join_timeout_s) from exc
            self.consumer_started = True
            on_start()
            _LOG.info(
                "Kafka consumer started: topic %s, group %s, brokers %s",
                config.topic,
                config.group_id,
                config.bootstrap_servers,
            )
            return consumer

    async def stop(self) -> None:
        """Stop both clients (leaving the group); problems are logged."""
        if self.consumer is not None:
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self.consumer.stop()
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.warning("Kafka consumer did not stop cleanly: %r", exc)
        if self.producer is not None:
            try:
                async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                    await self.producer.stop()
            except (KafkaError, OSError, TimeoutError) as exc:
                _LOG.warning("Kafka dead-letter producer did not stop cleanly: %r", exc)

    def _unreachable(
        self,
        exc: BaseException,
        doing: str,
        causes: ConnectCauses | None = None,
        timeout_s: float | None = None,
    ) -> KafkaUnreachable:
        config = self._config
        reason = (
            f"no answer within {timeout_s or config.check_timeout_s:g} s"
            if isinstance(exc, TimeoutError)
            else f"{type(exc).__name__}: {exc}"
        )
        return KafkaUnreachable(
            f"cannot reach Kafka at {config.bootstrap_servers} ({doing}; "
            f"security_protocol {config.security_protocol}): {reason}"
            f"{causes.describe() if causes else ''}"
        )


__all__ = ["KafkaClients"]
