"""TLS and mutual TLS to the model server: the settings (:class:`TlsOptions`), checks of the
PEM files done when the configuration is loaded, the gRPC channel credentials, and a reader of
gRPC's error text that tells a failed TLS handshake from a server that is simply down.

gRPC (and so tritonclient) cannot use an encrypted private key: the key file must be
unencrypted PEM (keep it readable by the consumer only).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

#: gRPC channel option naming the host checked against the server's certificate.
TARGET_NAME_OVERRIDE: Final = "grpc.ssl_target_name_override"


class TlsConfigError(ValueError):
    """A TLS setting or file the consumer cannot use; the message names the file."""


@dataclass(frozen=True)
class TlsOptions:
    """TLS to the model server. ``ca_file``: PEM root certificates the server's certificate
    must chain to (``None``: the system's roots). ``cert_file`` + ``key_file``: the client's
    certificate chain and unencrypted key, for servers that require mutual TLS (both or
    neither). ``server_name``: the name checked against the server's certificate instead of
    the URL's host."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsConfigError("a client certificate needs both cert_file and key_file")
        if self.server_name is not None and not self.server_name.strip():
            raise TlsConfigError("server_name must not be empty")

    @property
    def mutual(self) -> bool:
        return self.cert_file is not None

    def channel_args(self) -> list[tuple[str, int | str]]:
        """Extra gRPC channel options these settings need."""
        return [(TARGET_NAME_OVERRIDE, self.server_name)] if self.server_name else []

    def describe(self) -> str:
        parts = ["mutual TLS" if self.mutual else "TLS"]
        parts.append(f"CA {self.ca_file}" if self.ca_file else "system CAs")
        if self.server_name:
            parts.append(f"server name {self.server_name}")
        return ", ".join(parts)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def channel_credentials(tls: TlsOptions) -> Any:
    """``grpc.ChannelCredentials`` for ``tls`` (the files are read now)."""
    import grpc  # noqa: PLC0415 - tritonclient[grpc] brings it; only needed with TLS

    root = _read(tls.ca_file, "CA file") if tls.ca_file else None
    key = _read(tls.key_file, "client key file") if tls.key_file else None
    chain = _read(tls.cert_file, "client certificate file") if tls.cert_file else None
    return grpc.ssl_channel_credentials(
        root_certificates=root, private_key=key, certificate_chain=chain
    )


# --- checks at configuration load -------------------------------------------------------------


class _EncryptedKey(Exception):
    pass


def _no_password() -> str:
    raise _EncryptedKey


def _readable(path: Path) -> None:
    if not path.is_file():
        raise TlsConfigError(f"{path} does not exist or is not a file")
    _read(path, "file")


def check_ca_file(path: Path) -> None:
    """``path`` is a readable PEM file holding at least one certificate."""
    _readable(path)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=str(path))
    except ssl.SSLError as exc:
        raise TlsConfigError(f"{path} holds no usable PEM certificate ({exc.reason})") from None


def check_cert_file(path: Path) -> None:
    """``path`` is readable; its certificates are checked with the key (:func:`check_pair`)."""
    _readable(path)


def check_key_file(path: Path) -> None:
    _readable(path)


def check_pair(cert_file: Path, key_file: Path) -> None:
    """The certificate chain parses, the key is unencrypted PEM, and the two match."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        context.load_cert_chain(str(cert_file), str(key_file), password=_no_password)
    except _EncryptedKey:
        raise TlsConfigError(
            f"{key_file} is encrypted: gRPC needs an unencrypted PEM key "
            f"(openssl pkey -in {key_file.name} -out plain.key)"
        ) from None
    except ssl.SSLError as exc:
        raise TlsConfigError(
            f"certificate {cert_file} and key {key_file} do not make a usable pair "
            f"({exc.reason or exc})"
        ) from None


# --- telling a failed handshake from an unreachable server ------------------------------------

_CONNECT_FAILED: Final = re.compile(r"failed to connect to all addresses", re.I)
_SOCKET_CLOSED: Final = re.compile(r"\bSocket closed\b", re.I)
_HANDSHAKE_CAUSES: Final = (
    (
        re.compile(r"CERTIFICATE_VERIFY_FAILED|certificate verify failed", re.I),
        "certificate verify failed: the server's certificate does not chain to the trusted "
        "CA (model.tls_ca_file, or the system's roots when it is not set)",
    ),
    (
        re.compile(r"Hostname Verification Check failed", re.I),
        "the server's certificate is not valid for this host name (set model.tls_server_name "
        "to a name in its subjectAltName)",
    ),
    (
        re.compile(r"WRONG_VERSION_NUMBER|wrong version number", re.I),
        "TLS handshake failed: the server does not speak TLS on this port (model.tls = false?)",
    ),
    (
        re.compile(r"certificate[ _]required|PEER_DID_NOT_RETURN_A_CERTIFICATE", re.I),
        "the server requires a client certificate (mutual TLS): set model.tls_cert_file and "
        "model.tls_key_file",
    ),
    (
        re.compile(r"(?:Ssl|Tls) handshake failed|SSL_ERROR_SSL|handshake failure", re.I),
        "TLS handshake failed",
    ),
)


def handshake_failure(detail: str, tls: TlsOptions | None) -> str | None:
    """A readable cause when gRPC's connection error ``detail`` says (or, for a connection the
    server closed at once, suggests) that the TLS handshake failed; ``None`` otherwise.

    gRPC reports all of these as UNAVAILABLE, like a server that is down, but retrying cannot
    help: start-up should stop with this cause and the server's URL. ``tls``: the client's
    settings (``None``: plaintext), which decide what a closed connection most likely means:
    with TLS 1.3 a server that refuses the client's certificate (or has none) just closes the
    connection after the handshake, and a TLS server closes a plaintext client's one."""
    for pattern, cause in _HANDSHAKE_CAUSES:
        if pattern.search(detail):
            return cause
    if not (_CONNECT_FAILED.search(detail) and _SOCKET_CLOSED.search(detail)):
        return None
    if tls is None:
        return (
            "the server closed the connection at once: if it serves TLS, set model.tls = true "
            "(and model.tls_ca_file)"
        )
    if not tls.mutual:
        return (
            "the server closed the connection during the TLS handshake: it probably requires a "
            "client certificate (mutual TLS: set model.tls_cert_file and model.tls_key_file)"
        )
    return (
        "the server closed the connection during the TLS handshake: it probably does not accept "
        "this client certificate (model.tls_cert_file must chain to the server's client CA)"
    )


def describe_handshake_failure(url: str, detail: str, tls: TlsOptions | None) -> str | None:
    """``"TLS handshake with the inference server URL failed: CAUSE (gRPC: DETAIL)"``, or
    ``None`` when ``detail`` is not about TLS (see :func:`handshake_failure`)."""
    cause = handshake_failure(detail, tls)
    if cause is None:
        return None
    how = tls.describe() if tls is not None else "plaintext"
    return f"TLS handshake with the inference server {url} failed ({how}): {cause} (gRPC: {detail})"


__all__ = [
    "TARGET_NAME_OVERRIDE",
    "TlsConfigError",
    "TlsOptions",
    "channel_credentials",
    "check_ca_file",
    "check_cert_file",
    "check_key_file",
    "check_pair",
    "describe_handshake_failure",
    "handshake_failure",
]
