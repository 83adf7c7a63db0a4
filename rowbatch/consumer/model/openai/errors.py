"""How an OpenAI-compatible server's answer is classified, as the Open Inference Protocol's
are (:mod:`rowbatch.consumer.model.inference.errors`): 429, 503, 408, 502, 504, timeouts and
connection failures are transient (retried, 429/503 also shrink the window); 400, 413 and 422
are about the request's rows (poison: a prompt over the context length, an input the server
refuses); 401, 403 and 404 and other statuses are fatal (a wrong key, model or URL: start-up
names them; while running, the message is nacked)."""

from __future__ import annotations

import re
from typing import Final

import orjson

from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    InferenceError,
    PoisonInferenceError,
    RetryableInferenceError,
)

RETRYABLE: Final = frozenset({408, 425, 429, 502, 503, 504})
OVERLOADED: Final = frozenset({429, 503})
POISON: Final = frozenset({400, 413, 422})
_TOO_LONG: Final = re.compile(
    r"context.length|maximum context|context window|too long|exceeds? the (?:max|context)"
    r"|requested \d+ tokens|n_ctx",
    re.I,
)


def server_words(body: bytes) -> str:
    """The error message of an OpenAI-style body (``{"error": {"message": ...}}``), else the
    body's text (shortened)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:500].decode("utf-8", "replace").strip()
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            for key in ("message", "detail", "msg"):
                if key in error:
                    return str(error[key])[:1000]
        if isinstance(error, str):
            return error[:1000]
        if "detail" in data:
            return str(data["detail"])[:1000]
    return body[:500].decode("utf-8", "replace").strip()


def row_code(message: str) -> str:
    """The dead-letter code of a poison answer: ``prompt_too_long`` when the server says the
    input exceeds its context, else ``invalid_request``."""
    return "prompt_too_long" if _TOO_LONG.search(message) else "invalid_request"


def classify_status(
    status: int, body: bytes, *, model: str, url: str, retry_after: str | None
) -> InferenceError:
    """The error for a non-2xx answer."""
    words = server_words(body)
    described = f"model {model!r} at {url}: HTTP {status}: {words}"
    if status in RETRYABLE:
        return RetryableInferenceError(
            described, model=model, status=str(status), retry_after_s=_seconds(retry_after)
        )
    if status in POISON:
        return PoisonInferenceError(described, model=model, status=str(status))
    if status in (401, 403):
        described += " (the server refused the API key: model.api_key / model.api_key_file)"
    elif status == 404:
        described += " (no such model or path on the server: model.name, model.url)"
    return FatalInferenceError(described, model=model, status=str(status))


def _seconds(text: str | None) -> float | None:
    """``Retry-After`` in seconds (its HTTP-date form is not used by inference servers)."""
    if text is None:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        return None
