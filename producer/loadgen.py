"""A load generator for tests and benchmarks: a deterministic (seeded) table published in chunks at
a given rate or as fast as possible, with a chosen fraction of deliberately malformed messages
for dead-letter tests.

Tables (``kind``):

- ``text``: ``id`` int64, ``text`` string of ``width`` characters (64 by default): for the
  ``embedder`` and ``chaos`` models (input ``TEXT``);
- ``numeric``: ``id`` int64, ``features`` vector[float32, ``width``] (16 by default),
  ``count`` int64: for the ``scorer`` model (inputs ``FEATURES``, ``COUNT``).

``id`` is the row's position in the generated table (0, 1, ...), so every row is identifiable;
chunk ``i`` holds ids ``i * chunk_rows ...`` and has chunk id ``<id_prefix>:<i>``. The same seed
gives the same rows and the same choice of malformed chunks.

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

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa

from producer.publish import Message, Publisher, RawMessage, message_size
from wire.chunks import EncodedChunk, decode_chunk, encode_chunk, split_rows
from wire.columns import INT64, STRING, ColumnType
from wire.errors import WireError
from wire.headers import H_ROW_COUNT, Encoding, derive_chunk_id

LoadKind = Literal["text", "numeric"]


class MalformedKind(StrEnum):
    BAD_ENCODING = "bad-encoding"
    WRONG_TYPE = "wrong-type"
    MISSING_HEADER = "missing-header"
    ROW_COUNT = "row-count"
    REJECT_MARKER = "reject-marker"


#: The kinds the consumer's decoder catches (``reject-marker`` needs the ``chaos`` model).
DECODE_KINDS: Final = (
    MalformedKind.BAD_ENCODING,
    MalformedKind.WRONG_TYPE,
    MalformedKind.MISSING_HEADER,
    MalformedKind.ROW_COUNT,
)
DEFAULT_REJECT_MARKER: Final = "rowbatch-reject-me"
DEFAULT_WIDTH: Final[Mapping[str, int]] = {"text": 64, "numeric": 16}
_MAX_TEXT_WIDTH: Final = 1 << 20


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


@dataclass(frozen=True)
class LoadSpec:
    """What to generate; see the module docstring."""

    rows: int
    chunk_rows: int = 1000
    kind: LoadKind = "text"
    width: int | None = None
    encoding: Encoding = Encoding.ARROW
    table: str = "loadgen"
    seed: int = 0
    malformed: float = 0.0
    malformed_kinds: tuple[MalformedKind, ...] = DECODE_KINDS
    reject_marker: str | None = None
    id_prefix: str = "loadgen"

    def __post_init__(self) -> None:
        object.__setattr__(self, "encoding", Encoding.parse(self.encoding))
        object.__setattr__(
            self, "malformed_kinds", tuple(MalformedKind(k) for k in self.malformed_kinds)
        )
        if self.rows < 0:
            raise ValueError(f"rows must be >= 0, not {self.rows}")
        if self.chunk_rows < 1:
            raise ValueError(f"chunk rows must be >= 1, not {self.chunk_rows}")
        if self.kind not in DEFAULT_WIDTH:
            raise ValueError(f"kind must be 'text' or 'numeric', not {self.kind!r}")
        if not 1 <= self.row_width <= _MAX_TEXT_WIDTH:
            raise ValueError(f"width must be in 1..{_MAX_TEXT_WIDTH}, not {self.row_width}")
        if not 0.0 <= self.malformed <= 1.0:
            raise ValueError(f"the malformed fraction must be in [0, 1], not {self.malformed}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, not {self.seed}")
        if self.malformed > 0 and not self.malformed_kinds:
            raise ValueError("a malformed fraction needs at least one malformed kind")
        if MalformedKind.REJECT_MARKER in self.malformed_kinds and self.malformed > 0:
            if self.kind != "text":
                raise ValueError(
                    "reject-marker needs --kind text (the chaos model reads a text column)"
                )
            if self.reject_marker is None:
                object.__setattr__(self, "reject_marker", DEFAULT_REJECT_MARKER)
        if self.reject_marker == "":
            raise ValueError("the reject marker must not be empty (it would match every text)")
        derive_chunk_id(self.id_prefix, 0)  # checks the prefix makes valid ids

    @property
    def row_width(self) -> int:
        return self.width if self.width is not None else DEFAULT_WIDTH[self.kind]

    @property
    def chunks(self) -> int:
        return math.ceil(self.rows / self.chunk_rows)

    def schema(self) -> dict[str, ColumnType]:
        """The table's columns: what a consumer of it expects."""
        if self.kind == "text":
            return {"id": INT64, "text": STRING}
        return {"id": INT64, "features": ColumnType.vector(self.row_width), "count": INT64}

    def chunk_id(self, index: int) -> str:
        return derive_chunk_id(self.id_prefix, index)

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "chunk_rows": self.chunk_rows,
            "kind": self.kind,
            "width": self.row_width,
            "encoding": "json" if self.encoding is Encoding.JSON else "arrow",
            "table": self.table,
            "seed": self.seed,
            "malformed": self.malformed,
            "malformed_kinds": [k.value for k in self.malformed_kinds],
            "reject_marker": self.reject_marker,
            "id_prefix": self.id_prefix,
        }


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


