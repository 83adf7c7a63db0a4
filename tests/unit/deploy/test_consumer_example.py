"""deploy/consumer.example.toml lists every setting the consumer reads (set, or commented out
with its default), checked against the settings models themselves, so a new field cannot be
left out of the file the README sends users to; its commented table-mode ``[source]``, taken as
a user would (uncommented in place of the Pub/Sub one), loads through the real config loader."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path

import pytest
from pydantic import BaseModel

from harness.service import REPO_ROOT
from rowbatch.consumer.model.candidate import CandidateSettings
from rowbatch.consumer.model.settings import ModelSettings
from rowbatch.consumer.observe.tracing_settings import TracingConfig
from rowbatch.consumer.service.config import ConsumerConfig, ServerSettings, load_config
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.table.settings import TableSettings

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
        "source.table": names(TableSettings),
        "model": names(ModelSettings) - {"inputs", "outputs", "candidate"},
        "model.candidate": names(CandidateSettings),
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
        "source.table": names(TableSettings),
        "model": names(ModelSettings),
        # the candidate's own keys, and any [model] key (replaced for the candidate)
        "model.candidate": names(CandidateSettings) | names(ModelSettings),
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


_SETTING = re.compile(r"^# ([a-z_]+ = .*)$")


def with_table_source() -> str:
    """The example as a user makes it a table run: its commented ``[source]`` of kind "table"
    uncommented (the settings; the explanations left out) in place of the active one."""
    lines = EXAMPLE.read_text().splitlines()
    start = lines.index('# kind = "table"')
    block = ["[source]"]
    for line in lines[start:]:
        if not line.startswith("#"):
            break
        if setting := _SETTING.match(line):
            block.append(setting[1])
    first = lines.index("[source]")
    after = next(i for i in range(first + 1, len(lines)) if lines[i].startswith("["))
    return "\n".join([*lines[:first], *block, "", *lines[after:]]) + "\n"


def test_the_table_mode_example_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("ROWBATCH_")]:  # the file's values only
        monkeypatch.delenv(name)
    path = tmp_path / "table.toml"
    path.write_text(with_table_source())
    source = load_config(path).source
    assert isinstance(source, TableSettings)
    assert (source.input, source.schema_text) == ("data/events/", "id:int64,text:string")
    assert source.shard_index() == 0
    # every other value shown is the default a user starts from
    shown = source.model_dump(exclude={"input", "schema_text", "shard"})
    assert shown == TableSettings(input="x").model_dump(exclude={"input", "schema_text", "shard"})
