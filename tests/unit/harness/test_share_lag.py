"""``harness.kafka.share.share_group_lag`` reads with the consumer's own reader
(``ShareOffsetsReader``, here a fake): the bootstrap and the timeout reach it, the reader is
closed, its errors (and no answer in time) are ``ShareGroupError``, and it may be called from
a thread that runs an event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from harness.kafka import share
from harness.kafka.share import ShareGroupError, SharePartitionOffset, share_group_lag
from rowbatch.consumer.sources.kafka_share import share_offsets
from rowbatch.consumer.sources.kafka_share.share_offsets import ShareOffsetsError, Topics


class FakeReader:
    made: list[FakeReader] = []  # noqa: RUF012 - the readers the calls made, per test
    answer: Any = None

    def __init__(self, options: dict[str, Any], group: str, *, request_timeout_s: float) -> None:
        self.options, self.group, self.timeout_s = options, group, request_timeout_s
        self.asked: list[Topics | None] = []
        self.closed = False
        FakeReader.made.append(self)

    async def read(self, topics: Topics | None = None) -> Any:
        self.asked.append(topics)
        if isinstance(FakeReader.answer, BaseException):
            raise FakeReader.answer
        if FakeReader.answer == "hang":
            await asyncio.Event().wait()
        return FakeReader.answer

    async def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def fake_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeReader.made = []
    monkeypatch.setattr(share, "ShareOffsetsReader", FakeReader)


def test_the_product_s_reader_answers() -> None:
    FakeReader.answer = {("t", 0): SharePartitionOffset(4, 0, 6)}
    assert share_group_lag("k:1", "g", {"t": [0]}, timeout_s=3.0) == FakeReader.answer
    (reader,) = FakeReader.made
    assert reader.options == {"bootstrap_servers": "k:1", "client_id": "rowbatch-harness"}
    assert (reader.group, reader.timeout_s, reader.asked) == ("g", 3.0, [{"t": [0]}])
    assert reader.closed


def test_the_offsets_type_is_the_product_s() -> None:
    assert SharePartitionOffset is share_offsets.SharePartitionOffset


def test_a_refusal_is_a_share_group_error() -> None:
    FakeReader.answer = ShareOffsetsError("GROUP_AUTHORIZATION_FAILED (error 30)")
    with pytest.raises(ShareGroupError, match=r"GROUP_AUTHORIZATION_FAILED \(error 30\)"):
        share_group_lag("k:1", "g")
    assert FakeReader.made[0].closed


def test_no_answer_in_time_is_a_share_group_error() -> None:
    FakeReader.answer = "hang"
    with pytest.raises(ShareGroupError, match=r"'g' at k:1: no answer within 0.05 s"):
        share_group_lag("k:1", "g", timeout_s=0.05)
    assert FakeReader.made[0].closed


async def test_it_may_be_called_where_a_loop_runs() -> None:
    FakeReader.answer = {}
    assert share_group_lag("k:1", "g") == {}
