"""Chunk headers: Pub/Sub message attributes or Kafka record headers (all string-valued).

See ``docs/wire-format.md`` for the contract; the names and rules here are its source of truth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

from wire.errors import (
    InvalidHeader,
    MissingHeader,
    UnsupportedContentType,
    UnsupportedFormatVersion,
)

FORMAT_VERSION: Final = "1"
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({FORMAT_VERSION})

H_FORMAT_VERSION: Final = "rowbatch-format-version"
H_CONTENT_TYPE: Final = "content-type"
H_CHUNK_ID: Final = "rowbatch-chunk-id"
H_TABLE: Final = "rowbatch-table"
H_ROW_COUNT: Final = "rowbatch-row-count"
H_PRODUCED_AT: Final = "rowbatch-produced-at"
H_ORDERING_KEY: Final = "rowbatch-ordering-key"

REQUIRED_HEADERS: Final = (
    H_FORMAT_VERSION,
    H_CONTENT_TYPE,
    H_CHUNK_ID,
    H_TABLE,
    H_ROW_COUNT,
    H_PRODUCED_AT,
)

MAX_CHUNK_ID_LEN: Final = 256
MAX_TABLE_LEN: Final = 128
MAX_ORDERING_KEY_BYTES: Final = 1024

_CHUNK_ID_RE: Final = re.compile(rf"[\x21-\x7e]{{1,{MAX_CHUNK_ID_LEN}}}")
_TABLE_RE: Final = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_TABLE_LEN - 1}}}")
_ROW_COUNT_RE: Final = re.compile(r"0|[1-9][0-9]{0,17}")
# Producers write "2024-05-01T12:34:56.789Z"; consumers also accept other fraction lengths
# (0-9 digits), a lower-case t/z, and a numeric UTC offset.
_TIMESTAMP_RE: Final = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?"
    r"(?P<tz>[Zz]|[+-]\d{2}:\d{2})"
)
#: Exactly the form producers write (the fast path; anything else takes ``_TIMESTAMP_RE``).
_TIMESTAMP_AS_WRITTEN_RE: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z"
)


class Encoding(StrEnum):
    """Payload encodings; the value is the ``content-type`` header."""

    JSON = "application/json"
    ARROW = "application/vnd.apache.arrow.stream"

    @classmethod
    def parse(cls, value: Encoding | str) -> Encoding:
        """Accepts an :class:`Encoding`, a content type or the short names ``json``/``arrow``."""
        if isinstance(value, Encoding):
            return value
        short = {"json": cls.JSON, "arrow": cls.ARROW}
        if value in short:
            return short[value]
        return _parse_content_type(value)


def _parse_content_type(value: str) -> Encoding:
    media, *params = (part.strip() for part in value.split(";"))
    media = media.lower()
    for enc in Encoding:
        if media == enc.value:
            for param in params:
                key, _, val = param.partition("=")
                if key.strip().lower() == "charset" and (
                    enc is not Encoding.JSON or val.strip().strip('"').lower() != "utf-8"
                ):
                    raise UnsupportedContentType(
                        f"header {H_CONTENT_TYPE!r}: unsupported parameter {param!r} in "
                        f"{value!r}; JSON is always UTF-8 and Arrow takes no charset",
                        header=H_CONTENT_TYPE,
                        expected="charset=utf-8 (JSON only)",
                        found=param,
                    )
            return enc
    supported = ", ".join(e.value for e in Encoding)
    raise UnsupportedContentType(
        f"header {H_CONTENT_TYPE!r}: unsupported content type {value!r}; expected one of "
        f"{supported}",
        header=H_CONTENT_TYPE,
        expected=supported,
        found=value,
    )


def format_timestamp(moment: datetime) -> str:
    """RFC 3339, UTC, millisecond precision: ``2024-05-01T12:34:56.789Z``."""
    u = moment.astimezone(UTC)
    return (
        f"{u.year:04d}-{u.month:02d}-{u.day:02d}T{u.hour:02d}:{u.minute:02d}:{u.second:02d}"
        f".{u.microsecond // 1000:03d}Z"
    )


def parse_timestamp(value: str, header: str = H_PRODUCED_AT) -> datetime:
    match = _TIMESTAMP_RE.fullmatch(value)
    problem = "" if match else "not an RFC 3339 timestamp"
    if match:
        frac = (match["frac"] or "").ljust(6, "0")[:6]
        tz = match["tz"].upper().replace("Z", "+00:00")
        try:
            return datetime.fromisoformat(f"{match['date']}T{match['time']}.{frac}{tz}").astimezone(
                UTC
            )
        except (ValueError, OverflowError) as exc:
            problem = str(exc)
    raise InvalidHeader(
        f"header {header!r}: {problem}: {value!r}; expected e.g. '2024-05-01T12:34:56.789Z'",
        header=header,
        expected="RFC 3339 UTC timestamp, e.g. 2024-05-01T12:34:56.789Z",
        found=value,
    )


def _utc_ms(moment: datetime) -> datetime:
    utc = moment.astimezone(UTC)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)


def _now_ms() -> datetime:
    return _utc_ms(datetime.now(UTC))


def _invalid(header: str, expected: str, found: object) -> InvalidHeader:
    return InvalidHeader(
        f"header {header!r}: expected {expected}, found {found!r}",
        header=header,
        expected=expected,
        found=repr(found),
    )


def check_chunk_id(chunk_id: str) -> str:
    if not isinstance(chunk_id, str) or not _CHUNK_ID_RE.fullmatch(chunk_id):
        raise _invalid(
            H_CHUNK_ID,
            f"1 to {MAX_CHUNK_ID_LEN} printable ASCII characters without spaces",
            chunk_id,
        )
    return chunk_id


def check_table(table: str) -> str:
    if not isinstance(table, str) or not _TABLE_RE.fullmatch(table):
        raise _invalid(
            H_TABLE,
            f"1 to {MAX_TABLE_LEN} characters of [A-Za-z0-9_.-], not starting with '.' or '-'",
            table,
        )
    return table


@dataclass(frozen=True)
class ChunkHeaders:
    """The headers of one chunk. Construction validates every field (raising
    :class:`~wire.errors.InvalidHeader`); ``produced_at`` is normalised to UTC and truncated
    to milliseconds, so ``from_attributes(h.to_attributes()) == h``."""

    chunk_id: str
    table: str
    row_count: int
    content_type: Encoding
    produced_at: datetime = field(default_factory=_now_ms)
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
            raise _invalid(H_ROW_COUNT, "an integer in [0, 10**18)", self.row_count)
        object.__setattr__(self, "content_type", Encoding.parse(self.content_type))
        if not isinstance(self.produced_at, datetime) or self.produced_at.tzinfo is None:
            raise _invalid(H_PRODUCED_AT, "a timezone-aware datetime", self.produced_at)
        try:
            object.__setattr__(self, "produced_at", _utc_ms(self.produced_at))
        except OverflowError as exc:
            raise _invalid(H_PRODUCED_AT, "a datetime within years 1..9999 in UTC", exc) from exc
        if self.ordering_key is not None and (
            not isinstance(self.ordering_key, str)
            or not 0
            < len(self.ordering_key.encode("utf-8", "surrogatepass"))
            <= MAX_ORDERING_KEY_BYTES
        ):
            raise _invalid(
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
                raise _invalid(name, "one value", f"{attrs[name]!r} and {value!r}")
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
                raise _invalid(name, "a string", attrs[name])
        version = attrs[H_FORMAT_VERSION].strip()
        if version not in SUPPORTED_FORMAT_VERSIONS:
            raise UnsupportedFormatVersion(
                f"header {H_FORMAT_VERSION!r}: unsupported format version {version!r}; "
                f"this consumer speaks {sorted(SUPPORTED_FORMAT_VERSIONS)}",
                header=H_FORMAT_VERSION,
                expected=", ".join(sorted(SUPPORTED_FORMAT_VERSIONS)),
                found=version,
            )
        encoding = _parse_content_type(attrs[H_CONTENT_TYPE])
        raw_count = attrs[H_ROW_COUNT].strip()
        if not _ROW_COUNT_RE.fullmatch(raw_count):
            raise _invalid(H_ROW_COUNT, "a non-negative decimal integer", attrs[H_ROW_COUNT])
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


def _timestamp_as_written(value: str) -> datetime | None:
    """``value`` in exactly the form producers write (``2024-05-01T12:34:56.789Z``, ASCII
    digits) as :func:`parse_timestamp` reads it; None for any other form."""
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
        or not _CHUNK_ID_RE.fullmatch(chunk_id)
        or not _TABLE_RE.fullmatch(table)
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


def kafka_headers_to_attributes(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """Kafka record headers (as aiokafka gives them) to the string mapping that
    :func:`wire.chunks.decode_chunk` takes. A header repeated with different values, or a
    value that is not UTF-8, is an :class:`~wire.errors.InvalidHeader`; a null value reads
    as the empty string."""
    attrs: dict[str, str] = {}
    for key, raw in headers:
        try:
            value = "" if raw is None else bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _invalid(key, "a UTF-8 value", raw) from exc
        if key in attrs and attrs[key] != value:
            raise _invalid(key, "one value", f"{attrs[key]!r} and {value!r}")
        attrs[key] = value
    return attrs


def attributes_size(attributes: Mapping[str, str]) -> int:
    """Bytes the attributes add to a message (keys and values, UTF-8), as Pub/Sub counts them."""
    return sum(len(k.encode("utf-8")) + len(v.encode("utf-8")) for k, v in attributes.items())


def derive_chunk_id(source: str, sequence: int) -> str:
    """A deterministic chunk id ``"<source>:<sequence>"`` for producers that number their chunks.

    Re-sending the same (source, sequence) gives the same id, so the consumer writes its rows
    once. ``source`` is printable ASCII without spaces; ``sequence`` is a non-negative int.
    """
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
        raise _invalid(H_CHUNK_ID, "a non-negative integer sequence", sequence)
    return check_chunk_id(f"{source}:{sequence}")
