"""Structured logs: one JSON object per line (or plain text for humans). Configured by the
entry point only; the library never configures logging on import.

Secrets never reach the log: :class:`RedactingFilter`, installed on the handler by
:func:`configure`, rewrites every record (message, exception text, stack, extra fields) with
:func:`redact`, which masks the password in URLs and DSNs (``postgresql://user:***@host/db``)
and the value of ``password=...``-style key-values (libpq keyword DSNs, ``sasl_plain_password=``,
``ssl_key_password: ...``)."""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Final

from opentelemetry import trace

from rowbatch.tracing import active as tracing_active

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}

#: What a secret is replaced with.
MASK: Final = "***"

# scheme://user:password@host -> scheme://user:***@host. The password runs to the last "@"
# before white space or a quote (a raw "@" or "/" in it is not valid, but is seen).
_URL_PASSWORD: Final = re.compile(
    r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/?#@\s'\"<>]*:)(?P<password>[^\s'\"<>]*)@"
)
# password=VALUE, password: VALUE, "password": "VALUE", password='VALUE' (libpq quoting),
# for any key containing password/passwd/passphrase/pwd/secret (sasl_plain_password,
# ssl_key_password, PGPASSWORD, client_secret...).
_KEY_VALUE: Final = re.compile(
    r"""(?P<key>\b[\w.-]*(?:passw(?:or)?d|passphrase|pwd|secret)[\w.-]*)"""
    r"""(?P<sep>['"]?[ \t]*[=:][ \t]*)"""
    r"""(?P<value>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[^\s&;,'"(){}\[\]<>]+)""",
    re.IGNORECASE,
)
_HINTS: Final = ("://", "passw", "passphrase", "pwd", "secret")
_SECRET_NAME: Final = re.compile(r"passw(?:or)?d|passphrase|pwd|secret", re.IGNORECASE)


def _mask_value(match: re.Match[str]) -> str:
    value = match["value"]
    quote = value[0] if value[0] in "'\"" else ""
    return f"{match['key']}{match['sep']}{quote}{MASK}{quote}"


def redact(text: str) -> str:
    """``text`` with credentials masked: URL/DSN passwords and ``password=...`` values."""
    lowered = text.lower()
    if not any(hint in lowered for hint in _HINTS):
        return text
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    return _KEY_VALUE.sub(_mask_value, text)


class RedactingFilter(logging.Filter):
    """Masks credentials (see :func:`redact`) in every record that passes: the formatted
    message (arguments merged in), the exception and stack text, and extra fields (whole
    values of extra fields named like a secret: ``extra={"password": ...}``)."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string must not hide the record
            message = f"{record.msg!r} % {record.args!r}"
        record.msg = redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(vars(record).items()):
            if key in _STANDARD:
                continue
            if _SECRET_NAME.search(key) and value is not None:
                setattr(record, key, MASK)
            elif isinstance(value, str):
                setattr(record, key, redact(value))
            elif not isinstance(value, int | float | bool | type(None)):
                text = str(value)
                masked = redact(text)
                if masked != text:
                    setattr(record, key, masked)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object a record; ``trace_id`` and ``span_id`` (hex, as trace backends show
    them) when tracing is on and a span is current."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        out.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if tracing_active():
            context = trace.get_current_span().get_span_context()
            if context.is_valid:
                out["trace_id"] = f"{context.trace_id:032x}"
                out["span_id"] = f"{context.span_id:016x}"
        if record.exc_text:
            out["exception"] = record.exc_text
        elif record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = record.stack_info
        return json.dumps(out, default=str)


def configure(fmt: str, level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
