"""How a failed inference request is classified: every server or connection failure becomes a
retryable, poison or fatal :class:`InferenceError` (see :mod:`rowbatch.consumer.model.inference`),
and the ``kind`` label of the inference-error metric."""

from __future__ import annotations

import re
from typing import Final

from tritonclient.utils import InferenceServerException

#: gRPC statuses that say "try again later".
RETRYABLE_STATUSES: Final = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"})
#: Retryable statuses that say "this server is overloaded" (send it less for a while), where the
#: others say "this server is gone" (take it out until it answers ready again).
EXHAUSTED_STATUSES: Final = frozenset({"RESOURCE_EXHAUSTED", "429"})
#: gRPC statuses that say "these rows are bad".
POISON_STATUSES: Final = frozenset({"INVALID_ARGUMENT"})
#: HTTP statuses (a gateway in front of the server) that say "try again later".
RETRYABLE_HTTP: Final = frozenset({"429", "502", "503", "504"})
#: gRPC statuses that, for a model this consumer already discovered and used, mean "the server
#: is unloading or restarting it" (Triton answers NOT_FOUND "has no available versions" while it
#: shuts down): transient while running, though fatal at start-up (see ``classify``).
GONE_WHILE_SERVED: Final = frozenset({"NOT_FOUND"})
_HTTP_RETRYABLE_TEXT: Final = re.compile(
    r"\b(?:status:? ?|HTTP/\S+ )(?:429|502|503|504)\b|too many requests|service unavailable"
    r"|bad gateway|gateway time-?out",
    re.I,
)


class InferenceError(Exception):
    """A failed inference request. ``status`` is the gRPC status name (``UNAVAILABLE``), an
    HTTP status (``503``), or the exception type for connection failures."""

    def __init__(self, message: str, *, model: str, status: str) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.status = status


class RetryableInferenceError(InferenceError):
    """Transient: the same request may succeed later; ``retry_after_s``: not before then (an
    HTTP ``Retry-After``), when the server said."""

    def __init__(
        self, message: str, *, model: str, status: str, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message, model=model, status=status)
        self.retry_after_s = retry_after_s


class PoisonInferenceError(InferenceError):
    """The server rejected the request's rows (INVALID_ARGUMENT): retrying cannot help, but a
    smaller request without the offending rows can."""


class FatalInferenceError(InferenceError):
    """Neither transient nor known to be about the rows (INTERNAL: a model raising, a server
    bug): fatal at start-up (unknown model); while running, the batch is bisected and the
    messages that still fail alone are nacked (redelivered, dead-lettered as
    ``too-many-attempts`` if they never pass)."""


def grpc_status(exc: InferenceServerException) -> str:
    """``"StatusCode.UNAVAILABLE"`` -> ``"UNAVAILABLE"``; ``""`` for client-side errors."""
    return str(exc.status() or "").removeprefix("StatusCode.")


def classify(
    exc: InferenceServerException | OSError, *, model: str, served: bool = False
) -> InferenceError:
    """The :class:`InferenceError` subclass instance for a failed request to ``model``.
    ``served``: the model was discovered on this server and is being used, so NOT_FOUND means
    it is being unloaded or the server restarted (transient), not that it never existed."""
    if isinstance(exc, OSError):
        status = type(exc).__name__
        return RetryableInferenceError(
            f"model {model!r}: connection failed ({status}): {exc}", model=model, status=status
        )
    status = grpc_status(exc)
    text = str(exc.message() or "")
    described = f"model {model!r}: {status or 'client error'}: {text}"
    if status in RETRYABLE_STATUSES or status in RETRYABLE_HTTP:
        return RetryableInferenceError(described, model=model, status=status)
    if status in ("", "UNKNOWN") and _HTTP_RETRYABLE_TEXT.search(text):
        return RetryableInferenceError(described, model=model, status=status or "HTTP")
    if served and status in GONE_WHILE_SERVED:
        return RetryableInferenceError(
            f"{described} (the server is unloading or restarting the model; waiting for it)",
            model=model,
            status=status,
        )
    if status in POISON_STATUSES:
        return PoisonInferenceError(described, model=model, status=status)
    return FatalInferenceError(described, model=model, status=status or "CLIENT")


def is_exhausted(error: InferenceError) -> bool:
    """Whether ``error`` says the server is overloaded rather than gone."""
    return error.status in EXHAUSTED_STATUSES


def error_kind(error: InferenceError) -> str:
    """The ``kind`` label of ``rowbatch_inference_errors_total`` for ``error``."""
    status = error.status
    if status.isdigit() or status == "HTTP":
        return "http"
    if status.isupper() and status.replace("_", "").isalpha():
        kind = status.lower().replace("_", "-")
        return kind if kind in _KNOWN_KINDS else "other"
    return "connection" if isinstance(error, RetryableInferenceError) else "other"


_KNOWN_KINDS: Final = frozenset(
    {"unavailable", "resource-exhausted", "deadline-exceeded", "not-found", "invalid-argument"}
)