def generate_columns(spec: LoadSpec, index: int) -> dict[str, pa.Array]:
    """The rows of chunk ``index`` (a function of the seed and the index only)."""
    first = index * spec.chunk_rows
    n = max(min(spec.chunk_rows, spec.rows - first), 0)
    rng = np.random.default_rng([spec.seed, 0, index])
    ids = pa.array(np.arange(first, first + n, dtype=np.int64))
    width = spec.row_width
    if spec.kind == "text":
        codes = rng.integers(0, 27, size=(n, width), dtype=np.uint8)
        chars = np.where(codes == 26, ord(" "), codes + ord("a")).astype(np.uint8)
        offsets = np.arange(0, (n + 1) * width, width, dtype=np.int64)
        text = pa.LargeStringArray.from_buffers(
            n, pa.py_buffer(offsets), pa.py_buffer(chars.tobytes())
        ).cast(pa.string())
        return {"id": ids, "text": text}
    features = rng.standard_normal((n, width), dtype=np.float32)
    flat = pa.array(features.reshape(-1), type=pa.float32())
    vectors = pa.FixedSizeListArray.from_arrays(flat, width)
    counts = pa.array(rng.integers(0, 1000, size=n, dtype=np.int64))
    return {"id": ids, "features": vectors, "count": counts}


@dataclass(frozen=True)
class PlannedMessage:
    """One message to send, with what the manifest needs to know of it."""

    message: Message
    chunk_id: str
    rows: int
    first_id: int
    kind: MalformedKind | None = None
    reason: str | None = None
    marker_id: int | None = None


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


def _with_marker(columns: dict[str, pa.Array], row: int, marker: str) -> dict[str, pa.Array]:
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


def plan_chunk(
    spec: LoadSpec,
    index: int,
    kind: MalformedKind | None,
    *,
    max_chunk_bytes: int,
) -> list[PlannedMessage]:
    """The message(s) for chunk ``index``: valid chunks are split to fit ``max_chunk_bytes``;
    malformed ones are one message each and checked to fail as documented."""
    columns = generate_columns(spec, index)
    first = index * spec.chunk_rows
    rows = len(columns["id"])
    chunk_id = spec.chunk_id(index)
    if kind is None or kind is MalformedKind.REJECT_MARKER:
        marker_row = None
        if kind is MalformedKind.REJECT_MARKER:
            rng = np.random.default_rng([spec.seed, 2, index])
            marker_row = int(rng.integers(0, rows))
            columns = _with_marker(columns, marker_row, spec.reject_marker or "")
        parts = split_rows_for(spec, columns, chunk_id, max_chunk_bytes)
        out = []
        start = 0
        for part in parts:
            n = part.headers.row_count
            holds_marker = marker_row is not None and start <= marker_row < start + n
            out.append(
                PlannedMessage(
                    part,
                    part.headers.chunk_id,
                    n,
                    first + start,
                    kind if holds_marker else None,
                    None,
                    first + marker_row if holds_marker and marker_row is not None else None,
                )
            )
            start += n
        return out
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
    return [PlannedMessage(message, chunk_id, rows, first, kind, reason)]


