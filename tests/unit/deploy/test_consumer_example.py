"""deploy/consumer.example.toml lists every setting the consumer reads (set, or commented out
with its default), checked against the settings models themselves, so a new field cannot be
left out of the file the README sends users to."""

from __future__ import annotations

import re
from collections import defaultdict

from pydantic import BaseModel

from harness.service import REPO_ROOT
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.observe.tracing_settings import TracingConfig
from rowbatch.consumer.service.config import ConsumerConfig, ServerSettings
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings

EXAMPLE = REPO_ROOT / "deploy" / "consumer.example.toml"
_HEADER = re.compile(r"^#?\s*\[\[?([a-z_.]+)\]\]?\s*(#.*)?$")
_KEY = re.compile(r"^#?\s*([a-z_]+)\s*=")
_KIND = re.compile(r'^#?\s*kind\s*=\s*"([a-z]+)"')
SECTIONS = {"source", "model", "binding", "sink", "server", "tracing"}


def listed() -> dict[str, set[str]]:
    """Section (``source.kafka`` for a source of that kind) -> the keys the file names."""
    found: dict[str, set[str]] = defaultdict(set)
    section = ""
    for raw in EXAMPLE.read_text().splitlines():
        line = raw.strip()
        if header := _HEADER.match(line):
            section = header[1]
            continue
        in_source = section == "source" or section.startswith("source.")
        if in_source and (kind := _KIND.match(line)):
            section = f"source.{kind[1]}"
        if key := _KEY.match(line):
            found[section].add(key[1])
    return found


def names(model: type[BaseModel]) -> set[str]:
    return {field.alias or name for name, field in model.model_fields.items()}


def test_the_example_names_every_setting() -> None:
    found = listed()
    sinks = (
        names(SqliteSinkSettings)
        | names(PostgresSinkSettings)
        | names(ParquetSinkSettings)
        | names(IcebergSinkSettings)
    )
    want = {
        "": names(ConsumerConfig) - SECTIONS,
        "source.pubsub": names(PubSubSettings),
        "source.kafka": names(KafkaSettings),
        "model": names(ModelSettings) - {"inputs", "outputs"},
        "model.inputs": {"name", "datatype", "dims"},
        "model.outputs": {"name", "datatype", "dims"},
        "sink": sinks,
        "server": names(ServerSettings),
        "tracing": names(TracingConfig),
    }
    missing = {
        section: sorted(keys - found[section])
        for section, keys in want.items()
        if keys - found[section]
    }
    assert missing == {}, f"settings absent from {EXAMPLE.name}: {missing}"


def test_the_example_names_no_setting_that_does_not_exist() -> None:
    found = listed()
    sinks = (
        names(SqliteSinkSettings)
        | names(PostgresSinkSettings)
        | names(ParquetSinkSettings)
        | names(IcebergSinkSettings)
    )
    known = {
        "": names(ConsumerConfig),
        "source.pubsub": names(PubSubSettings),
        "source.kafka": names(KafkaSettings),
        "model": names(ModelSettings),
        "model.inputs": {"name", "datatype", "dims"},
        "model.outputs": {"name", "datatype", "dims"},
        "binding": {"inputs", "outputs", "passthrough"},
        "sink": sinks,
        "server": names(ServerSettings),
        "tracing": names(TracingConfig),
    }
    unknown = {
        s: sorted(keys - known.get(s, set()))
        for s, keys in found.items()
        if keys - known.get(s, set())
    }
    assert unknown == {}
