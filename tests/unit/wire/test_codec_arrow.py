"""Arrow streams whose schema was seen before are read without the stream reader (one record
batch against the known schema): the same columns, and for anything else (more batches,
trailing bytes, corruption, dictionaries) the stream reader's own result or error."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rowbatch.wire import codec_arrow
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodeOptions, encode_chunk
from rowbatch.wire.codec_arrow import decode_arrow
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import Encoding
from tests.unit.wire.helpers import ChunkCase, chunk_cases

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(payload: bytes) -> Any:
    """Comparable result of one decode: names and columns (bit for bit), or the error."""
    try:
        names, columns = decode_arrow(payload)
    except WireError as exc:
        return ("error", type(exc).__name__, str(exc), exc.reason)
    except Exception as exc:  # e.g. a field name that is not UTF-8 (see below)
        return ("raised", type(exc).__name__, str(exc))
    return (
        names,
        [
            (
                c.name,
                str(c.type),
                str(c.values.dtype),
                c.values.shape,
                c.values.flags.writeable,
                c.values.tolist() if c.values.dtype == object else c.values.tobytes(),
                None if c.nulls is None else (c.nulls.tolist(), c.nulls.flags.writeable),
            )
            for c in columns
        ],
    )


@contextmanager
def schemas() -> Iterator[dict[bytes, Any]]:
    """Empty schema and layout caches for the duration (the module's are restored after)."""
    with (
        mock.patch.dict(codec_arrow._KNOWN_SCHEMAS, clear=True),
        mock.patch.dict(codec_arrow._LAYOUTS, clear=True),
        mock.patch.object(codec_arrow, "_RECENT", []),
    ):
        yield codec_arrow._KNOWN_SCHEMAS


def cold(payload: bytes) -> Any:
    with schemas():
        return outcome(payload)


def warm(payload: bytes, primer: bytes) -> Any:
    """The outcome once ``primer`` (a good stream) has put its schema in the cache, and its
    layout when its columns are fixed-width numbers without nulls (decoded twice)."""
    with schemas() as known:
        decode_arrow(primer)
        assert known
        decode_arrow(primer)
        return outcome(payload)


def stream(batches: list[pa.RecordBatch], *, end: bool = True) -> bytes:
    sink = pa.BufferOutputStream()
    writer = pa.ipc.new_stream(sink, batches[0].schema)
    for batch in batches:
        writer.write_batch(batch)
    if end:
        writer.close()
    return bytes(sink.getvalue().to_pybytes())


BATCH = pa.record_batch(
    [
        pa.array([1, 2, None], pa.int64()),
        pa.array(["a", None, "c"], pa.string()),
        pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 2),
        pa.array([0.5, 1.5, 2.5], pa.float64()),
    ],
    names=["i", "s", "v", "f"],
)
GOOD = stream([BATCH])


def test_fast_path_is_taken_once_the_schema_is_known() -> None:
    with schemas() as known:
        assert codec_arrow._decode_known(GOOD, pa.py_buffer(GOOD)) is None
        decode_arrow(GOOD)
        assert len(known) == 1
        assert codec_arrow._decode_known(GOOD, pa.py_buffer(GOOD)) is not None
    assert warm(GOOD, GOOD) == cold(GOOD)


def test_known_schema_keeps_zero_copy_views() -> None:
    payload = encode_chunk(
        "t", {"i": np.arange(4), "v": np.ones((4, 3), np.float32)}, Encoding.ARROW, "c"
    ).payload
    with schemas():
        decode_arrow(payload)
        names, cols = decode_arrow(payload)
    raw = np.frombuffer(payload, dtype=np.uint8)
    assert names == ["i", "v"]
    for col in cols:
        assert np.shares_memory(col.values, raw)
        assert not col.values.flags.writeable


NUMERIC = pa.record_batch(
    [
        pa.array([1, 2, 3], pa.int64()),
        pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.float32)), 2),
        pa.array([0.5, 1.5, 2.5], pa.float32()),
    ],
    names=["i", "v", "f"],
)


def test_a_layout_seen_before_is_read_in_place() -> None:
    """Fixed-width columns without nulls, the same bytes up to the body: read at the same
    offsets (views of the payload), the same columns bit for bit as the stream reader's."""
    first, second = stream([NUMERIC]), stream([NUMERIC.slice(0, 3)])
    flipped = bytearray(first)
    flipped[-16] ^= 0x55  # a body byte: another value of the last column, the same layout
    other = bytes(flipped)
    with schemas():
        decode_arrow(first)
        assert not codec_arrow._LAYOUTS
        decode_arrow(first)
        assert len(codec_arrow._LAYOUTS) == 1
        assert codec_arrow._decode_layout(other) is not None
        names, cols = decode_arrow(other)
    raw = np.frombuffer(other, dtype=np.uint8)
    assert names == ["i", "v", "f"]
    assert all(np.shares_memory(c.values, raw) for c in cols)
    assert all(not c.values.flags.writeable for c in cols)
    assert warm(other, first) == cold(other)
    assert warm(second, first) == cold(second)


