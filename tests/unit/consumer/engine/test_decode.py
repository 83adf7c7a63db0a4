"""MessageDecoder: the memory a decoded message is charged (the budget counts text by its
length)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain

import numpy as np
import pytest

import rowbatch.consumer.engine.decode as decode_module
from rowbatch.consumer.engine.decode import MessageDecoder, PoisonMessage, rows_cost
from rowbatch.consumer.observe.costs import message_cost
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.chunks.decode import DecodedChunk, decode_chunk
from rowbatch.wire.chunks.encode import encode_chunk


def no_check(chunk: DecodedChunk) -> None:
    pass


@pytest.mark.parametrize("encoding", ["json", "arrow"])
def test_text_is_charged_by_length_and_nulls_by_a_pointer(encoding: str) -> None:
    texts = ["", "abc", "héllo", None, "x" * 100]
    enc = encode_chunk("t", {"s": texts, "n": np.arange(5)}, encoding, "c")
    rows = MessageDecoder(("s", "n"), no_check).rows(
        Delivery("m", enc.payload, enc.attributes, 0, 1, "s")
    )
    strings = sum(len(t) + 49 for t in texts if t is not None) + 16
    assert rows.nbytes == strings + 5 * 8 + 5 * 8  # object pointers + int64 values
    without_null = encode_chunk("t", {"s": ["ab", "c"]}, encoding, "c")
    delivery = Delivery("m", without_null.payload, without_null.attributes, 0, 1, "s")
    assert MessageDecoder(("s",), no_check).rows(delivery).nbytes == (2 + 49) + (1 + 49) + 2 * 8


def test_an_unexpected_decoder_error_is_poison_not_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import rowbatch.consumer.engine.decode as intake_module

    def broken(payload: bytes, attributes: object) -> object:
        raise UnicodeDecodeError("utf-8", b"\x80", 0, 1, "invalid start byte")

    monkeypatch.setattr(intake_module, "decode_chunk", broken)
    enc = encode_chunk("t", {"s": ["a"]}, "json", "c")
    with pytest.raises(PoisonMessage) as caught:
        MessageDecoder(("s",), no_check).rows(Delivery("m", enc.payload, enc.attributes, 0, 1, "s"))
    assert caught.value.reason.reason_class.value == "undecodable"
    assert caught.value.reason.code == "wire_error"
    assert "UnicodeDecodeError" in caught.value.reason.message


def _delivery(i: int, columns: dict[str, object], encoding: str = "arrow") -> Delivery:
    enc = encode_chunk("t", columns, encoding, f"c{i}")
    return Delivery(f"m{i}", enc.payload, dict(enc.attributes), 0, 1, "s")


def test_a_message_is_charged_what_message_cost_says_for_every_kind_and_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decoder measures a message's attributes and arrays once (and once per Arrow layout
    read in place): the charge equals ``message_cost`` over the message itself, also when two
    layouts alternate (each keeps its own sizes) and for JSON, nulls and text."""
    narrow = {"n": np.arange(1), "v": np.ones((1, 4), np.float32)}
    wide = {"n": np.arange(3), "v": np.ones((3, 16), np.float32)}
    order = [narrow] * 4 + [wide] * 4 + [narrow, wide] * 3
    deliveries = [_delivery(i, layout) for i, layout in enumerate(order)]
    deliveries += [
        _delivery(90, narrow, "json"),
        _delivery(91, {"n": [1, None], "v": [[1.0, 2.0], [3.0, 4.0]]}),
        _delivery(92, {"n": np.arange(2), "v": np.ones((2, 4), np.float32), "s": ["a", "b"]}),
    ]
    in_place: list[bool] = []

    def counted(payload: bytes, attributes: Mapping[str, str]) -> DecodedChunk:
        chunk = decode_chunk(payload, attributes)
        in_place.append(chunk.shared_types)
        return chunk

    monkeypatch.setattr(decode_module, "decode_chunk", counted)
    decoder = MessageDecoder(("n", "v"), no_check)
    for delivery in deliveries:
        rows = decoder.rows(delivery)
        arrays = chain(rows.columns.values(), rows.nulls.values())
        want = message_cost(len(delivery.payload), delivery.attributes, arrays, rows.nbytes, 0)
        assert rows_cost(delivery, rows, 0) == want, delivery.message_id
        assert rows.nbytes == sum(a.nbytes for a in rows.columns.values())
    assert in_place[8:14] == [True] * 6  # the alternating layouts were read in place
