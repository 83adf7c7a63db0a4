"""``dlq show``: a letter's rows previewed as the consumer decodes them (or why they do not
decode), cut at ``--rows``; the letter in lines and as JSON."""

from __future__ import annotations

import json

import numpy as np

from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.dlq.show import PREVIEW_CELL_CHARS, describe, preview, to_json
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk

DLQ = {
    "rowbatch-dlq-reason": "rejected-by-model",
    "rowbatch-dlq-code": "invalid_argument",
    "rowbatch-dlq-message": "row 1 rejected",
    "rowbatch-dlq-source": "rows/0",
    "rowbatch-dlq-message-id": "rows/0/17",
    "rowbatch-dlq-delivery-attempt": "3",
    "rowbatch-dlq-consumer-version": "1.4.0",
    "rowbatch-dlq-time": "2026-12-02T09:30:00.250Z",
}


def chunk() -> EncodedChunk:
    return encode_chunk(
        "docs", {"id": np.arange(3, dtype=np.int64), "text": ["a", "b", "c"]}, "json", "c1"
    )


def letter_of(
    encoded: EncodedChunk, *, payload: bytes | None = None, extra: dict[str, str] | None = None
) -> DeadLetter:
    return DeadLetter(
        ref="rows.dlq/0/5",
        payload=encoded.payload if payload is None else payload,
        attributes={**encoded.attributes, **(extra or {})},
    )


def test_preview_of_a_real_chunk() -> None:
    assert preview(letter_of(chunk()), 3) == [
        "3 rows; columns: id, text",
        "  id=0, text=a",
        "  id=1, text=b",
        "  id=2, text=c",
    ]


def test_preview_ignores_the_dead_letter_attributes() -> None:
    got = preview(letter_of(chunk(), extra=DLQ), 10)
    assert got[0] == "3 rows; columns: id, text"
    assert len(got) == 4  # more --rows than rows: no "more" line


def test_preview_is_cut_at_rows() -> None:
    assert preview(letter_of(chunk()), 1) == [
        "3 rows; columns: id, text",
        "  id=0, text=a",
        "  ... 2 more",
    ]
    assert preview(letter_of(chunk()), 0) == ["3 rows; columns: id, text", "  ... 3 more"]


def test_a_payload_that_does_not_decode_says_why() -> None:
    (line,) = preview(letter_of(chunk(), payload=b"{not json"), 3)
    assert line.startswith("does not decode: invalid_json: ")


def test_a_letter_without_chunk_headers_does_not_decode() -> None:
    bare = DeadLetter(ref="x", payload=chunk().payload, attributes=DLQ)
    (line,) = preview(bare, 3)
    assert line.startswith("does not decode: missing_header: ")


def test_a_row_count_that_does_not_match_does_not_decode() -> None:
    wrong = letter_of(chunk(), extra={"rowbatch-row-count": "4"})
    (line,) = preview(wrong, 3)
    assert line.startswith("does not decode: row_count_mismatch: ")


def test_a_long_cell_is_cut() -> None:
    encoded = encode_chunk("docs", {"text": ["x" * 500]}, "json", "c2")
    _, row = preview(letter_of(encoded), 1)
    cell = row.removeprefix("  text=")
    assert len(cell) == PREVIEW_CELL_CHARS
    assert cell.endswith("...")


def test_describe_lists_place_reason_headers_and_preview() -> None:
    got = describe(letter_of(chunk(), extra=DLQ), 1)
    assert got[0] == "rows.dlq/0/5  2026-12-02T09:30:00.250+00:00"
    assert got[1] == "  reason   rejected-by-model (invalid_argument)"
    assert got[2] == "  message  row 1 rejected"
    assert got[3] == "  from     rows/0 message rows/0/17, delivery attempt 3, consumer 1.4.0"
    assert got[4] == "  chunk    c1 of table docs"
    assert "  headers" in got
    assert "    rowbatch-table: docs" in got
    assert not any("rowbatch-dlq-" in line for line in got)  # only the original headers
    assert f"  payload  {len(chunk().payload)} bytes" in got
    assert got[-3:] == ["    3 rows; columns: id, text", "      id=0, text=a", "      ... 2 more"]


def test_describe_of_a_kafka_letter_replayed_before() -> None:
    replayed = DeadLetter(
        ref="rows.dlq/0/9",
        payload=b"",
        attributes={"rowbatch-replay-count": "2"},
        key=b"k1",
    )
    got = describe(replayed, 3)
    assert got[0] == "rows.dlq/0/9  unknown time"
    assert got[1] == "  reason   unknown (unknown)"
    assert got[2] == "  message  -"
    assert "delivery attempt ?" in got[3]
    assert got[4] == "  chunk    unknown of table unknown, replayed 2 times before"
    assert "  key      b'k1'" in got
    assert got[-1].startswith("    does not decode: ")


def test_to_json() -> None:
    got = to_json(letter_of(chunk(), extra=DLQ), 2)
    assert json.loads(json.dumps(got)) == got
    assert got["ref"] == "rows.dlq/0/5"
    assert got["time"] == "2026-12-02T09:30:00.250000+00:00"
    assert got["reason"] == "rejected-by-model"
    assert got["code"] == "invalid_argument"
    assert got["delivery_attempt"] == 3
    assert got["table"] == "docs"
    assert got["chunk_id"] == "c1"
    assert got["replays"] == 0
    assert got["attributes"]["rowbatch-dlq-reason"] == "rejected-by-model"  # every attribute
    assert got["payload_bytes"] == len(chunk().payload)
    assert got["preview"] == [
        "3 rows; columns: id, text",
        "  id=0, text=a",
        "  id=1, text=b",
        "  ... 1 more",
    ]


def test_to_json_of_a_letter_without_fields() -> None:
    got = to_json(DeadLetter(ref="x", payload=b"", attributes={}), 3)
    assert got["time"] is None
    assert got["delivery_attempt"] is None
    assert got["reason"] == "unknown"
