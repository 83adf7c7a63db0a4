"""``KafkaShareSettings``: SASL and TLS reach every client of the source (the share consumers,
the dead-letter producer and the admin client all start from ``client_config``), a
dead-letter topic equal to the topic is refused, and ``classic_view`` is the classic source's
settings of the same brokers, security, topics and layout (what the dlq commands and ``admin
ensure`` use)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings

SASL = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "SCRAM-SHA-256",
    "sasl_plain_username": "u",
    "sasl_plain_password": "pw",
}


def share(**extra: Any) -> KafkaShareSettings:
    return KafkaShareSettings.model_validate(
        {"bootstrap_servers": "b:9092", "topic": "rows", "group_id": "scorers", **extra}
    )


def test_security_reaches_every_client() -> None:
    settings = share(**SASL, client_id="me")
    want = {
        "bootstrap.servers": "b:9092",
        "client.id": "me",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "u",
        "sasl.password": "pw",
    }
    assert settings.client_config() == want
    consumer = settings.consumer_config()
    assert want.items() <= consumer.items()
    assert consumer["group.id"] == "scorers"
    producer = settings.producer_config()
    assert want.items() <= producer.items()
    assert producer["acks"] == "all"


def test_plaintext_is_the_default() -> None:
    assert share().client_config() == {
        "bootstrap.servers": "b:9092",
        "client.id": "rowbatch-consumer",
        "security.protocol": "PLAINTEXT",
    }


def test_the_dead_letter_topic_must_differ_from_the_topic() -> None:
    with pytest.raises(ValidationError, match="dead_letter_topic must differ"):
        share(dead_letter_topic="rows")


def test_the_lock_in_milliseconds() -> None:
    assert share(lock_duration_s=2.5).lock_duration_ms == 2500


def test_the_classic_view_has_the_same_brokers_security_topics_and_layout() -> None:
    settings = share(
        **SASL,
        dead_letter_topic="rows-dead",
        partitions=12,
        replication_factor=1,
        retention_ms=-1,
        dead_letter_partitions=2,
        client_id="me",
        dead_letter_timeout_s=7.0,
    )
    view = settings.classic_view()
    assert isinstance(view, KafkaSettings)
    assert (view.bootstrap_servers, view.topic, view.dlq_topic) == ("b:9092", "rows", "rows-dead")
    assert (view.partitions, view.replication_factor, view.retention_ms) == (12, 1, -1)
    assert view.dead_letter_partitions == 2
    options = view.client_options()
    assert options["security_protocol"] == "SASL_PLAINTEXT"
    assert options["sasl_mechanism"] == "SCRAM-SHA-256"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("u", "pw")
    assert options["client_id"] == "me"
    assert view.producer_options()["request_timeout_ms"] == 7000


def test_the_classic_view_names_the_default_dead_letter_topic() -> None:
    view = share().classic_view()
    assert view.dlq_topic == "rows.dlq"
    assert view.dead_letter_topic == "rows.dlq"
    assert view.security_protocol == "PLAINTEXT"
