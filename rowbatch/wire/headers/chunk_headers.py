"""The headers of one chunk as a value (:class:`ChunkHeaders`): built and checked field by
field, written as Pub/Sub attributes or Kafka headers, and read back from them, with a fast
path for headers exactly as producers write them (the consumer reads them per message)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from rowbatch.wire.errors import MissingHeader, UnsupportedFormatVersion
from rowbatch.wire.headers.fields import (
    CHUNK_ID_RE,
    FORMAT_VERSION,
    H_CHUNK_ID,
    H_CONTENT_TYPE,
    H_FORMAT_VERSION,
    H_ORDERING_KEY,
    H_PRODUCED_AT,
    H_ROW_COUNT,
    H_TABLE,
    MAX_ORDERING_KEY_BYTES,
    REQUIRED_HEADERS,
    SUPPORTED_FORMAT_VERSIONS,
    TABLE_RE,
    Encoding,
    check_chunk_id,
    check_table,
    format_timestamp,
    invalid_header,
    kafka_headers_to_attributes,
    now_ms,
    parse_content_type,
    parse_timestamp,
    utc_ms,
)

_ROW_COUNT_RE: Final = re.compile(r"0|[1-9][0-9]{0,17}")
#: Exactly the form producers write (the fast path; anything else takes ``_TIMESTAMP_RE``).
_TIMESTAMP_AS_WRITTEN_RE: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z"
)


@dataclass(frozen=True)
class ChunkHeaders:
    """The headers of one chunk. Construction validates every field (raising
    :class:`~rowbatch.wire.errors.InvalidHeader`); ``produced_at`` is normalised to UTC and
    truncated to milliseconds, so ``from_attributes(h.to_attributes()) == h``."""

    chunk_id: str
    table: str
    row_count: int
    content_type: Encoding
    produced_at: datetime = field(default_factory=now_ms)
    ordering_key: str | None = None
    format_version: str = FORMAT_VERSION

    def __post_init__(self) -> None:
        check_chunk_id(self.chunk_id)
        check_table(self.table)
        if (
            not isinstance(self.row_count, int)
            or isinstance(self.row_count, bool)
            or not 0 <= self.row_count < 10**18
        ):
            raise invalid_header(H_ROW_COUNT, "an integer in [0, 10**18)", self.row_count)
        object.__setattr__(self, "content_type", Encoding.parse(self.content_type))
        if not isinstance(self.produced_at, datetime) or self.produced_at.tzinfo is None:
            raise invalid_header(H_PRODUCED_AT, "a timezone-aware datetime", self.produced_at)
        try:
            object.__setattr__(self, "produced_at", utc_ms(self.produced_at))
        except OverflowError as exc:
            raise invalid_header(
                H_PRODUCED_AT, "a datetime within years 1..9999 in UTC", exc
            ) from exc
        if self.ordering_key is not None and (
            not isinstance(self.ordering_key, str)
            or not 0
            < len(self.ordering_key.encode("utf-8", "surrogatepass"))
            <= MAX_ORDERING_KEY_BYTES
        ):
            raise invalid_header(
                H_ORDERING_KEY,
                f"a non-empty string of at most {MAX_ORDERING_KEY_BYTES} UTF-8 bytes",
                self.ordering_key,
            )
        if self.format_version not in SUPPORTED_FORMAT_VERSIONS:
            raise UnsupportedFormatVersion(
                f"header {H_FORMAT_VERSION!r}: unsupported format version "
                f"{self.format_version!r}; this library speaks {sorted(SUPPORTED_FORMAT_VERSIONS)}",
                header=H_FORMAT_VERSION,
                expected=", ".join(sorted(SUPPORTED_FORMAT_VERSIONS)),
                found=self.format_version,
            )

    @property
    def encoding(self) -> Encoding:
        return self.content_type

    def to_attributes(self) -> dict[str, str]:
        """Pub/Sub message attributes (also the Kafka headers, UTF-8 encoded)."""
        attrs = {
            H_FORMAT_VERSION: self.format_version,
            H_CONTENT_TYPE: self.content_type.value,
            H_CHUNK_ID: self.chunk_id,
            H_TABLE: self.table,
            H_ROW_COUNT: str(self.row_count),
            H_PRODUCED_AT: format_timestamp(self.produced_at),
        }
        if self.ordering_key is not None:
            attrs[H_ORDERING_KEY] = self.ordering_key
        return attrs

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> ChunkHeaders:
        """Parses and validates headers. Header names match case-insensitively; unknown
        attributes (e.g. Pub/Sub's ``googclient_*``) are ignored."""
        if cls is ChunkHeaders:
            fast = _headers_as_written(attributes)
            if fast is not None:
                return fast
        attrs: dict[str, str] = {}
        for key, value in attributes.items():
            name = key.lower()
            if name in attrs and attrs[name] != value:
                raise invalid_header(name, "one value", f"{attrs[name]!r} and {value!r}")
            attrs[name] = value
        missing = [name for name in REQUIRED_HEADERS if name not in attrs]
        if missing:
            raise MissingHeader(
                f"missing required header(s) {', '.join(map(repr, missing))}; "
                f"present: {sorted(attributes) or 'none'}",
                header=missing[0],
                expected=", ".join(REQUIRED_HEADERS),
                found=", ".join(sorted(attributes)),
            )
        for name in REQUIRED_HEADERS:
            if not isinstance(attrs[name], str):
                raise invalid_header(name, "a string", attrs[name])
        version = attrs[H_FORMAT_VERSION].strip()
        if version not in SUPPORTED_FORMAT_VERSIONS:
            raise UnsupportedFormatVersion(
                f"header {H_FORMAT_VERSION!r}: unsupported format version {version!r}; "
                f"this consumer speaks {sorted(SUPPORTED_FORMAT_VERSIONS)}",
                header=H_FORMAT_VERSION,
                expected=", ".join(sorted(SUPPORTED_FORMAT_VERSIONS)),
                found=version,
            )
        encoding = parse_content_type(attrs[H_CONTENT_TYPE])
        raw_count = attrs[H_ROW_COUNT].strip()
        if not _ROW_COUNT_RE.fullmatch(raw_count):
            raise invalid_header(H_ROW_COUNT, "a non-negative decimal integer", attrs[H_ROW_COUNT])
        ordering_key = attrs.get(H_ORDERING_KEY)
        return cls(
            chunk_id=attrs[H_CHUNK_ID],
            table=attrs[H_TABLE],
            row_count=int(raw_count),
            content_type=encoding,
            produced_at=parse_timestamp(attrs[H_PRODUCED_AT]),
            ordering_key=ordering_key if ordering_key else None,
            format_version=version,
        )

    @classmethod
    def _validated(
        cls,
        *,
        chunk_id: str,
        table: str,
        row_count: int,
        content_type: Encoding,
        produced_at: datetime,
        ordering_key: str | None,
    ) -> ChunkHeaders:
        """An instance of values already checked as ``__post_init__`` checks them (and
        ``produced_at`` already in UTC, whole milliseconds), without checking them again."""
        headers = object.__new__(cls)
        headers.__dict__.update(
            chunk_id=chunk_id,
            table=table,
            row_count=row_count,
            content_type=content_type,
            produced_at=produced_at,
            ordering_key=ordering_key,
            format_version=FORMAT_VERSION,
        )
        return headers

    def to_kafka_headers(self) -> list[tuple[str, bytes]]:
        return [(k, v.encode("utf-8")) for k, v in self.to_attributes().items()]

    @classmethod
    def from_kafka_headers(cls, headers: Iterable[tuple[str, bytes | None]]) -> ChunkHeaders:
        return cls.from_attributes(kafka_headers_to_attributes(headers))


#: Content types written exactly as producers write them (anything else takes the full parse).
_CONTENT_TYPES: Final[Mapping[str, Encoding]] = {enc.value: enc for enc in Encoding}

#: Ordering keys of at most this many characters fit 1024 UTF-8 bytes (4 bytes a character at
#: most, 3 for a surrogate with ``surrogatepass``).
_SHORT_ORDERING_KEY: Final = MAX_ORDERING_KEY_BYTES // 4


@functools.lru_cache(maxsize=1024)
def _table_as_written(table: str) -> bool:
    """``table`` is a valid table name (remembered: a topic carries one or a few)."""
    return TABLE_RE.fullmatch(table) is not None


@functools.lru_cache(maxsize=1024)
def _timestamp_as_written(value: str) -> datetime | None:
    """``value`` in exactly the form producers write (``2024-05-01T12:34:56.789Z``, ASCII
    digits) as :func:`parse_timestamp` reads it; None for any other form. Remembered: chunks
    produced in the same millisecond carry the same stamp."""
    if not _TIMESTAMP_AS_WRITTEN_RE.fullmatch(value):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None  # e.g. month 13: the full parse words the error
    return moment if moment.tzinfo is UTC else moment.astimezone(UTC)


def _headers_as_written(attributes: Mapping[str, str]) -> ChunkHeaders | None:
    """The headers when every name is lower case and every required value is exactly in the
    form producers write (what ``from_attributes`` would return for them); None otherwise, and
    the full parse decides (and words any error)."""
    try:
        names = "".join(attributes)
        if names.lower() != names:
            return None  # names to fold (and perhaps duplicates to find)
        version = attributes[H_FORMAT_VERSION]
        content_type = attributes[H_CONTENT_TYPE]
        chunk_id = attributes[H_CHUNK_ID]
        table = attributes[H_TABLE]
        row_count = attributes[H_ROW_COUNT]
        produced_at = attributes[H_PRODUCED_AT]
        ordering_key = attributes.get(H_ORDERING_KEY)
    except (KeyError, TypeError):
        return None
    if (
        version != FORMAT_VERSION
        or type(content_type) is not str
        or type(chunk_id) is not str
        or type(table) is not str
        or type(row_count) is not str
        or type(produced_at) is not str
    ):
        return None
    encoding = _CONTENT_TYPES.get(content_type)
    if (
        encoding is None
        or not CHUNK_ID_RE.fullmatch(chunk_id)
        or not _table_as_written(table)
        or not (row_count.isascii() and row_count.isdigit() and len(row_count) <= 18)
        or (row_count[0] == "0" and row_count != "0")
        or (
            ordering_key is not None
            and (type(ordering_key) is not str or len(ordering_key) > _SHORT_ORDERING_KEY)
        )
    ):
        return None
    moment = _timestamp_as_written(produced_at)
    if moment is None:
        return None
    return ChunkHeaders._validated(
        chunk_id=chunk_id,
        table=table,
        row_count=int(row_count),
        content_type=encoding,
        produced_at=moment,
        ordering_key=ordering_key or None,
    )