def test_layouts_are_not_kept_for_nulls_text_or_compression() -> None:
    with_nulls = pa.record_batch([pa.array([1, None], pa.int64())], names=["i"])
    for payload in (GOOD, stream([with_nulls])):
        with schemas():
            decode_arrow(payload)
            decode_arrow(payload)
            assert not codec_arrow._LAYOUTS
    compressed = encode_chunk(
        "t", {"i": np.arange(4)}, Encoding.ARROW, "c", options=EncodeOptions(compression="zstd")
    ).payload
    with schemas():
        decode_arrow(compressed)
        decode_arrow(compressed)
        assert not codec_arrow._LAYOUTS


@pytest.mark.parametrize(
    "payload",
    [
        stream([NUMERIC]),
        stream([NUMERIC], end=False),
        stream([NUMERIC]) + b"\x00" * 8,
        stream([NUMERIC])[:-1],
        stream([NUMERIC])[:-8] + b"\x00" * 8,
        stream([NUMERIC, NUMERIC]),
        stream([NUMERIC.slice(0, 2)]),
    ],
)
def test_streams_decode_alike_with_a_known_layout(payload: bytes) -> None:
    assert warm(payload, stream([NUMERIC])) == cold(payload)


@pytest.mark.parametrize(
    "payload",
    [
        GOOD,
        stream([BATCH], end=False),
        stream([BATCH, BATCH]),
        stream([BATCH.slice(0, 0)]),
        stream([BATCH.slice(1, 2)]),
        GOOD + b"\x00",
        GOOD + b"\x00" * 8,
        GOOD + GOOD,
        GOOD[:-1],
        GOOD[:-8] + b"\xff\xff\xff\xff\x00\x00\x00",
        GOOD[:-8] + b"\x00\x00\x00\x00",
        GOOD[:-9],
        GOOD[: len(GOOD) // 2],
        stream([BATCH])[:300] + stream([BATCH])[:300],
    ],
)
def test_streams_decode_alike_with_a_known_schema(payload: bytes) -> None:
    assert warm(payload, GOOD) == cold(payload)


def test_streams_with_dictionaries_are_not_remembered() -> None:
    batch = pa.record_batch([pa.array(["a", "b", "a"]).dictionary_encode()], names=["d"])
    payload = stream([batch])
    with schemas() as known:
        first = outcome(payload)
        assert not known
        assert outcome(payload) == first


def test_known_schema_with_corrupt_buffers_fails_as_the_stream_reader_does() -> None:
    offsets = pa.array(["ab", "cd"], pa.string())
    batch = pa.record_batch([offsets], names=["s"])
    payload = bytearray(stream([batch]))
    at = payload.find(b"abcd")
    assert at > 0
    payload[at] = 0xFF  # invalid UTF-8 in the body
    assert warm(bytes(payload), stream([batch]))[0] == "error"
    assert warm(bytes(payload), stream([batch])) == cold(bytes(payload))


def test_a_stream_cut_right_after_a_known_schema_decodes_as_the_stream_reader_does() -> None:
    # Found by the property below: the known-schema path raised EOFError on a stream holding
    # only the schema message, which the stream reader decodes as a stream of no rows.
    batch = pa.record_batch([pa.array(["ab", None], pa.string())], names=["s"])
    primer = stream([batch])
    cut = primer[: codec_arrow._schema_message_end(primer, pa.py_buffer(primer))]
    assert warm(cut, primer) == cold(cut)
    assert warm(cut, primer)[0] == ["s"]


@PROPERTY
@given(
    case=chunk_cases(),
    compression=st.sampled_from([None, "lz4", "zstd"]),
    damage=st.sampled_from(["none", "flip", "cut", "append", "repeat_batch"]),
    where=st.integers(0, 10**6),
    byte=st.integers(0, 255),
)
def test_any_stream_decodes_alike_with_a_known_schema(
    case: ChunkCase, compression: Any, damage: str, where: int, byte: int
) -> None:
    primer = encode_chunk(
        "t",
        case.columns,
        Encoding.ARROW,
        "c",
        schema=case.types,
        options=EncodeOptions(compression=compression),
    ).payload
    payload = bytearray(primer)
    if damage == "flip":
        payload[where % len(payload)] ^= byte or 1
    elif damage == "cut":
        del payload[where % len(payload) :]
    elif damage == "append":
        payload += bytes([byte]) * (1 + where % 16)
    elif damage == "repeat_batch":
        end = codec_arrow._schema_message_end(primer, pa.py_buffer(primer))
        payload = payload[:-8] + payload[end:]
    assert warm(bytes(payload), primer) == cold(bytes(payload))


@PROPERTY
@given(case=chunk_cases())
def test_decoded_chunks_are_the_same_either_way(case: ChunkCase) -> None:
    enc = encode_chunk("t", case.columns, Encoding.ARROW, "c", schema=case.types)
    with schemas():
        first = decode_chunk(enc.payload, enc.attributes)
        decode_chunk(enc.payload, enc.attributes)  # its schema known: its layout is learned
        second = decode_chunk(enc.payload, enc.attributes)  # by its checked layout, if any
    assert second.row_count == first.row_count
    assert second.headers == first.headers
    assert list(first.columns) == list(second.columns)
    assert dict(first.types) == dict(second.types)
    for name, values in first.columns.items():
        other = second.columns[name]
        assert values.dtype == other.dtype
        assert values.shape == other.shape
        if values.dtype == object:
            assert values.tolist() == other.tolist()
        else:
            assert values.tobytes() == other.tobytes()
    assert {k: v.tolist() for k, v in first.null_masks.items()} == {
        k: v.tolist() for k, v in second.null_masks.items()
    }


def test_a_field_name_that_is_not_utf8_is_corrupt_arrow() -> None:
    """Found by the property above: pyarrow's ``schema.names`` raises UnicodeDecodeError for a
    corrupt field name; that must be the wire error ``corrupt_arrow`` (poison, dead-lettered),
    never an exception that stops the consumer and makes it crash-loop on the message."""
    payload = bytearray(encode_chunk("t", {"\x80": np.arange(0)}, Encoding.ARROW, "c").payload)
    payload[104] ^= 32
    assert cold(bytes(payload))[:2] == ("error", "CorruptArrow")
    assert warm(bytes(payload), GOOD) == cold(bytes(payload))


def test_chunks_of_a_checked_layout_decode_as_the_first_did() -> None:
    columns = {"i": np.arange(3), "v": np.ones((3, 2), np.float32)}
    enc = encode_chunk("t", columns, Encoding.ARROW, "c")
    with schemas():
        first = decode_chunk(enc.payload, enc.attributes)
        decode_chunk(enc.payload, enc.attributes)
        [layout] = codec_arrow._LAYOUTS.values()
        assert layout.checked
        assert codec_arrow.read_checked(enc.payload) is not None
        again = decode_chunk(enc.payload, enc.attributes)
        wrong = {**enc.attributes, "rowbatch-row-count": "4"}
        with pytest.raises(WireError) as fast:
            decode_chunk(enc.payload, wrong)
    with schemas(), pytest.raises(WireError) as slow:
        decode_chunk(enc.payload, wrong)
    assert (str(fast.value), fast.value.reason) == (str(slow.value), slow.value.reason)
    assert dict(again.types) == dict(first.types)
    assert not again.null_masks
    for name in columns:
        assert again.columns[name].tobytes() == first.columns[name].tobytes()
        assert again.columns[name].shape == first.columns[name].shape
        assert not again.columns[name].flags.writeable


def test_a_layout_whose_columns_fail_the_checks_is_never_checked() -> None:
    long_name = "x" * 300  # longer than a column name may be
    payload = stream([pa.record_batch([pa.array([1, 2], pa.int64())], names=[long_name])])
    attributes = {
        "rowbatch-format-version": "1",
        "content-type": "application/vnd.apache.arrow.stream",
        "rowbatch-chunk-id": "c",
        "rowbatch-table": "t",
        "rowbatch-row-count": "2",
        "rowbatch-produced-at": "2026-12-02T10:00:00.000Z",
    }
    with schemas():
        for _ in range(3):
            with pytest.raises(WireError, match="column name"):
                decode_chunk(payload, attributes)
        assert all(not layout.checked for layout in codec_arrow._LAYOUTS.values())


def test_the_last_layout_found_is_matched_by_its_prefix_alone_where_the_lookup_agrees() -> None:
    """``find_layout`` first compares a payload with the layout it found last (its prefix, its
    length, its trailer): for payloads of that layout, of another known one, and of none (a
    longer or shorter body, another prefix, a stream without its end marker) it answers what
    the lookup by parsed prefix answers."""
    first, other = stream([NUMERIC]), stream([NUMERIC.slice(0, 2)])
    unterminated = stream([NUMERIC], end=False)
    flipped = bytearray(first)
    flipped[-16] ^= 0x55  # a body byte: the same layout
    changed_prefix = bytearray(first)
    changed_prefix[12] ^= 0x01  # a metadata byte: no layout known for it
    candidates = [
        first,
        bytes(flipped),
        other,
        first + b"\x00" * 8,
        first[:-8],
        first[:-8] + b"\x00" * 8 + first[-8:],  # a longer body, its end marker kept
        bytes(changed_prefix),
        unterminated,
    ]
    with schemas():
        for payload in (first, first, other, other):
            decode_arrow(payload)  # both layouts learned
        assert len(codec_arrow._LAYOUTS) == 2

        def looked_up(payload: bytes) -> Any:
            codec_arrow._RECENT.clear()
            return codec_arrow.find_layout(payload)

        for last in (first, other):
            for payload in candidates:
                assert codec_arrow.find_layout(last) is looked_up(last)  # now the last found
                assert codec_arrow.find_layout(payload) is looked_up(payload)
        assert looked_up(first) is not looked_up(other)
        assert looked_up(bytes(flipped)) is looked_up(first)
        assert looked_up(bytes(changed_prefix)) is None
