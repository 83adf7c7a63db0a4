"""TLS and mutual TLS between the consumer and a real Triton (``harness.triton`` with ``tls``):
discovery and inference over TLS, a server that requires a client certificate, a client that
trusts the wrong CA, and the whole consumer over mutual TLS from the Pub/Sub emulator into
SQLite.

Certificates are made per test module with ``cryptography``: a CA, a server certificate for
``IP:127.0.0.1`` and ``DNS:localhost``, a client certificate, and a second, unrelated CA.
Three Triton servers of this module's own (TLS, mutual TLS, plaintext) serve just the
``scorer`` model; the session's Triton is not used.

gRPC reports every failed handshake as UNAVAILABLE, like a server that is down. Discovery
(``rowbatch.consumer.model.discovery.discover_model``) passes gRPC's detail on in its error, with
the URL; the tests check that :func:`rowbatch.consumer.model.tls.describe_handshake_failure` turns
each such detail into the cause start-up should name (wrong CA, host name, missing or foreign
client certificate, TLS on one side only).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from harness.consumer_process import to_toml
from harness.reference_models import score
from harness.service import RunDir
from harness.triton import TritonEndpoint, TritonService, TritonTls
from rowbatch.consumer.model.discovery import ModelDiscoveryError
from rowbatch.consumer.model.inference.client import InferenceClient
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.model.tls import TlsOptions, describe_handshake_failure
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig, load_config
from rowbatch.consumer.service.runner import run_consumer
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until
from tests.integration.test_consumer_pubsub import scorer_chunks

# --- certificates ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    """A CA with one server and one client certificate it signed (PEM files, keys unencrypted)."""

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def make_pki(directory: Path, label: str) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    valid = (now - dt.timedelta(minutes=5), now + dt.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"rowbatch test CA {label}"))
        .issuer_name(_name(f"rowbatch test CA {label}"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(common_name: str, usage: x509.ObjectIdentifier, server: bool) -> tuple[bytes, Any]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        cert = builder.sign(ca_key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM), key

    pki = Pki(
        ca_cert=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
    )
    pki.ca_cert.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_pem, server_key = leaf("localhost", ExtendedKeyUsageOID.SERVER_AUTH, True)
    pki.server_cert.write_bytes(server_pem)
    _write_key(server_key, pki.server_key)
    client_pem, client_key = leaf("rowbatch-consumer", ExtendedKeyUsageOID.CLIENT_AUTH, False)
    pki.client_cert.write_bytes(client_pem)
    _write_key(client_key, pki.client_key)
    return pki


@dataclass(frozen=True)
class TlsServers:
    pki: Pki
    other: Pki  # an unrelated CA: a client trusting it must refuse the servers
    tls: TritonEndpoint  # TLS, no client certificate asked for
    mutual: TritonEndpoint  # mutual TLS: a client certificate from pki's CA is required
    plain: TritonEndpoint  # no TLS


@pytest.fixture(scope="module")
def servers(run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServers]:
    certs = tmp_path_factory.mktemp("pki")
    pki, other = make_pki(certs / "good", "good"), make_pki(certs / "other", "other")
    plain_tls = TritonTls(pki.server_cert, pki.server_key, pki.ca_cert)
    mutual_tls = TritonTls(
        pki.server_cert,
        pki.server_key,
        pki.ca_cert,
        mutual=True,
        client_cert=pki.client_cert,
        client_key=pki.client_key,
    )
    with (
        TritonService(run_dir, tls=plain_tls, models=["scorer"], name="triton-tls") as tls,
        TritonService(run_dir, tls=mutual_tls, models=["scorer"], name="triton-mtls") as mutual,
        TritonService(run_dir, models=["scorer"], name="triton-plain") as plain,
    ):
        yield TlsServers(pki, other, tls, mutual, plain)


# --- the client ----------------------------------------------------------------------------------


def scorer_inputs(rows: int) -> tuple[list[Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    rng = np.random.default_rng(rows)
    features = rng.normal(size=(rows, 16)).astype(np.float32)
    counts = rng.integers(0, 100, size=(rows, 1)).astype(np.int64)
    f = grpcclient.InferInput("FEATURES", list(features.shape), "FP32")
    f.set_data_from_numpy(features)
    c = grpcclient.InferInput("COUNT", list(counts.shape), "INT64")
    c.set_data_from_numpy(counts)
    return [f, c], features, counts


async def discover_and_infer(url: str, tls: TlsOptions) -> None:
    async with InferenceClient(url, "scorer", tls=tls) as client:
        spec = await client.discover(client_timeout=10)
        assert [t.name for t in spec.inputs] == ["FEATURES", "COUNT"]
        inputs, features, counts = scorer_inputs(7)
        out = await client.infer(inputs, ["SCORE", "LABEL"], client_timeout=10)
    want_score, want_label = score(features, counts)
    np.testing.assert_allclose(out.outputs["SCORE"].reshape(-1), want_score.reshape(-1), rtol=1e-6)
    np.testing.assert_array_equal(out.outputs["LABEL"].reshape(-1), want_label.reshape(-1))


async def discovery_error(url: str, tls: TlsOptions | None) -> tuple[str, str]:
    """The discovery error's message, and what :func:`describe_handshake_failure` makes of
    it (the cause start-up should report: see the module docstring)."""
    async with InferenceClient(url, "scorer", tls=tls) as client:
        with pytest.raises(ModelDiscoveryError) as caught:
            await client.discover(client_timeout=10)
    message = str(caught.value)
    assert url in message
    assert message.startswith("TLS handshake with the inference server"), message
    described = describe_handshake_failure(url, message, tls)
    assert described is not None, f"not recognised as a TLS failure: {message}"
    assert url in described
    return message, described


async def test_tls_with_the_right_ca_discovers_and_infers(servers: TlsServers) -> None:
    await discover_and_infer(servers.tls.grpc_url, TlsOptions(ca_file=servers.pki.ca_cert))


async def test_tls_server_name_override_is_checked(servers: TlsServers) -> None:
    url = servers.tls.grpc_url
    ca = servers.pki.ca_cert
    await discover_and_infer(url, TlsOptions(ca_file=ca, server_name="localhost"))
    message, described = await discovery_error(
        url, TlsOptions(ca_file=ca, server_name="not-the-server")
    )
    assert "hostname verification check failed" in message.lower()
    assert "tls_server_name" in described


async def test_tls_with_the_wrong_ca_fails_naming_the_url_and_cause(servers: TlsServers) -> None:
    url = servers.tls.grpc_url
    message, described = await discovery_error(url, TlsOptions(ca_file=servers.other.ca_cert))
    assert "certificate_verify_failed" in message.lower()
    assert "certificate verify failed" in described
    # the system's roots do not know the test CA either
    _, described = await discovery_error(url, TlsOptions())
    assert "certificate verify failed" in described


async def test_plaintext_and_tls_mismatches_are_named(servers: TlsServers) -> None:
    _, described = await discovery_error(servers.tls.grpc_url, None)
    assert "model.tls = true" in described
    tls = TlsOptions(ca_file=servers.pki.ca_cert)
    _, described = await discovery_error(servers.plain.grpc_url, tls)
    assert "does not speak TLS" in described


async def test_mutual_tls_without_client_certificate_fails(servers: TlsServers) -> None:
    url = servers.mutual.grpc_url
    _, described = await discovery_error(url, TlsOptions(ca_file=servers.pki.ca_cert))
    assert "requires a client certificate" in described
    assert "tls_cert_file" in described


async def test_mutual_tls_with_a_foreign_client_certificate_fails(servers: TlsServers) -> None:
    url = servers.mutual.grpc_url
    foreign = TlsOptions(
        ca_file=servers.pki.ca_cert,
        cert_file=servers.other.client_cert,
        key_file=servers.other.client_key,
    )
    _, described = await discovery_error(url, foreign)
    assert "does not accept this client certificate" in described


async def test_mutual_tls_with_client_certificate_works(servers: TlsServers) -> None:
    pki = servers.pki
    tls = TlsOptions(ca_file=pki.ca_cert, cert_file=pki.client_cert, key_file=pki.client_key)
    await discover_and_infer(servers.mutual.grpc_url, tls)


# --- configuration -------------------------------------------------------------------------------


def model_section(servers: TlsServers, **tls: Any) -> dict[str, Any]:
    return {"url": servers.mutual.grpc_url, "name": "scorer", "tls": True, **tls}


def test_config_loads_tls_files_and_rejects_bad_ones(
    servers: TlsServers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("ROWBATCH_")]:
        monkeypatch.delenv(key)
    pki = servers.pki
    base = {
        "source": {"kind": "pubsub", "subscription": "projects/p/subscriptions/sub"},
        "binding": {"inputs": {"f": "FEATURES"}, "outputs": {"SCORE": "score"}},
    }
    path = tmp_path / "c.toml"
    path.write_text(
        to_toml(
            {
                **base,
                "model": model_section(
                    servers,
                    tls_ca_file=pki.ca_cert,
                    tls_cert_file=pki.client_cert,
                    tls_key_file=pki.client_key,
                ),
            }
        )
    )
    model = load_config(path).model
    assert isinstance(model, ModelSettings)
    tls = model.tls_options()
    assert tls == TlsOptions(pki.ca_cert, pki.client_cert, pki.client_key)

    # a client certificate whose key belongs to another certificate
    path.write_text(
        to_toml(
            {
                **base,
                "model": model_section(
                    servers,
                    tls_ca_file=pki.ca_cert,
                    tls_cert_file=pki.client_cert,
                    tls_key_file=servers.other.client_key,
                ),
            }
        )
    )
    with pytest.raises(ConfigError, match=r"(?s)model.*tls_cert_file.*tls_key_file"):
        load_config(path)


@pytest.mark.timeout(60)
async def test_the_consumer_stops_at_start_on_a_handshake_failure(servers: TlsServers) -> None:
    """Not retried for ever: start-up fails at once, naming the server and gRPC's reason."""
    config = ConsumerConfig.model_validate(
        {
            "source": {"kind": "pubsub", "subscription": "projects/p/subscriptions/never"},
            "model": model_section(servers, tls_ca_file=str(servers.other.ca_cert)),
            "binding": {"inputs": {"features": "FEATURES"}, "outputs": {"SCORE": "score"}},
            "server": {"port": 0},
        }
    )
    started = time.monotonic()
    with pytest.raises(ModelDiscoveryError) as caught:
        await asyncio.wait_for(run_consumer(config, asyncio.Event()), 45)
    assert time.monotonic() - started < 30
    assert servers.mutual.grpc_url in str(caught.value)
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


