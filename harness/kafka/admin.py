"""Admin calls on the harness broker through aiokafka: whether it answers, and creating a topic
that is ready to produce to."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from harness.kafka.endpoint import KafkaEndpoint


def admin_client(bootstrap_servers: str, request_timeout_ms: int = 10_000) -> Any:
    """An (unstarted) aiokafka admin client for the broker; ``await client.start()``, and
    ``await client.close()`` when done."""
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id="rowbatch-harness",
        request_timeout_ms=request_timeout_ms,
    )


async def broker_answers(bootstrap_servers: str) -> bool:
    """Whether a metadata call answers within 5 s and lists a broker."""
    admin = admin_client(bootstrap_servers, request_timeout_ms=3000)
    try:
        async with asyncio.timeout(5):
            await admin.start()
            cluster = await admin.describe_cluster()
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await admin.close()
    return bool(cluster.get("brokers"))


async def create_topic(
    endpoint: KafkaEndpoint,
    name: str,
    partitions: int = 6,
    *,
    configs: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Create a topic (replication factor 1) and wait until every partition has a leader, so
    producing to it right away cannot race the creation. ``configs``: topic configs, e.g.
    ``{"retention.ms": "60000"}``. ``exist_ok``: an existing topic with the same partition
    count is fine (with another count it is a ``ValueError``)."""
    admin = admin_client(endpoint.bootstrap_servers)
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            topic = NewTopic(name, partitions, 1, topic_configs=dict(configs or {}))
            response = await admin.create_topics([topic], timeout_ms=int(timeout_s * 1000))
            for entry in response.topic_errors:
                code = int(entry[1])
                if code == 0 or (exist_ok and code == TopicAlreadyExistsError.errno):
                    continue
                message = entry[2] if len(entry) > 2 and entry[2] else ""
                raise for_code(code)(f"creating topic {entry[0]!r}: {message}".rstrip(": "))
            # The broker's metadata cache learns of the topic (all its partitions at once: one
            # metadata batch) a moment after the controller answers; poll it, a few ms a call.
            while True:
                led = await _partitions_led(admin, name)
                if led is not None:
                    break
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise TimeoutError(
            f"creating topic {name!r} on {endpoint.bootstrap_servers}: "
            f"not done in {timeout_s:.0f} s"
        ) from None
    finally:
        await admin.close()
    if led != partitions:
        raise ValueError(f"topic {name!r} exists with {led} partitions, not {partitions}")


async def _partitions_led(admin: Any, name: str) -> int | None:
    """The topic's partition count once the broker knows it and each partition has a
    leader; None before that."""
    for topic in await admin.describe_topics([name]):
        if topic["topic"] != name or topic["error_code"] != 0:
            return None
        parts = topic["partitions"]
        if parts and all(p["error_code"] == 0 and p["leader"] >= 0 for p in parts):
            return len(parts)
    return None
