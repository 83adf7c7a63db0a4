"""Deliberately malformed messages for dead-letter tests: which chunks are malformed, and how
each kind is made and checked to fail as documented.

Malformed kinds (each chunk is either valid or of one kind; ``reason`` is what
``decode_chunk`` / the consumer reports, checked here before sending):

==================  =====================================================  ======================
kind                what is wrong                                          dead-letter reason
==================  =====================================================  ======================
``bad-encoding``    the payload is cut short                               ``invalid_json`` /
                                                                           ``corrupt_arrow``
``wrong-type``      JSON: ``id`` declared int64 holds strings; Arrow: the  ``column_type_mismatch``
                    model's column has another type (``text`` int64,
                    ``features`` float64): caught by an expected schema
``missing-header``  no ``rowbatch-row-count`` header                       ``missing_header``
``row-count``       ``rowbatch-row-count`` is one more than the rows       ``row_count_mismatch``
``reject-marker``   a valid message; one row's text starts with the        (the ``chaos`` model
                    marker, which the ``chaos`` model rejects              answers
                                                                           INVALID_ARGUMENT)
==================  =====================================================  ======================
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from rowbatch.producer.loadgen.spec import LoadSpec, MalformedKind
from rowbatch.producer.publishers.messages import Message, RawMessage, message_size
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.errors import WireError
from rowbatch.wire.headers.fields import H_ROW_COUNT, Encoding


def expected_reason(kind: MalformedKind, encoding: Encoding) -> str | None:
    """The dead-letter reason a malformed chunk of ``kind`` gets (None: rejected by the model)."""
    return {
        MalformedKind.BAD_ENCODING: (
            "invalid_json" if encoding is Encoding.JSON else "corrupt_arrow"
        ),
        MalformedKind.WRONG_TYPE: "column_type_mismatch",
        MalformedKind.MISSING_HEADER: "missing_header",
        MalformedKind.ROW_COUNT: "row_count_mismatch",
        MalformedKind.REJECT_MARKER: None,
    }[kind]


def plan_malformed(spec: LoadSpec) -> dict[int, MalformedKind]:
    """Which chunks are malformed, and how: ``round(malformed * chunks)`` of them (at least one
    when the fraction is above 0), chosen and given kinds round-robin by the seed."""
    n = spec.chunks
    if spec.malformed <= 0 or n == 0:
        return {}
    count = min(max(round(spec.malformed * n), 1), n)
    rng = np.random.default_rng([spec.seed, 1])
    chosen = np.sort(rng.choice(n, size=count, replace=False))
    kinds = list(spec.malformed_kinds)
    order = rng.permutation(len(kinds))
    return {int(i): kinds[int(order[j % len(kinds)])] for j, i in enumerate(chosen)}


def _check_malformed(
    message: Message, kind: MalformedKind, spec: LoadSpec, *, needs_schema: bool
) -> str | None:
    """Decodes the malformed message as the consumer would; returns the reason, or None when it
    decodes (the model must reject it)."""
    schema = spec.schema() if needs_schema else None
    try:
        decode_chunk(message.payload, message.attributes, schema=schema)
    except WireError as exc:
        return exc.reason
    return None


def with_marker(columns: dict[str, pa.Array], row: int, marker: str) -> dict[str, pa.Array]:
    texts = columns["text"].to_pylist()
    original = texts[row]
    texts[row] = marker + original[len(marker) :] if len(marker) < len(original) else marker
    return {**columns, "text": pa.array(texts, type=pa.string())}


def _wrong_type(
    spec: LoadSpec, columns: dict[str, pa.Array], chunk_id: str, rows: int
) -> tuple[Message, bool]:
    if spec.encoding is Encoding.JSON:
        good = encode_chunk(spec.table, columns, spec.encoding, chunk_id)
        doc = json.loads(good.payload)
        for col in doc["columns"]:
            if col["name"] == "id":
                col["values"] = [str(v) for v in col["values"]]
        payload = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        return RawMessage(payload, good.attributes), False
    wrong = dict(columns)
    if spec.kind == "text":
        wrong["text"] = pa.array(np.full(rows, spec.row_width, dtype=np.int64))
    else:
        feats = columns["features"].flatten().to_numpy().reshape(rows, spec.row_width)
        wrong["features"] = pa.array(feats.mean(axis=1).astype(np.float64))
    return encode_chunk(spec.table, wrong, spec.encoding, chunk_id), True


def _bad_encoding(good: EncodedChunk, spec: LoadSpec) -> Message:
    expected = expected_reason(MalformedKind.BAD_ENCODING, spec.encoding)
    for fraction in (0.66, 0.5, 0.8, 0.9, 0.3):
        cut = RawMessage(good.payload[: int(len(good.payload) * fraction)], good.attributes)
        if _check_malformed(cut, MalformedKind.BAD_ENCODING, spec, needs_schema=False) == expected:
            return cut
    return RawMessage(b"\xff" + good.payload[1:], good.attributes)  # pragma: no cover


def malformed_message(
    spec: LoadSpec,
    kind: MalformedKind,
    columns: dict[str, pa.Array],
    chunk_id: str,
    rows: int,
    *,
    max_chunk_bytes: int,
) -> tuple[Message, str | None]:
    """The malformed message of ``kind`` for a chunk's rows, and the reason it is dead-lettered
    for (checked by decoding it as the consumer would)."""
    good = encode_chunk(spec.table, columns, spec.encoding, chunk_id)
    message: Message
    needs_schema = False
    if kind is MalformedKind.BAD_ENCODING:
        message = _bad_encoding(good, spec)
    elif kind is MalformedKind.WRONG_TYPE:
        message, needs_schema = _wrong_type(spec, columns, chunk_id, rows)
    elif kind is MalformedKind.MISSING_HEADER:
        attrs = {k: v for k, v in good.attributes.items() if k != H_ROW_COUNT}
        message = RawMessage(good.payload, attrs)
    else:
        message = RawMessage(good.payload, {**good.attributes, H_ROW_COUNT: str(rows + 1)})
    size = message_size(message)
    if size > max_chunk_bytes:
        raise ValueError(
            f"malformed chunk {chunk_id!r} is {size} bytes, over the {max_chunk_bytes}-byte "
            "message limit; use fewer --chunk-rows"
        )
    reason = _check_malformed(message, kind, spec, needs_schema=needs_schema)
    if reason != expected_reason(kind, spec.encoding):  # pragma: no cover - a generator bug
        raise AssertionError(f"malformed chunk {chunk_id} ({kind}) decodes as {reason!r}")
    return message, reason


__all__ = ["expected_reason", "malformed_message", "plan_malformed", "with_marker"]
