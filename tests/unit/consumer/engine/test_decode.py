"""MessageDecoder: the memory a decoded message is charged (the budget counts text by its
length)."""

from __future__ import annotations

import numpy as np
import pytest

from rowbatch.consumer.engine.decode import MessageDecoder, PoisonMessage
from rowbatch.consumer.sources.base import Delivery
from rowbatch.wire.chunks.decode import DecodedChunk
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