def split_rows_for(
    spec: LoadSpec, columns: Mapping[str, pa.Array], chunk_id: str, max_chunk_bytes: int
) -> list[EncodedChunk]:
    return split_rows(
        spec.table,
        columns,
        spec.encoding,
        chunk_id,
        max_bytes=max_chunk_bytes,
        schema=spec.schema(),
    )


def plan_messages(spec: LoadSpec, *, max_chunk_bytes: int) -> Iterator[PlannedMessage]:
    """Every message of the run, chunk by chunk, lazily."""
    malformed = plan_malformed(spec)
    for index in range(spec.chunks):
        yield from plan_chunk(spec, index, malformed.get(index), max_chunk_bytes=max_chunk_bytes)


class RateLimiter:
    """Paces rows to ``rate`` rows/s on average (None: no limit). ``clock`` and ``sleep`` are
    injectable; after falling behind by more than ``max_lag_s`` it does not burst to catch up."""

    def __init__(
        self,
        rate: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_lag_s: float = 1.0,
    ) -> None:
        if rate is not None and not rate > 0:
            raise ValueError(f"rate must be > 0 rows/s or None, not {rate}")
        self.rate = rate
        self._clock = clock
        self._sleep = sleep
        self._max_lag_s = max_lag_s
        self._start: float | None = None
        self._sent = 0.0

    async def acquire(self, rows: int) -> None:
        """Waits until ``rows`` more rows may go."""
        if self.rate is None:
            return
        now = self._clock()
        if self._start is None:
            self._start = now
        due = self._start + self._sent / self.rate
        if due > now:
            await self._sleep(due - now)
        elif now - due > self._max_lag_s:
            self._start = now - self._sent / self.rate  # behind: pace from here on
        self._sent += rows


@dataclass
class Manifest:
    """What the load generator sent, for tests to assert on (``--manifest PATH``)."""

    spec: LoadSpec
    messages: int = 0
    rows: int = 0
    valid_rows: int = 0
    malformed: dict[str, dict[str, Any]] = field(default_factory=dict)

    def add(self, planned: PlannedMessage) -> None:
        self.messages += 1
        self.rows += planned.rows
        if planned.kind is None:
            self.valid_rows += planned.rows
            return
        entry: dict[str, Any] = {
            "kind": planned.kind.value,
            "reason": planned.reason,
            "rows": planned.rows,
            "first_id": planned.first_id,
        }
        if planned.kind is MalformedKind.WRONG_TYPE:
            entry["needs_schema"] = self.spec.encoding is Encoding.ARROW
        if planned.marker_id is not None:
            entry["marker_id"] = planned.marker_id
        self.malformed[planned.chunk_id] = entry

    def to_json(self, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return {
            "spec": self.spec.to_json(),
            "schema": {name: str(t) for name, t in self.spec.schema().items()},
            "messages": self.messages,
            "rows": self.rows,
            "valid_rows": self.valid_rows,
            "malformed": dict(sorted(self.malformed.items())),
            "summary": dict(summary or {}),
        }


async def publish_load(
    publisher: Publisher,
    spec: LoadSpec,
    submit: Callable[[Message, int | None], Awaitable[None]],
    limiter: RateLimiter,
) -> Manifest:
    """Generates the messages (in a worker thread) and hands each to ``submit`` (a
    :class:`~producer.publish.PublishWindow`'s), paced by ``limiter``."""
    manifest = Manifest(spec)
    malformed = plan_malformed(spec)
    for index in range(spec.chunks):
        planned = await asyncio.to_thread(
            plan_chunk,
            spec,
            index,
            malformed.get(index),
            max_chunk_bytes=publisher.max_chunk_bytes,
        )
        for message in planned:
            await limiter.acquire(message.rows)
            await submit(message.message, message.rows)
            manifest.add(message)
    return manifest


__all__ = [
    "DECODE_KINDS",
    "DEFAULT_REJECT_MARKER",
    "LoadKind",
    "LoadSpec",
    "MalformedKind",
    "Manifest",
    "PlannedMessage",
    "RateLimiter",
    "expected_reason",
    "generate_columns",
    "plan_chunk",
    "plan_malformed",
    "plan_messages",
    "publish_load",
]
