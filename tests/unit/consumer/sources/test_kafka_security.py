"""The SASL/TLS fields both Kafka sources share (``KafkaSecurity``) and the topic layout
``admin ensure`` reads (``KafkaTopicLayout``): declared once (neither source redeclares a field
or a default), checked the same way on both (the same configurations refused with the same
messages), and turned into librdkafka's keys for the share-group source."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr, ValidationError

from rowbatch.consumer.sources.base import SourceConfigError
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_layout import KafkaTopicLayout
from rowbatch.consumer.sources.kafka_security import KafkaSecurity
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings

BASE = {"bootstrap_servers": "b:9093", "topic": "rows", "group_id": "g"}
SOURCES = [KafkaSettings, KafkaShareSettings]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("shared", [KafkaSecurity, KafkaTopicLayout])
def test_the_sources_share_one_declaration(
    source: type[BaseModel], shared: type[BaseModel]
) -> None:
    for name, info in shared.model_fields.items():
        assert name not in source.__annotations__, f"{source.__name__} redeclares {name}"
        assert source.model_fields[name].default == info.default, name
        assert source.model_fields[name].annotation == info.annotation, name


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"security_protocol": "SASL_SSL"}, "needs sasl_mechanism"),
        (
            {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN"},
            "sasl_plain_username and sasl_plain_password",
        ),
        ({"sasl_mechanism": "PLAIN"}, "needs security_protocol SASL_PLAINTEXT or SASL_SSL"),
        ({"ssl_cafile": "ca.pem"}, "ssl_cafile need security_protocol SSL or SASL_SSL"),
        (
            {"security_protocol": "SSL", "ssl_keyfile": "client.key"},
            "ssl_keyfile needs ssl_certfile",
        ),
        ({"security_protocol": "TLS"}, "security_protocol"),
        (
            {
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "GSSAPI",
                "sasl_plain_username": "u",
                "sasl_plain_password": "p",
            },
            "sasl_mechanism",
        ),
    ],
)
def test_bad_security_is_refused_alike(
    source: type[BaseModel], extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        source.model_validate({**BASE, **extra})


def sasl_ssl(source: type[BaseModel], tmp_path: Path, **extra: Any) -> Any:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_text("not read here")
    return source.model_validate(
        {
            **BASE,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "user",
            "sasl_plain_password": "hunter2-pw",
            "ssl_cafile": str(tmp_path / "ca.pem"),
            "ssl_certfile": str(tmp_path / "client.pem"),
            "ssl_keyfile": str(tmp_path / "client.key"),
            "ssl_key_password": "key-pw",
            **extra,
        }
    )


@pytest.mark.parametrize("source", SOURCES)
def test_secrets_stay_out_of_the_repr(source: type[BaseModel], tmp_path: Path) -> None:
    settings = sasl_ssl(source, tmp_path)
    assert "hunter2-pw" not in repr(settings)
    assert "key-pw" not in repr(settings)
    assert isinstance(settings.sasl_plain_password, SecretStr)


def test_librdkafka_keys(tmp_path: Path) -> None:
    """The names of librdkafka's CONFIGURATION.md (``sasl.mechanism`` is its alias of
    ``sasl.mechanisms``), secrets unwrapped."""
    settings = sasl_ssl(KafkaShareSettings, tmp_path)
    assert settings.librdkafka_security() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "user",
        "sasl.password": "hunter2-pw",
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.certificate.location": str(tmp_path / "client.pem"),
        "ssl.key.location": str(tmp_path / "client.key"),
        "ssl.key.password": "key-pw",
    }


def test_plaintext_sets_the_protocol_only() -> None:
    settings = KafkaShareSettings.model_validate(BASE)
    assert settings.librdkafka_security() == {"security.protocol": "PLAINTEXT"}
    tls = KafkaShareSettings.model_validate({**BASE, "security_protocol": "SSL"})
    assert tls.librdkafka_security() == {"security.protocol": "SSL"}  # the system's CAs


def test_sasl_plaintext_has_no_tls_keys() -> None:
    settings = KafkaShareSettings.model_validate(
        {
            **BASE,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
        }
    )
    assert settings.librdkafka_security() == {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
    }


def test_a_missing_tls_file_is_named(tmp_path: Path) -> None:
    settings = sasl_ssl(KafkaShareSettings, tmp_path, ssl_cafile="/nonexistent/ca.pem")
    with pytest.raises(SourceConfigError, match=r"ssl_cafile=/nonexistent/ca\.pem"):
        settings.librdkafka_security()


def test_the_layout_defaults_are_the_classic_ones() -> None:
    layout = KafkaTopicLayout()
    assert (layout.partitions, layout.replication_factor, layout.dead_letter_partitions) == (
        6,
        3,
        1,
    )
    assert layout.retention_ms == 7 * 24 * 3600 * 1000
    with pytest.raises(ValidationError, match="replication_factor"):
        KafkaShareSettings.model_validate({**BASE, "replication_factor": 0})
