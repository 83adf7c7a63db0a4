"""The Parquet sink's faults: whether a failure of the filesystem, object store or key index
passes (:func:`classify_parquet_error`).

Object-store errors that pass (HTTP 5xx, 429 / ``SlowDown`` / throttling, timeouts, connection
errors: from pyarrow's filesystems, fsspec or obstore), a full local disk (``ENOSPC``,
``EDQUOT``) and a busy key index raise :class:`~rowbatch.consumer.sinks.base.SinkUnavailable`;
anything else from the store (not found, access denied) is a plain
:class:`~rowbatch.consumer.sinks.base.SinkError`.
"""

from __future__ import annotations

import errno
import re
import sqlite3
from typing import Final

import pyarrow as pa

from rowbatch.consumer.sinks.base import SinkError, SinkUnavailable, demote_rejection, first_line
from rowbatch.consumer.sinks.sqlite.faults import classify_sqlite_error

#: errno values of faults that pass: a full disk, and the network's own.
_TRANSIENT_ERRNOS: Final = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.ETIMEDOUT,
        errno.ECONNRESET,
        errno.ECONNREFUSED,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EAGAIN,
    }
)
#: How object stores and their clients word a fault that passes (S3/GCS/Azure via pyarrow's
#: AWS/Google SDKs, fsspec's s3fs/gcsfs, obstore): 5xx, 429/throttling, timeouts, connections.
_TRANSIENT_WORDS: Final = re.compile(
    r"\b(?:HTTP|status|response code|error code|code)\D{0,12}(?:5\d\d|429)\b"
    r"|\b(?:5\d\d|429) (?:Internal Server Error|Bad Gateway|Service Unavailable|Gateway Time"
    r"|Too Many Requests|Slow Down)"
    r"|SlowDown|SLOW_DOWN|Throttl|TooManyRequests|Too Many Requests|RequestTimeout"
    r"|Request ?Time-?out|timed? ?out|Timeout|ServiceUnavailable|Service Unavailable"
    r"|InternalError|Internal Server Error|Bad Gateway|BackendError|rateLimitExceeded"
    r"|NETWORK_CONNECTION|connection (?:reset|refused|aborted|closed|error)|Broken pipe"
    r"|curlCode: ?(?:6|7|28|35|52|55|56)\b|temporarily unavailable|try again"
    r"|No space left on device|Disk quota exceeded|disk (?:is )?full",
    re.IGNORECASE,
)
_STATUS_ATTRS: Final = ("status", "status_code", "http_status", "code")


def _status_of(exc: BaseException) -> int | None:
    """An HTTP status the exception carries (aiohttp/requests/google-api/botocore style)."""
    for attr in _STATUS_ATTRS:
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        meta = response.get("ResponseMetadata")
        status = meta.get("HTTPStatusCode") if isinstance(meta, dict) else None
        if isinstance(status, int):
            return status
    return None


def _passes(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return True
    status = _status_of(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    return bool(_TRANSIENT_WORDS.search(f"{type(exc).__name__}: {exc}"))


def classify_parquet_error(exc: BaseException, doing: str = "") -> SinkError:
    """The sink error for a failure of the filesystem, object store or key index:
    :class:`SinkUnavailable` when it passes (looked for along the exception's causes: an
    errno, an HTTP status, the store's words), else :class:`SinkError`. The message is
    ``doing`` then the first line of the store's own words."""
    if isinstance(exc, sqlite3.Error):  # the key index
        return demote_rejection(classify_sqlite_error(exc, doing))
    message = f"{doing}: {first_line(exc)}" if doing else first_line(exc)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if _passes(link):
            return SinkUnavailable(message)
        link = link.__cause__ or link.__context__
    return SinkError(message)


def store_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is a store, filesystem or index failure to classify; anything else (a
    bug, a test's stand-in for a crash) propagates as it is."""
    if isinstance(exc, SinkError):
        return False
    if isinstance(exc, OSError | sqlite3.Error | pa.ArrowException | TimeoutError):
        return True
    module = type(exc).__module__.split(".")[0]
    return module in ("botocore", "aiobotocore", "obstore", "aiohttp", "google", "requests")
