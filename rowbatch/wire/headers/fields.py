"""The header fields of a chunk, one by one: their names, the format version, the encodings
(``content-type``), the timestamp form, the limits and syntax of each value and their checks,
and the conversions to and from Kafka headers.

See ``docs/wire-format.md`` for the contract; the names and rules here are its source of truth.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Final

from rowbatch.wire.errors import InvalidHeader, UnsupportedContentType

FORMAT_VERSION: Final = "1"
SUPPORTED_FORMAT_VERSIONS: Final = frozenset({FORMAT_VERSION})

H_FORMAT_VERSION: Final = "rowbatch-format-version"
H_CONTENT_TYPE: Final = "content-type"
H_CHUNK_ID: Final = "rowbatch-chunk-id"
H_TABLE: Final = "rowbatch-table"
H_ROW_COUNT: Final = "rowbatch-row-count"
H_PRODUCED_AT: Final = "rowbatch-produced-at"
H_ORDERING_KEY: Final = "rowbatch-ordering-key"
H_PARENT_CHUNK_ID: Final = "rowbatch-parent-chunk-id"
"""A row part's parent chunk (``rowbatch.wire.chunks.row_parts``): optional, read as written."""
H_PARENT_ROWS: Final = "rowbatch-parent-rows"
"""A row part's rows' indexes in its parent, ascending (``3,17,120-125``)."""

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

CHUNK_ID_RE: Final = re.compile(rf"[\x21-\x7e]{{1,{MAX_CHUNK_ID_LEN}}}")
TABLE_RE: Final = re.compile(rf"[A-Za-z0-9_][A-Za-z0-9_.\-]{{0,{MAX_TABLE_LEN - 1}}}")
# Producers write "2024-05-01T12:34:56.789Z"; consumers also accept other fraction lengths
# (0-9 digits), a lower-case t/z, and a numeric UTC offset.
_TIMESTAMP_RE: Final = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})(?:\.(?P<frac>\d{1,9}))?"
    r"(?P<tz>[Zz]|[+-]\d{2}:\d{2})"
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
        return parse_content_type(value)


def parse_content_type(value: str) -> Encoding:
    """The encoding a ``content-type`` value names (a UTF-8 charset allowed for JSON only)."""
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


def utc_ms(moment: datetime) -> datetime:
    """``moment`` in UTC, truncated to whole milliseconds (what the header carries)."""
    utc = moment.astimezone(UTC)
    return utc.replace(microsecond=utc.microsecond // 1000 * 1000)


def now_ms() -> datetime:
    """The current time as :func:`utc_ms` gives it."""
    return utc_ms(datetime.now(UTC))


def invalid_header(header: str, expected: str, found: object) -> InvalidHeader:
    """The :class:`~rowbatch.wire.errors.InvalidHeader` for a value of ``header`` that breaks its
    rule."""
    return InvalidHeader(
        f"header {header!r}: expected {expected}, found {found!r}",
        header=header,
        expected=expected,
        found=repr(found),
    )


def check_chunk_id(chunk_id: str) -> str:
    if not isinstance(chunk_id, str) or not CHUNK_ID_RE.fullmatch(chunk_id):
        raise invalid_header(
            H_CHUNK_ID,
            f"1 to {MAX_CHUNK_ID_LEN} printable ASCII characters without spaces",
            chunk_id,
        )
    return chunk_id


def check_table(table: str) -> str:
    if not isinstance(table, str) or not TABLE_RE.fullmatch(table):
        raise invalid_header(
            H_TABLE,
            f"1 to {MAX_TABLE_LEN} characters of [A-Za-z0-9_.-], not starting with '.' or '-'",
            table,
        )
    return table


def kafka_headers_to_attributes(headers: Iterable[tuple[str, bytes | None]]) -> dict[str, str]:
    """Kafka record headers (as aiokafka gives them) to the string mapping that
    :func:`~rowbatch.wire.chunks.decode.decode_chunk` takes. A header
    repeated with different values, or a
    value that is not UTF-8, is an :class:`~rowbatch.wire.errors.InvalidHeader`; a null value reads
    as the empty string."""
    if isinstance(headers, (list, tuple)):
        # As producers write them (bytes values, no name twice): one pass in a comprehension.
        try:
            fast = {key: raw.decode("utf-8") for key, raw in headers}
        except (AttributeError, UnicodeDecodeError):
            pass  # a null or non-bytes value, or not UTF-8: the loop below decides and words it
        else:
            if len(fast) == len(headers):
                return fast
    attrs: dict[str, str] = {}
    for key, raw in headers:
        try:
            value = "" if raw is None else bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise invalid_header(key, "a UTF-8 value", raw) from exc
        if key in attrs and attrs[key] != value:
            raise invalid_header(key, "one value", f"{attrs[key]!r} and {value!r}")
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
        raise invalid_header(H_CHUNK_ID, "a non-negative integer sequence", sequence)
    return check_chunk_id(f"{source}:{sequence}")
