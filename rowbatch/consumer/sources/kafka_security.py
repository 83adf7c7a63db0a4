"""``KafkaSecurity``: the ``[source]`` fields of SASL and TLS that both Kafka sources share
(``kind = "kafka"`` on aiokafka, ``kind = "kafka-share"`` on confluent-kafka), declared and
checked once. Each source turns them into its own client's options: ``KafkaSettings``
into aiokafka's (an ``ssl.SSLContext``), ``KafkaShareSettings`` through
:meth:`KafkaSecurity.librdkafka_security` into librdkafka's keys."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import SecretStr, model_validator

from rowbatch.consumer.section import Section
from rowbatch.consumer.sources.base import SourceConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

TLS_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")


class KafkaSecurity(Section):
    """How a Kafka client authenticates (SASL) and encrypts (TLS)."""

    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: SaslMechanism | None = None
    """Required with ``SASL_PLAINTEXT``/``SASL_SSL``."""
    sasl_plain_username: str | None = None
    sasl_plain_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    """CA bundle for the brokers' certificates (default: the system's)."""
    ssl_certfile: Path | None = None
    """Client certificate for mutual TLS (with ``ssl_keyfile``)."""
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None

    @model_validator(mode="after")
    def _secure(self) -> Self:
        sasl = self.sasl
        if sasl and (
            self.sasl_mechanism is None
            or not self.sasl_plain_username
            or self.sasl_plain_password is None
        ):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs sasl_mechanism (PLAIN, "
                f"SCRAM-SHA-256 or SCRAM-SHA-512), sasl_plain_username and sasl_plain_password"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(
                f"sasl_mechanism {self.sasl_mechanism} needs security_protocol SASL_PLAINTEXT "
                f"or SASL_SSL, not {self.security_protocol}"
            )
        tls_files = [n for n in TLS_FILES if getattr(self, n)]
        if tls_files and not self.tls:
            raise ValueError(
                f"{', '.join(tls_files)} need security_protocol SSL or SASL_SSL, "
                f"not {self.security_protocol}"
            )
        if self.ssl_keyfile and not self.ssl_certfile:
            raise ValueError("ssl_keyfile needs ssl_certfile")
        return self

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    def librdkafka_security(self) -> dict[str, str]:
        """These settings as librdkafka's configuration keys (confluent-kafka's clients; the
        names of librdkafka's CONFIGURATION.md), secrets unwrapped; only what is set, so
        librdkafka's defaults stand for the rest (the system's CAs without ``ssl_cafile``).
        ``SourceConfigError`` naming the file when a TLS file does not exist: librdkafka's
        own error would come from inside the client's construction."""
        config: dict[str, str] = {"security.protocol": self.security_protocol}
        if self.sasl:
            assert self.sasl_mechanism is not None  # checked above
            assert self.sasl_plain_username is not None
            assert self.sasl_plain_password is not None
            config |= {
                "sasl.mechanism": self.sasl_mechanism,
                "sasl.username": self.sasl_plain_username,
                "sasl.password": self.sasl_plain_password.get_secret_value(),
            }
        missing = [f"{n}={getattr(self, n)}" for n in TLS_FILES if _absent(getattr(self, n))]
        if missing:
            raise SourceConfigError(f"TLS file(s) not found: {', '.join(missing)}")
        keys = {
            "ssl_cafile": "ssl.ca.location",
            "ssl_certfile": "ssl.certificate.location",
            "ssl_keyfile": "ssl.key.location",
        }
        for name, key in keys.items():
            path: Path | None = getattr(self, name)
            if path is not None:
                config[key] = str(path)
        if self.ssl_key_password is not None:
            config["ssl.key.password"] = self.ssl_key_password.get_secret_value()
        return config


def _absent(path: Path | None) -> bool:
    return path is not None and not path.exists()


__all__ = ["KafkaSecurity", "SaslMechanism", "SecurityProtocol"]
