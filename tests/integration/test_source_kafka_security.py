"""The Kafka source's security options against a real broker with secured listeners: SASL
PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, TLS (server certificate checked against a CA file)
and SASL over TLS. Wrong credentials and an untrusted certificate fail the start-up check
with the address named; right ones consume, commit and dead-letter as on plain text."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.kafka import KafkaEndpoint, KafkaService
from harness.proc import free_port
from harness.service import RunDir
from rowbatch.consumer.sources.delivery import DeadLetterReason
from rowbatch.consumer.sources.kafka.errors import KafkaUnreachable
from rowbatch.consumer.sources.kafka.source import KafkaSource
from rowbatch.wire.dead_letter import ReasonClass
from tests.integration.kafka_helpers import KafkaTopics, produce, read_all
from tests.integration.test_source_kafka import committed_becomes, records, source_config, take

USER, PASSWORD = "rowbatch", "s3cret-pw"  # ASCII: server.properties is Latin-1
STORE_PASSWORD = "store-pw"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


@dataclass(frozen=True)
class SecureBroker:
    plain: KafkaEndpoint
    """The PLAINTEXT listener (for the harness: readiness, topics, producing)."""
    listeners: dict[str, str]
    """Protocol (SASL_PLAINTEXT, SSL, SASL_SSL) -> its 127.0.0.1:port."""
    cafile: Path
    """The broker's self-signed certificate, PEM: the CA file a client must trust."""


def self_signed_keystore(where: Path) -> tuple[Path, Path]:
    """A PKCS12 keystore with a self-signed certificate for 127.0.0.1 (JDK ``keytool``), and
    that certificate as PEM."""
    keystore, pem = where / "broker.p12", where / "broker-ca.pem"
    common = ["-keystore", str(keystore), "-storepass", STORE_PASSWORD, "-storetype", "PKCS12"]
    subprocess.run(
        ["keytool", "-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048",
         "-dname", "CN=127.0.0.1", "-ext", "SAN=IP:127.0.0.1", "-validity", "2",
         "-keypass", STORE_PASSWORD, *common],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    subprocess.run(
        ["keytool", "-exportcert", "-rfc", "-alias", "broker", "-file", str(pem), *common],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return keystore, pem


@pytest.fixture(scope="module")
def secure_broker(
    run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SecureBroker]:
    """One broker, four client listeners: PLAINTEXT, SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256,
    SCRAM-SHA-512), SSL, SASL_SSL (SCRAM-SHA-512); user ``rowbatch`` for every mechanism."""
    keystore, pem = self_signed_keystore(tmp_path_factory.mktemp("tls"))
    port, controller = free_port(), free_port()
    secured = {name: free_port() for name in ("SASL_PLAINTEXT", "SSL", "SASL_SSL")}
    client = [f"PLAINTEXT://127.0.0.1:{port}"] + [
        f"{name}://127.0.0.1:{p}" for name, p in secured.items()
    ]
    plain_jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'user_{USER}="{PASSWORD}";'
    )
    service = KafkaService(
        run_dir,
        name="kafka-secure",
        overrides={
            "listeners": ",".join([*client, f"CONTROLLER://127.0.0.1:{controller}"]),
            "advertised.listeners": ",".join(client),
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,"
                "SSL:SSL,SASL_SSL:SASL_SSL"
            ),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": plain_jaas,
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": SCRAM,
            "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM,
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": SCRAM,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(keystore),
            "ssl.keystore.password": STORE_PASSWORD,
            "ssl.key.password": STORE_PASSWORD,
        },
        format_args=[
            arg
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512")
            for arg in ("--add-scram", f"{mechanism}=[name={USER},password={PASSWORD}]")
        ],
    )
    service._ports = (port, controller)  # the listeners above name them
    with service as endpoint:
        yield SecureBroker(endpoint, {name: f"127.0.0.1:{p}" for name, p in secured.items()}, pem)


def options(broker: SecureBroker, protocol: str, mechanism: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "bootstrap_servers": broker.listeners[protocol],
        "security_protocol": protocol,
        "check_timeout_s": 10,
    }
    if mechanism is not None:
        out |= {"sasl_mechanism": mechanism, "sasl_plain_username": USER}
    if protocol.endswith("SSL"):
        out["ssl_cafile"] = str(broker.cafile)
    return out


CASES = [
    ("SASL_PLAINTEXT", "PLAIN"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-256"),
    ("SASL_PLAINTEXT", "SCRAM-SHA-512"),
    ("SSL", None),
    ("SASL_SSL", "SCRAM-SHA-512"),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("protocol", "mechanism"), CASES)
async def test_secured_listeners_consume_commit_and_dead_letter(
    secure_broker: SecureBroker, protocol: str, mechanism: str | None
) -> None:
    t = await KafkaTopics.create(secure_broker.plain, partitions=1)
    secure = options(secure_broker, protocol, mechanism)
    if mechanism is not None:
        secure["sasl_plain_password"] = PASSWORD
    source = KafkaSource(source_config(t, **secure))
    try:
        await source.check()
        await produce(secure_broker.plain, t.topic, records(3))
        got = await take(source, 3)
        assert [d.payload for d in got] == [value for _, value, _ in records(3)]
        await source.dead_letter(got[0], DeadLetterReason(ReasonClass.UNDECODABLE, "x"))
        for d in got[1:]:
            await source.ack(d)
        await committed_becomes(t, {0: 3})
    finally:
        await source.close()
    assert len(await read_all(secure_broker.plain, t.dlq)) == 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("protocol", "mechanism"), [c for c in CASES if c[1] is not None])
async def test_a_wrong_password_fails_the_start_up_check_naming_the_address(
    secure_broker: SecureBroker, protocol: str, mechanism: str
) -> None:
    t = await KafkaTopics.create(secure_broker.plain, partitions=1)
    secure = options(secure_broker, protocol, mechanism) | {"sasl_plain_password": "nope"}
    source = KafkaSource(source_config(t, **secure))
    try:
        with pytest.raises(KafkaUnreachable, match=secure_broker.listeners[protocol]) as err:
            await source.check()
        assert "SaslAuthenticationFailed" in str(err.value)  # the cause, not just "unreachable"
    finally:
        await source.close()


@pytest.mark.timeout(120)
# aiokafka drops the socket of a failed TLS handshake without closing it (its ResourceWarning
# surfaces whenever the collector runs); the source itself is closed below.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_certificate_the_client_does_not_trust_fails_the_start_up_check(
    secure_broker: SecureBroker,
) -> None:
    """Without ``ssl_cafile`` the system's CAs are used, and they do not know the broker's
    self-signed certificate."""
    t = await KafkaTopics.create(secure_broker.plain, partitions=1)
    secure = options(secure_broker, "SSL", None)
    del secure["ssl_cafile"]
    source = KafkaSource(source_config(t, **secure))
    try:
        with pytest.raises(KafkaUnreachable, match=secure_broker.listeners["SSL"]) as err:
            await source.check()
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)
    finally:
        await source.close()
