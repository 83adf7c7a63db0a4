"""The share-group source over a fake share consumer: each poll's records become deliveries
with their delivery count; ack / nack / dead_letter acknowledge them ACCEPT / RELEASE /
REJECT on the member that holds them; a member polls again only once every record of its
batch is acknowledged, and not at all while paused; close releases what is unsettled; a
record whose headers do not decode is dead-lettered by the source and rejected."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import pytest

from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.consumer.sources.kafka_share.member import Ack, ShareRecord
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.kafka_share.source import KafkaShareSource
from rowbatch.wire.dead_letter import ReasonClass


class Message:
    def __init__(self, offset: int, *, count: int = 1, headers: Any = None) -> None:
        self._offset = offset
        self._count = count
        self._headers = headers if headers is not None else [("rowbatch-table", b"t")]

    def error(self) -> Any:
        return None

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return b"payload-%d" % self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        return list(self._headers)

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def delivery_count(self) -> int:
        return self._count


class FakeShareConsumer:
    """Hands out ``batches`` in turn; refuses a poll while the last one is unacknowledged."""

    def __init__(self, batches: list[list[Message]]) -> None:
        self.batches = batches
        self.acks: list[tuple[int, Ack]] = []
        self.polls = 0
        self.commits = 0
        self.closed = False
        self._open: set[int] = set()
        self.lock = threading.Lock()

    def subscribe(self, topics: list[str]) -> None:
        assert topics == ["in"]

    def poll(self, timeout: float) -> Iterable[Message]:
        with self.lock:
            assert not self._open, "polled with records unacknowledged"
            self.polls += 1
            if not self.batches:
                threading.Event().wait(min(timeout, 0.01))
                return []
            batch = self.batches.pop(0)
            self._open = {m.offset() for m in batch}
            return batch

    def acknowledge(self, message: Message, ack_type: Ack) -> None:
        with self.lock:
            self._open.discard(message.offset())
            self.acks.append((message.offset(), ack_type))

    def commit_sync(self, timeout: float) -> dict[Any, Any]:
        self.commits += 1
        return {}

    def close(self) -> None:
        self.closed = True


def settings(**fields: Any) -> KafkaShareSettings:
    return KafkaShareSettings(
        bootstrap_servers="127.0.0.1:1", topic="in", group_id="g", members=1, **fields
    )


@pytest.fixture
def make() -> Iterator[Any]:
    made: list[KafkaShareSource] = []

    def build(batches: list[list[Message]]) -> tuple[KafkaShareSource, FakeShareConsumer]:
        fake = FakeShareConsumer(batches)
        source = KafkaShareSource(
            settings(),
            consumer_version="test",
            client=lambda: fake,
            ack_types={a: a for a in Ack},
        )
        made.append(source)
        return source, fake

    yield build
    for source in made:  # a test that failed half-way: its member threads stopped
        for member in source.members:
            member.stop()
            member.join(5.0)


async def take(source: KafkaShareSource, n: int) -> list[Delivery]:
    it = source.deliveries()
    return [await asyncio.wait_for(it.__anext__(), 5) for _ in range(n)]


async def test_a_batch_is_acknowledged_record_by_record_before_the_next_poll(make: Any) -> None:
    source, fake = make([[Message(0), Message(1, count=3)], [Message(2)]])
    first = await take(source, 2)
    assert [d.message_id for d in first] == ["in/0/0", "in/0/1"]
    assert [d.delivery_attempt for d in first] == [1, 3]
    assert first[0].attributes == {"rowbatch-table": "t"} and first[0].source == "in/0"
    await source.ack(first[0])
    await source.nack(first[1])
    [third] = await take(source, 1)  # polled only once both were acknowledged
    await source.ack(third)
    await source.close()
    assert fake.acks == [(0, Ack.ACCEPT), (1, Ack.RELEASE), (2, Ack.ACCEPT)]
    assert fake.commits >= 2 and fake.closed


async def test_close_releases_what_is_unsettled(make: Any) -> None:
    source, fake = make([[Message(0), Message(1)]])
    [a, _] = await take(source, 2)
    await source.ack(a)
    await source.close()
    assert sorted(fake.acks, key=lambda x: x[0]) == [(0, Ack.ACCEPT), (1, Ack.RELEASE)]


async def test_a_paused_member_does_not_poll(make: Any) -> None:
    source, fake = make([[Message(0)]])
    source.pause()  # before the members start: they start paused
    source.deliveries()
    source.pause()
    await source.close()
    assert fake.polls == 0 and fake.closed and fake.acks == []


async def test_dead_letters_publish_then_reject(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    source, fake = make([[Message(0)]])
    published: list[tuple[ShareRecord, list[tuple[str, bytes]]]] = []
    monkeypatch.setattr(source, "_publish", lambda r, h, m: published.append((r, h)))
    [d] = await take(source, 1)
    await source.dead_letter(d, DeadLetterReason(ReasonClass.REJECTED_BY_MODEL, "bad", "x"))
    await source.close()
    assert fake.acks == [(0, Ack.REJECT)]
    [(record, headers)] = published
    assert record.value == b"payload-0"
    assert (b"rejected-by-model") in dict(headers).values()


async def test_undecodable_headers_are_dead_lettered_by_the_source(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, fake = make([[Message(0, headers=[("rowbatch-table", b"\xff")]), Message(1)]])
    published: list[Any] = []
    monkeypatch.setattr(source, "_publish", lambda r, h, m: published.append(r.offset))
    [good] = await take(source, 1)  # only the decodable one is yielded
    assert good.message_id == "in/0/1"
    await source.ack(good)
    await source.close()
    assert published == [0]
    assert sorted(fake.acks, key=lambda x: x[0]) == [(0, Ack.REJECT), (1, Ack.ACCEPT)]


def test_settings_refuse_more_attempts_than_the_broker_allows() -> None:
    with pytest.raises(ValueError, match="archives a record after at most 10"):
        settings(max_delivery_attempts=11)
    assert settings().dlq_topic == "in.dlq"


def test_a_batch_wait_past_a_quarter_of_the_lock_is_refused() -> None:
    from rowbatch.consumer.service.config import ConsumerConfig

    base = {
        "source": {
            "kind": "kafka-share",
            "bootstrap_servers": "127.0.0.1:9092",
            "topic": "in",
            "group_id": "g",
            "lock_duration_s": 2,
        },
        "model": {"name": "m", "max_wait_ms": 400},
        "binding": {"inputs": {"x": "X"}, "outputs": {"Y": "y"}},
    }
    config = ConsumerConfig.model_validate(base)
    assert isinstance(config.source, KafkaShareSettings) and config.source.members == 2
    with pytest.raises(ValueError, match=r"over a quarter of source\.lock_duration_s"):
        ConsumerConfig.model_validate(base | {"model": {"name": "m", "max_wait_ms": 600}})
