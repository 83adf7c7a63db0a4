"""The Iceberg sink's faults: what passes (the catalog's database or the object store cannot be
reached, a commit lost to other writers more often than pyiceberg's retries allow) is
:class:`~rowbatch.consumer.sinks.base.SinkUnavailable`, retried by the pipeline with backoff;
anything else is a :class:`~rowbatch.consumer.sinks.base.SinkError` naming what failed."""

from __future__ import annotations

from rowbatch.consumer.sinks.base import SinkError, SinkUnavailable, first_line

#: Words of pyarrow's (the AWS SDK's) errors for an object store that does not answer now.
_STORE_TRANSIENT = (
    "connection",
    "timed out",
    "timeout",
    "throttl",
    "slow down",
    "slowdown",
    "service unavailable",
    "internal error",
    "503",
    "500",
    "network",
    "curl",
    "unreachable",
    "temporarily",
)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault that passes."""
    import sqlalchemy.exc as sa_exc  # noqa: PLC0415
    from pyiceberg.exceptions import CommitFailedException  # noqa: PLC0415

    if isinstance(exc, CommitFailedException):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated or isinstance(
            exc, sa_exc.OperationalError | sa_exc.InterfaceError
        ):
            return True
        state = getattr(getattr(exc, "orig", None), "sqlstate", None) or ""
        return state[:2] in {"08", "40", "53", "57"}
    if isinstance(exc, sa_exc.TimeoutError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError | PermissionError):
        text = str(exc).lower()
        return any(word in text for word in _STORE_TRANSIENT)
    return False


def classify_iceberg_error(exc: BaseException, what: str) -> SinkError:
    """``exc`` as the sink error the pipeline acts on, its message naming ``what`` failed."""
    if transient(exc):
        return SinkUnavailable(f"{what}: {type(exc).__name__}: {first_line(exc)}")
    return SinkError(f"{what}: {type(exc).__name__}: {first_line(exc)}")
