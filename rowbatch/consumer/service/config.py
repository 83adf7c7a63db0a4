"""Consumer configuration: a TOML file plus ``ROWBATCH_*`` environment variables (which win),
validated by pydantic with errors that name the field.

Nested fields use ``__`` in the environment: ``ROWBATCH_MODEL__URL=127.0.0.1:8001``,
``ROWBATCH_SINK__DSN=postgresql://...``. See ``deploy/consumer.example.toml``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.settings import BindingSettings, ModelSettings
from rowbatch.consumer.observe.tracing_settings import TracingConfig
from rowbatch.consumer.section import MiB, Section
from rowbatch.consumer.sinks.settings import (
    IcebergSinkSettings,
    ParquetSinkSettings,
    PostgresSinkSettings,
    SqliteSinkSettings,
)
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.table.settings import TableSettings

__all__ = [
    "ConfigError",
    "ConsumerConfig",
    "ServerSettings",
    "SinkSettings",
    "SourceSettings",
    "load_config",
]


SourceSettings = Annotated[
    PubSubSettings | KafkaSettings | KafkaShareSettings | TableSettings,
    Field(discriminator="kind"),
]
"""The ``[source]`` section: each source's own settings type, chosen by ``kind`` (``table``:
offline table mode, ``sources/table/``; ``kafka-share``: a Kafka share group, experimental,
``sources/kafka_share/``)."""


def _model_kind(value: object) -> str:
    """``[model]``'s ``kind``: ``oip`` (the default) or ``openai``."""
    if isinstance(value, dict):
        return str(value.get("kind", "oip"))
    return str(getattr(value, "kind", "oip"))


ModelSection = Annotated[
    Annotated[ModelSettings, Tag("oip")] | Annotated[OpenAISettings, Tag("openai")],
    Discriminator(_model_kind),
]
"""The ``[model]`` section: an Open Inference Protocol server (``kind = "oip"``, the default:
Triton, MLServer, KServe) or an OpenAI-compatible one (``kind = "openai"``: vLLM, SGLang,
llama.cpp; docs/generative.md)."""


SinkSettings = Annotated[
    SqliteSinkSettings | PostgresSinkSettings | ParquetSinkSettings | IcebergSinkSettings,
    Field(discriminator="kind"),
]


class ServerSettings(Section):
    host: str = "127.0.0.1"
    """Where /metrics, /healthz and /readyz listen (0.0.0.0 in a container)."""
    port: int = Field(default=9464, ge=0, le=65535)
    """0 picks a free port."""


class ConsumerConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ROWBATCH_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    source: SourceSettings
    model: ModelSection
    binding: BindingSettings
    sink: SinkSettings = SqliteSinkSettings()
    budget_bytes: int = Field(default=256 * MiB, ge=MiB)
    """Memory budget for everything in flight: what each held message costs (payload,
    attributes, decoded inputs, expected outputs, and a measured overhead of ~2-5 KB for the
    objects that hold it) plus what the source has read ahead (Kafka)."""
    shutdown_grace_s: float = Field(default=30.0, gt=0)
    max_message_bytes: int = Field(default=32 * MiB, ge=1024)
    """A message whose payload is larger is dead-lettered (``undecodable``, code
    ``payload_too_large``) without being decoded."""
    max_attributes_bytes: int = Field(default=64 * 1024, ge=1024)
    """A message whose attributes/headers (names plus values) take more is dead-lettered
    (``undecodable``, code ``headers_too_large``)."""
    server: ServerSettings = ServerSettings()
    tracing: TracingConfig = TracingConfig()
    """OpenTelemetry spans (docs/tracing.md); off by default."""
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _consistent(self) -> ConsumerConfig:
        clash = set(self.binding.outputs.values()) & set(self.binding.passthrough)
        if clash:
            raise ValueError(
                f"binding: result column(s) {sorted(clash)} are both passthrough and output"
            )
        if isinstance(self.source, KafkaShareSettings):
            self.source.check_fits(self.model.max_wait_ms / 1000)
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls))


class ConfigError(ValueError):
    """The configuration is invalid; the message lists each bad field."""


def load_config(path: Path | None) -> ConsumerConfig:
    """Read ``path`` (TOML) and the environment; raise ``ConfigError`` naming bad fields."""
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")

    class _FromFile(ConsumerConfig):
        model_config = SettingsConfigDict(**{**ConsumerConfig.model_config, "toml_file": path})

    try:
        return _FromFile()  # type: ignore[call-arg]  # fields come from the file and env
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None


def _describe(exc: ValidationError, path: Path | None) -> str:
    where = f"{path}" if path else "the environment"
    lines = [f"invalid configuration ({where}; env vars ROWBATCH_<SECTION>__<FIELD> override):"]
    for err in exc.errors():
        parts = [str(p) for p in err["loc"] if not str(p).startswith("function-")]
        if parts[:1] == ["model"] and parts[1:2] and parts[1] in _MODEL_TAGS:
            del parts[1]  # one [model] section, whichever kind: model.url, not model.oip.url
        field = ".".join(parts)
        variable = _variable_for(parts)
        origin = f" (from the environment: {variable})" if variable else ""
        lines.append(f"  {field or '(top level)'}: {err['msg']}{origin}")
    return "\n".join(lines)


_MODEL_TAGS = frozenset({"oip", "openai"})
_UNION_TAGS = frozenset(
    {"pubsub", "kafka", "kafka-share", "table", "sqlite", "postgres", "parquet", "iceberg"}
)
"""The ``kind`` tags pydantic puts in an error's location inside ``[source]`` and ``[sink]``."""


def _variable_for(parts: list[str]) -> str | None:
    """The ``ROWBATCH_*`` variable that supplied the value at ``parts`` (or a section above
    it), if one is set: a bad value from the environment is named by its variable."""
    fields = [p for i, p in enumerate(parts) if not (i == 1 and p in _UNION_TAGS)]
    for n in range(len(fields), 0, -1):
        name = "ROWBATCH_" + "__".join(f.upper() for f in fields[:n])
        if name in os.environ:
            return name
    return None
