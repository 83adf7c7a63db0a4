"""Honest memory accounting on Pub/Sub (unary pull, the default mode): what a held 1-row
message costs against what the budget charges it, measured as in ``test_memory_accounting``
(which does it for Kafka): the real ``PubSubPullSource`` over a fake Pull client that parses
each Pull response from its wire bytes inside the measured window (as grpc does), with Pub/Sub's
long ack ids, and the real ``Pipeline`` holding every message (never answered).

``python -m tests.unit.consumer.engine.test_memory_accounting_pubsub`` prints the figures."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from google.pubsub_v1 import types as pstypes

from rowbatch.consumer.engine.budget import ByteBudget
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from tests.unit.consumer.engine.test_memory_accounting import (
    REPO,
    TOLERANCE,
    Held,
    Message,
    holding_pipeline,
    messages,
    rss,
    until,
)

SUB = "projects/p/subscriptions/memory"
ACK_ID_CHARS = 176
"""Ack ids Pub/Sub hands out are opaque strings of about this length (the emulator's are
shorter; production's are what a consumer holds)."""


def wire_messages(batch: list[Message]) -> list[bytes]:
    """Each message as the serialized ``ReceivedMessage`` a Pull response carries."""
    stamp = datetime.fromtimestamp(1_700_000_000.5, UTC)
    out = []
    for i, (payload, headers) in enumerate(batch):
        message = pstypes.PubsubMessage(
            data=payload,
            message_id=f"{10**15 + i}",
            attributes={k: v.decode() for k, v in headers},
            publish_time=stamp,
        )
        ack_id = f"{i:012d}".ljust(ACK_ID_CHARS, "A")
        item = pstypes.ReceivedMessage(ack_id=ack_id, message=message, delivery_attempt=1)
        out.append(pstypes.ReceivedMessage.serialize(item))
    return out


class WireRpc:
    """Pull answers from ``backlog``, each message parsed from its bytes when it is pulled;
    a Pull on an empty backlog waits (no timer)."""

    def __init__(self) -> None:
        self.backlog: list[bytes] = []
        self._more = asyncio.Event()

    def publish(self, items: Sequence[bytes]) -> None:
        self.backlog += items
        self._more.set()

    async def pull(self, max_messages: int) -> Sequence[Any]:
        while not self.backlog:
            self._more.clear()
            await self._more.wait()
        taken, self.backlog = self.backlog[:max_messages], self.backlog[max_messages:]
        parse = pstypes.ReceivedMessage.pb().FromString
        return [parse(raw) for raw in taken]

    async def acknowledge(self, ack_ids: list[str]) -> None:
        pass

    async def modify_ack_deadline(self, ack_ids: list[str], seconds: int) -> None:
        pass

    async def close(self) -> None:
        pass


async def hold(batch: list[Message], needed: tuple[str, ...], measure: Callable[[], int]) -> Held:
    """The pull source receives ``batch`` and the pipeline takes every message in (held,
    never answered). Returns the growth of ``measure()`` and what the budget charged."""
    rpc = WireRpc()
    n = len(batch)
    source = PubSubPullSource(
        PubSubSettings(
            subscription=SUB,
            max_messages=n,
            max_bytes=10**12,
            max_lease_extension_s=600,
            max_lease_duration_s=10**6,
        ),
        rpc=rpc,
    )
    budget = ByteBudget(10**12)
    pipeline = holding_pipeline(source, needed, budget)
    raw = wire_messages(batch)
    gc.collect()
    before = measure()
    rpc.publish(raw)  # the wire bytes stay alive: they are not the consumer's memory
    stop = asyncio.Event()
    task = asyncio.create_task(pipeline.run(stop))
    await until(lambda: len(pipeline._ledger) == n)
    gc.collect()
    grew = measure() - before
    charged = budget.used
    del raw
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await source.close()
    return Held(n, grew, charged)


async def read_ahead(batch: list[Message], measure: Callable[[], int]) -> Held:
    """The pull source receives ``batch`` and yields one message: the rest wait as its
    read-ahead. Returns the growth of ``measure()`` and what the read-ahead was charged
    (``ahead_bytes``, what the shared budget holds)."""
    rpc = WireRpc()
    n = len(batch)
    source = PubSubPullSource(
        PubSubSettings(subscription=SUB, max_messages=n, max_bytes=10**12), rpc=rpc
    )
    raw = wire_messages(batch)
    gc.collect()
    before = measure()
    rpc.publish(raw)
    iterator = source.deliveries()
    await anext(iterator)
    await until(lambda: source.buffered == n - 1)
    gc.collect()
    grew = measure() - before
    charged = source._held.ahead_bytes
    del raw
    await source.close()
    return Held(n - 1, grew, charged)


def probe(kind: str, encoding: str, n: int, taken: bool = True) -> dict[str, Any]:
    """One RSS measurement (run it in a fresh process); ``taken``: held by the pipeline, else
    waiting in the source's read-ahead."""
    batch, needed = messages(kind, encoding, n)
    held = asyncio.run(hold(batch, needed, rss) if taken else read_ahead(batch, rss))
    return {"n": held.n, "measured": held.measured, "charged": held.charged}


def probe_in_subprocess(kind: str, encoding: str, n: int, taken: bool = True) -> Held:
    code = (
        "import json; from tests.unit.consumer.engine.test_memory_accounting_pubsub import "
        f"probe; print(json.dumps(probe({kind!r}, {encoding!r}, {n}, {taken})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return Held(got["n"], got["measured"], got["charged"])


@pytest.mark.parametrize(("kind", "encoding"), [("numeric", "json"), ("numeric", "arrow")])
def test_a_held_1_row_pubsub_message_is_charged_what_it_really_costs(
    kind: str, encoding: str
) -> None:
    held = probe_in_subprocess(kind, encoding, 10_000)
    print(
        f"\npubsub {kind} {encoding}: RSS {held.measured / held.n:,.0f} B per held message, "
        f"charged {held.charged / held.n:,.0f} B"
    )
    assert 1 / TOLERANCE <= held.ratio <= TOLERANCE, held


@pytest.mark.parametrize("encoding", ["json", "arrow"])
def test_pulled_messages_waiting_as_read_ahead_are_charged_what_they_cost(encoding: str) -> None:
    held = probe_in_subprocess("numeric", encoding, 10_000, taken=False)
    print(
        f"\npubsub read-ahead {encoding}: RSS {held.measured / held.n:,.0f} B per message, "
        f"charged {held.charged / held.n:,.0f} B"
    )
    assert 1 / TOLERANCE <= held.ratio <= TOLERANCE, held


@pytest.mark.parametrize("kind", ["numeric", "text"])
async def test_traced_python_memory_of_held_pubsub_messages_matches_the_charge(
    kind: str,
) -> None:
    batch, needed = messages(kind, "json", 1000)
    tracemalloc.start()
    try:
        held = await hold(batch, needed, lambda: tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    assert 1 / TOLERANCE <= held.ratio <= TOLERANCE, held


if __name__ == "__main__":
    for encoding in ("json", "arrow"):
        for n in (10_000, 20_000):
            held = probe_in_subprocess("numeric", encoding, n, taken=False)
            print(
                f"read-ahead {encoding:6s} n={n}: RSS {held.measured / held.n:,.0f} B per "
                f"message, charged {held.charged / held.n:,.0f} B ({held.ratio:.2f}x)"
            )
    for kind, encoding in (("numeric", "json"), ("numeric", "arrow"), ("text", "json")):
        for n in (10_000, 20_000):
            held = probe_in_subprocess(kind, encoding, n)
            print(
                f"{kind:8s} {encoding:6s} n={n}: RSS {held.measured / n:,.0f} B per held "
                f"message, charged {held.charged / n:,.0f} B ({held.ratio:.2f}x)"
            )