# --- the consumer end to end over mutual TLS -----------------------------------------------------


@pytest.mark.timeout(300)
async def test_consumer_over_mutual_tls_writes_every_row_once(
    servers: TlsServers, topics: Topics, tmp_path: Path
) -> None:
    total = 600
    pki = servers.pki
    chunks, expected = scorer_chunks(total, seed=42)
    table = "scores_mtls"
    config = ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "pubsub",
                "subscription": topics.subscription,
                "dead_letter_topic": topics.dlq_topic,
                "max_lease_extension_s": 10,
            },
            "model": {
                **model_section(
                    servers,
                    tls_ca_file=str(pki.ca_cert),
                    tls_cert_file=str(pki.client_cert),
                    tls_key_file=str(pki.client_key),
                ),
                "max_wait_ms": 50,
            },
            "binding": {
                "inputs": {"features": "FEATURES", "count": "COUNT"},
                "outputs": {"SCORE": "score", "LABEL": "label"},
                "passthrough": {"id": "int64"},
            },
            "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": table},
            "server": {"port": 0},
            "log_format": "text",
        }
    )
    topics.publish(chunks)
    async with consumer_running(config) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry

        def acked() -> float:
            return registry.get_sample_value("rowbatch_messages_acked_total") or 0.0

        await wait_until(lambda: acked() == len(chunks), 120, "every message acked", run.task)
        await run.stop_and_wait()
        assert registry.get_sample_value("rowbatch_rows_written_total") == total
    with sqlite3.connect(tmp_path / "r.sqlite") as conn:
        rows = conn.execute(f"SELECT id, score, label FROM {table}").fetchall()
    ids = [int(r[0]) for r in rows]
    assert len(ids) == total
    assert set(ids) == set(range(total))
    for i, s, label in rows:
        assert s == pytest.approx(float(expected[int(i)][0]), rel=1e-6)
        assert int(label) == int(expected[int(i)][1])
