"""The Pub/Sub environment both sides read the same way: where the service is
(PUBSUB_EMULATOR_HOST names an emulator, else Google Cloud), and whether Google's Application
Default Credentials can be found, with the one-line error that says what to set when they
cannot. Publishers and sources wrap that line in their own error class.

Both the producer's Pub/Sub publisher and the consumer's Pub/Sub source, admin and dead-letter
tools read it, so it sits beside them at the top of ``rowbatch``, not in the wire contract.
google-auth is imported only when credentials are looked up, so importing this module costs
nothing without it."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from typing import Final

EMULATOR_HOST_ENV: Final = "PUBSUB_EMULATOR_HOST"
CREDENTIALS_ENV: Final = "GOOGLE_APPLICATION_CREDENTIALS"
GOOGLE_PUBSUB_ADDRESS: Final = "pubsub.googleapis.com"
PUBSUB_SCOPE: Final = "https://www.googleapis.com/auth/pubsub"

_PROJECT_RE: Final = re.compile(r"^projects/(?P<project>[^/]+)/")
_WHAT_TO_SET: Final = (
    f"set {CREDENTIALS_ENV} to a service-account key file, run "
    f"`gcloud auth application-default login`, or set {EMULATOR_HOST_ENV}=host:port "
    "for the emulator"
)

CredentialsLookup = Callable[[], object]
"""Finds Google's default credentials; raises ``google.auth.exceptions.DefaultCredentialsError``
when there are none (``google_default_credentials``; tests pass a fake)."""


def emulator_host(environ: Mapping[str, str] | None = None) -> str | None:
    """The emulator's ``host:port`` from ``PUBSUB_EMULATOR_HOST``; None when it is not set."""
    env = os.environ if environ is None else environ
    return env.get(EMULATOR_HOST_ENV, "").strip() or None


def pubsub_address(environ: Mapping[str, str] | None = None) -> str:
    """Where Pub/Sub is, for messages: the emulator's ``host:port``, else Google Cloud's."""
    return emulator_host(environ) or GOOGLE_PUBSUB_ADDRESS


def project_of(path: str | None) -> str | None:
    """``P`` of ``projects/P/topics/T`` or ``projects/P/subscriptions/S``; None otherwise."""
    match = _PROJECT_RE.match(path or "")
    return match.group("project") if match else None


class _ThisThread(logging.Filter):
    """Drops the records one thread logs (google-auth's own "authentication failed" warning,
    which the error this module words replaces)."""

    def __init__(self) -> None:
        super().__init__()
        self._thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        return record.thread != self._thread


def google_default_credentials() -> object:
    """``google.auth.default`` with the Pub/Sub scope (blocking: it may ask the GCE metadata
    server). google-auth's warnings while it looks are left out: a failure becomes the
    caller's one-line error."""
    import google.auth  # noqa: PLC0415 (only when credentials are looked up)

    logger = logging.getLogger("google.auth._default")
    quiet = _ThisThread()
    logger.addFilter(quiet)
    try:
        return google.auth.default(scopes=[PUBSUB_SCOPE])
    finally:
        logger.removeFilter(quiet)


def is_credentials_error(exc: BaseException) -> bool:
    """``exc`` is google-auth's "no usable default credentials"."""
    from google.auth.exceptions import DefaultCredentialsError  # noqa: PLC0415

    return isinstance(exc, DefaultCredentialsError)


def credentials_message(
    project: str | None,
    reason: BaseException | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The one line for missing or unusable credentials: what was wrong (google-auth's
    ``reason`` when it says more than "not found") and what to set."""
    env = os.environ if environ is None else environ
    where = f"Pub/Sub project {project!r}" if project else "Pub/Sub"
    detail = " ".join(str(reason).split()) if reason is not None else ""
    if len(detail) > 300:
        detail = detail[:297] + "..."
    key_file = env.get(CREDENTIALS_ENV, "").strip()
    if key_file:
        because = f"{CREDENTIALS_ENV}={key_file}: {detail or 'not usable'}"
        return f"no usable Google Cloud credentials for {where} ({because}): {_WHAT_TO_SET}"
    if detail and "default credentials were not found" not in detail.lower():
        return f"no usable Google Cloud credentials for {where} ({detail}): {_WHAT_TO_SET}"
    return f"no Google Cloud credentials for {where}: {_WHAT_TO_SET}"


def missing_credentials(
    project: str | None,
    *,
    lookup: CredentialsLookup = google_default_credentials,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """None when ``PUBSUB_EMULATOR_HOST`` is set (the emulator needs no credentials) or
    ``lookup`` finds credentials; else the one-line message of ``credentials_message``.
    Blocking: call it in a worker thread from an event loop."""
    if emulator_host(environ) is not None:
        return None
    try:
        lookup()
    except Exception as exc:
        if not is_credentials_error(exc):
            raise
        return credentials_message(project, exc, environ)
    return None


__all__ = [
    "CREDENTIALS_ENV",
    "EMULATOR_HOST_ENV",
    "GOOGLE_PUBSUB_ADDRESS",
    "CredentialsLookup",
    "credentials_message",
    "emulator_host",
    "google_default_credentials",
    "is_credentials_error",
    "missing_credentials",
    "project_of",
    "pubsub_address",
]
