"""TLS to the model server: ``[model] tls*`` settings validated at load (errors naming the
field), ``TlsOptions``, the gRPC credentials and channel options, and the reading of gRPC's
handshake errors (the texts below are what grpcio 1.7x really reports, seen against Triton)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from harness.consumer_process import to_toml
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.tls import (
    TARGET_NAME_OVERRIDE,
    TlsConfigError,
    TlsOptions,
    channel_credentials,
    describe_handshake_failure,
    handshake_failure,
)
from rowbatch.consumer.service.config import ConfigError, load_config


@dataclass(frozen=True)
class Files:
    cert: Path
    key: Path
    other_key: Path
    encrypted_key: Path
    garbage: Path


def _key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Files:
    """A self-signed certificate (usable as CA and as client certificate) with its key, an
    unrelated key, the key encrypted, and a file that is no PEM at all."""
    root = tmp_path_factory.mktemp("tls")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rowbatch unit test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    out = Files(
        cert=root / "cert.pem",
        key=root / "key.pem",
        other_key=root / "other.pem",
        encrypted_key=root / "encrypted.pem",
        garbage=root / "garbage.pem",
    )
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    out.key.write_bytes(_key_pem(key))
    out.other_key.write_bytes(_key_pem(ec.generate_private_key(ec.SECP256R1())))
    out.encrypted_key.write_bytes(_key_pem(key, b"key-passphrase"))
    out.garbage.write_text("not a certificate\n")
    return out


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import os

    for key in [k for k in os.environ if k.startswith("ROWBATCH_")]:
        monkeypatch.delenv(key)
    yield


def load_with_model(tmp_path: Path, **model: Any) -> ModelSettings:
    path = tmp_path / "consumer.toml"
    path.write_text(
        to_toml(
            {
                "source": {"kind": "pubsub", "subscription": "projects/p/subscriptions/sub"},
                "model": {"name": "scorer", **model},
                "binding": {"inputs": {"f": "FEATURES"}, "outputs": {"SCORE": "score"}},
            }
        )
    )
    loaded = load_config(path).model
    assert isinstance(loaded, ModelSettings)
    return loaded


def config_error(tmp_path: Path, **model: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load_with_model(tmp_path, **model)
    return str(caught.value)


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.usefixtures("clean_env")
def test_tls_is_off_by_default(tmp_path: Path) -> None:
    model = load_with_model(tmp_path)
    assert model.tls is False
    assert model.tls_options() is None


@pytest.mark.usefixtures("clean_env")
def test_tls_with_system_roots(tmp_path: Path) -> None:
    assert load_with_model(tmp_path, tls=True).tls_options() == TlsOptions()


@pytest.mark.usefixtures("clean_env")
def test_mutual_tls_settings_become_tls_options(tmp_path: Path, files: Files) -> None:
    model = load_with_model(
        tmp_path,
        tls=True,
        tls_ca_file=files.cert,
        tls_cert_file=files.cert,
        tls_key_file=files.key,
        tls_server_name="triton.internal",
    )
    tls = model.tls_options()
    assert tls == TlsOptions(files.cert, files.cert, files.key, "triton.internal")
    assert tls is not None and tls.mutual


@pytest.mark.usefixtures("clean_env")
def test_environment_turns_tls_on(
    tmp_path: Path, files: Files, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROWBATCH_MODEL__TLS", "true")
    monkeypatch.setenv("ROWBATCH_MODEL__TLS_CA_FILE", str(files.cert))
    tls = load_with_model(tmp_path).tls_options()
    assert tls == TlsOptions(ca_file=files.cert)


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("field", ["tls_ca_file", "tls_cert_file", "tls_key_file"])
def test_a_missing_file_is_named_with_its_field(tmp_path: Path, field: str) -> None:
    extra: dict[str, Any] = {field: tmp_path / "nope.pem"}
    text = config_error(tmp_path, tls=True, **extra)
    assert f"model.{field}" in text
    assert "nope.pem does not exist" in text


@pytest.mark.usefixtures("clean_env")
def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    text = config_error(tmp_path, tls=True, tls_ca_file=tmp_path)
    assert "model.tls_ca_file" in text
    assert "not a file" in text


@pytest.mark.usefixtures("clean_env")
def test_a_ca_file_without_certificates_is_refused(tmp_path: Path, files: Files) -> None:
    text = config_error(tmp_path, tls=True, tls_ca_file=files.garbage)
    assert "model.tls_ca_file" in text
    assert "no usable PEM certificate" in text


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("given", ["tls_cert_file", "tls_key_file"])
def test_cert_and_key_go_together(tmp_path: Path, files: Files, given: str) -> None:
    extra: dict[str, Any] = {given: files.cert if given == "tls_cert_file" else files.key}
    text = config_error(tmp_path, tls=True, **extra)
    assert "tls_cert_file and tls_key_file go together" in text


@pytest.mark.usefixtures("clean_env")
def test_a_key_of_another_certificate_is_refused(tmp_path: Path, files: Files) -> None:
    text = config_error(tmp_path, tls=True, tls_cert_file=files.cert, tls_key_file=files.other_key)
    assert "tls_cert_file/tls_key_file" in text
    assert "do not make a usable pair" in text


@pytest.mark.usefixtures("clean_env")
def test_an_encrypted_key_is_refused_without_prompting(tmp_path: Path, files: Files) -> None:
    text = config_error(
        tmp_path, tls=True, tls_cert_file=files.cert, tls_key_file=files.encrypted_key
    )
    assert "is encrypted" in text
    assert "key-passphrase" not in text


@pytest.mark.usefixtures("clean_env")
def test_tls_files_need_tls_on(tmp_path: Path, files: Files) -> None:
    text = config_error(tmp_path, tls_ca_file=files.cert, tls_server_name="x")
    assert "tls_ca_file, tls_server_name need(s) tls = true" in text


@pytest.mark.usefixtures("clean_env")
def test_an_empty_server_name_is_refused(tmp_path: Path) -> None:
    assert "model.tls_server_name" in config_error(tmp_path, tls=True, tls_server_name="")


# --- TlsOptions, credentials, the client --------------------------------------------------------


def test_tls_options_check_cert_and_key_together(files: Files) -> None:
    with pytest.raises(TlsConfigError, match="both cert_file and key_file"):
        TlsOptions(cert_file=files.cert)
    with pytest.raises(TlsConfigError, match="server_name"):
        TlsOptions(server_name=" ")


def test_server_name_becomes_the_target_name_override() -> None:
    assert TlsOptions().channel_args() == []
    assert TlsOptions(server_name="triton.internal").channel_args() == [
        (TARGET_NAME_OVERRIDE, "triton.internal")
    ]
    assert TARGET_NAME_OVERRIDE == "grpc.ssl_target_name_override"


def test_channel_credentials_read_the_files(files: Files) -> None:
    assert channel_credentials(TlsOptions(files.cert, files.cert, files.key)) is not None
    assert channel_credentials(TlsOptions()) is not None  # the system's roots


def test_an_unreadable_file_is_named_when_the_client_is_built(files: Files, tmp_path: Path) -> None:
    gone = tmp_path / "gone.pem"
    with pytest.raises(TlsConfigError, match=r"cannot read CA file .*gone\.pem"):
        channel_credentials(TlsOptions(ca_file=gone))


async def test_inference_client_builds_a_secure_channel(files: Files) -> None:
    tls = TlsOptions(files.cert, files.cert, files.key, server_name="triton.internal")
    async with InferenceClient("127.0.0.1:1", "scorer", tls=tls) as client:
        assert client.tls is tls
        channel = client._client._channel
        assert type(channel).__name__ == "Channel"  # grpc.aio's, secure or not alike


# --- handshake failures --------------------------------------------------------------------------

_PREFIX = "failed to connect to all addresses; last error: "
WRONG_CA = (
    _PREFIX + "UNKNOWN: ipv4:127.0.0.1:4711: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
    "SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
    "self signed certificate in certificate chain: OK"
)
WRONG_NAME = (
    _PREFIX + "UNKNOWN: ipv4:127.0.0.1:4711: Custom verification check failed with error: "
    "UNAUTHENTICATED: Hostname Verification Check failed."
)
PLAINTEXT_SERVER = (
    _PREFIX + "UNKNOWN: ipv4:127.0.0.1:4711: Tls handshake failed (TSI_PROTOCOL_FAILURE): "
    "SSL_ERROR_SSL: error:100000f7:SSL routines:OPENSSL_internal:WRONG_VERSION_NUMBER: "
    "Invalid certificate verification context: OK"
)
CLOSED = _PREFIX + "UNAVAILABLE: ipv4:127.0.0.1:4711: Socket closed"
REFUSED = (
    _PREFIX + "UNKNOWN: ipv4:127.0.0.1:4711: Failed to connect to remote host: Connection refused"
)


@pytest.mark.parametrize(
    ("detail", "tls", "cause"),
    [
        (WRONG_CA, TlsOptions(), "certificate verify failed"),
        (WRONG_NAME, TlsOptions(), "tls_server_name"),
        (PLAINTEXT_SERVER, TlsOptions(), "does not speak TLS"),
        (CLOSED, None, "set model.tls = true"),
        (CLOSED, TlsOptions(), "requires a client certificate"),
        (
            CLOSED,
            TlsOptions(cert_file=Path("c.pem"), key_file=Path("k.pem")),
            "does not accept this client certificate",
        ),
    ],
)
def test_handshake_failures_get_a_cause(detail: str, tls: TlsOptions | None, cause: str) -> None:
    found = handshake_failure(detail, tls)
    assert found is not None
    assert cause in found
    described = describe_handshake_failure("triton:8001", detail, tls)
    assert described is not None
    assert described.startswith("TLS handshake with the inference server triton:8001 failed")
    assert detail in described


@pytest.mark.parametrize("tls", [None, TlsOptions()])
def test_a_server_that_is_down_is_no_handshake_failure(tls: TlsOptions | None) -> None:
    assert handshake_failure(REFUSED, tls) is None
    assert handshake_failure("Exceeds maximum queue size", tls) is None
    assert describe_handshake_failure("triton:8001", "Socket closed", tls) is None
