"""Consumer configuration: a TOML file plus ``ROWBATCH_*`` environment variables (which win),
validated by pydantic with errors that name the field.

Nested fields use ``__`` in the environment: ``ROWBATCH_MODEL__URL=127.0.0.1:8001``,
``ROWBATCH_SINK__DSN=postgresql://...``. See ``deploy/consumer.example.toml``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from rowbatch.consumer.model.configured_spec import ConfiguredSpec
from rowbatch.consumer.model.endpoints import Endpoints, EndpointSpecError, parse_endpoints
from rowbatch.consumer.model.spec import DATATYPES, TensorSpec
from rowbatch.consumer.model.tls import (
    TlsConfigError,
    TlsOptions,
    check_ca_file,
    check_cert_file,
    check_key_file,
    check_pair,
)
from rowbatch.consumer.section import MiB, Section
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.wire.columns import ColumnType

__all__ = [
    "BindingSettings",
    "ConfigError",
    "ConsumerConfig",
    "ModelSettings",
    "ParquetSinkSettings",
    "PostgresSinkSettings",
    "ServerSettings",
    "SinkSettings",
    "SourceSettings",
    "SqliteSinkSettings",
    "TensorSettings",
    "load_config",
]


SourceSettings = Annotated[PubSubSettings | KafkaSettings, Field(discriminator="kind")]
"""The ``[source]`` section: each source's own settings type, chosen by ``kind``."""


class TensorSettings(Section):
    """One model input or output, for ``model.inputs`` / ``model.outputs``."""

    name: str = Field(min_length=1)
    """The tensor's name on the server."""
    datatype: str
    """KServe v2 datatype: ``FP32``, ``INT64``, ``BYTES``, ``BOOL``... (see
    :data:`rowbatch.consumer.model.spec.DATATYPES`)."""
    dims: tuple[int, ...]
    """One row's shape, *without* the batch axis (``[16]`` for a shape ``[-1, 16]`` on the
    server; ``[]`` for one value per row); ``-1`` marks a variable dimension."""

    @field_validator("datatype")
    @classmethod
    def _known_datatype(cls, value: str) -> str:
        if value not in DATATYPES:
            raise ValueError(
                f"unknown datatype {value!r}: one of {', '.join(sorted(DATATYPES))} "
                "(KServe v2 names, upper case)"
            )
        return value

    @field_validator("dims")
    @classmethod
    def _dims_valid(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        bad = [d for d in value if d < 1 and d != -1]
        if bad:
            raise ValueError(
                f"{bad[0]} is not a dimension: each is >= 1, or -1 for a variable one "
                "(leave out the batch axis)"
            )
        return value

    def tensor(self) -> TensorSpec:
        return TensorSpec(self.name, self.datatype, self.dims)


class ModelSettings(Section):
    url: str = "127.0.0.1:8001"
    """KServe v2 / Open Inference Protocol gRPC address (Triton, MLServer, KServe),
    ``host:port``; several servers as a list (in the
    environment: separated by commas, or a JSON list), ``dns:///name:port`` for every address
    of a name (a Kubernetes headless Service), or grpc's ``ipv4:a:p,b:p`` list. Each batch
    goes to the healthy server with the fewest requests outstanding."""
    resolve_interval_s: float = Field(default=10.0, gt=0)
    """How often ``dns:///`` names are resolved again (servers that appear join once they
    serve the same model; those that disappear are retired)."""
    name: str
    version: str = ""
    """Empty: the server's choice (its version policy)."""
    batch_size: int | None = Field(default=None, ge=1)
    """Rows per request. Default per server kind (:mod:`rowbatch.consumer.model.server_kind`):
    Triton, from its ModelConfig, the largest preferred batch size, else ``max_batch_size``; servers
    without ModelConfig (MLServer, KServe, others) 256. Must not exceed a ModelConfig's
    ``max_batch_size``; required for a Triton model that does not batch."""
    max_wait_ms: float = Field(default=100.0, ge=0)
    """Latency bound: a partial batch is sent once its oldest row has waited this long."""
    max_in_flight: int | None = Field(default=None, ge=1)
    """Batches in flight at once per server (the consumer keeps the sum over the servers
    found at start). Default per server kind (:mod:`rowbatch.consumer.model.server_kind`): Triton,
    per model instance, enough for two executions of the model's ``max_batch_size`` (one running,
    one queued), at least 2: 4 for a model with preferred size 128 and max_batch_size 256;
    MLServer 8 (its adaptive batching merges requests, so it needs several in flight: raise
    this with its ``max_batch_size``); KServe and others 4. The memory budget still bounds
    it."""
    timeout_s: float = Field(default=60.0, gt=0)
    """Per-request deadline."""
    backoff_initial_s: float = Field(default=0.1, gt=0)
    backoff_max_s: float = Field(default=10.0, gt=0)
    startup_wait_s: float = Field(default=300.0, ge=0)
    """How long start-up waits for an inference server that does not answer (retrying with
    backoff) before giving up with an error; an unknown model fails at once."""
    inputs: tuple[TensorSettings, ...] | None = None
    """The model's inputs (``[[model.inputs]]`` tables of ``name``, ``datatype``, ``dims``; in
    the environment a JSON list), for a server that describes neither in ModelConfig nor in
    ModelMetadata (KServe's default, an MLServer model without tensors in its
    model-settings.json, a shape without the leading -1 batch axis). With ``outputs``; when the
    server describes the model too, both must agree (start-up names any difference)."""
    outputs: tuple[TensorSettings, ...] | None = None
    """The model's outputs, as ``inputs``."""
    tls: bool = False
    """gRPC over TLS to the model server."""
    tls_ca_file: Path | None = None
    """PEM root certificate(s) the server's certificate must chain to (default: the system's)."""
    tls_cert_file: Path | None = None
    """Client certificate chain (PEM) for servers that require mutual TLS; with
    ``tls_key_file``."""
    tls_key_file: Path | None = None
    """The client certificate's private key: unencrypted PEM (gRPC cannot use an encrypted
    one)."""
    tls_server_name: str | None = Field(default=None, min_length=1)
    """The name checked against the server's certificate instead of the URL's host (gRPC's
    ``ssl_target_name_override``), e.g. when connecting by IP address."""

    @field_validator("url", mode="before")
    @classmethod
    def _url_list(cls, value: object) -> object:
        """A list (or a JSON list in the environment) becomes the comma-separated form."""
        if isinstance(value, str) and value.startswith("[") and value.endswith("]"):
            with contextlib.suppress(ValueError):
                value = json.loads(value)
        if isinstance(value, list | tuple):
            if not all(isinstance(v, str) for v in value):
                raise ValueError("a list of model servers holds strings (host:port)")
            try:
                return ",".join(str(t) for t in parse_endpoints(value).targets)
            except EndpointSpecError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("url")
    @classmethod
    def _url_parses(cls, value: str) -> str:
        try:
            parse_endpoints(value)
        except EndpointSpecError as exc:
            raise ValueError(str(exc)) from None
        return value

    def endpoints(self) -> Endpoints:
        """``url`` parsed into the model-server targets."""
        return parse_endpoints(self.url)

    @field_validator("tls_ca_file")
    @classmethod
    def _ca_file_usable(cls, value: Path | None) -> Path | None:
        if value is not None:
            _tls_check(check_ca_file, value)
        return value

    @field_validator("tls_cert_file")
    @classmethod
    def _cert_file_usable(cls, value: Path | None) -> Path | None:
        if value is not None:
            _tls_check(check_cert_file, value)
        return value

    @field_validator("tls_key_file")
    @classmethod
    def _key_file_usable(cls, value: Path | None) -> Path | None:
        if value is not None:
            _tls_check(check_key_file, value)
        return value

    @field_validator("inputs", "outputs")
    @classmethod
    def _tensors_valid(
        cls, value: tuple[TensorSettings, ...] | None
    ) -> tuple[TensorSettings, ...] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("is empty: list the model's tensors, or leave the field out")
        names = [t.name for t in value]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"tensor name(s) {twice} appear more than once")
        return value

    @model_validator(mode="after")
    def _tensors_together(self) -> ModelSettings:
        if (self.inputs is None) != (self.outputs is None):
            given, missing = ("outputs", "inputs") if self.inputs is None else ("inputs", "outputs")
            raise ValueError(
                f"model.{given} is set but model.{missing} is not: configure both (or neither)"
            )
        return self

    def configured_spec(self) -> ConfiguredSpec | None:
        """``inputs`` and ``outputs`` as tensor specs; ``None`` when not configured."""
        if self.inputs is None or self.outputs is None:
            return None
        return ConfiguredSpec(
            tuple(t.tensor() for t in self.inputs), tuple(t.tensor() for t in self.outputs)
        )

    @model_validator(mode="after")
    def _tls_consistent(self) -> ModelSettings:
        files = {
            "tls_ca_file": self.tls_ca_file,
            "tls_cert_file": self.tls_cert_file,
            "tls_key_file": self.tls_key_file,
            "tls_server_name": self.tls_server_name,
        }
        given = [name for name, value in files.items() if value is not None]
        if given and not self.tls:
            raise ValueError(f"{', '.join(given)} need(s) tls = true")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together (both or neither)")
        if self.tls_cert_file is not None and self.tls_key_file is not None:
            try:
                check_pair(self.tls_cert_file, self.tls_key_file)
            except TlsConfigError as exc:
                raise ValueError(f"tls_cert_file/tls_key_file: {exc}") from None
        return self

    def tls_options(self) -> TlsOptions | None:
        """The TLS settings for the inference client; ``None`` when ``tls`` is off."""
        if not self.tls:
            return None
        return TlsOptions(
            ca_file=self.tls_ca_file,
            cert_file=self.tls_cert_file,
            key_file=self.tls_key_file,
            server_name=self.tls_server_name,
        )


def _tls_check(check: Callable[[Path], None], path: Path) -> None:
    try:
        check(path)
    except TlsConfigError as exc:
        raise ValueError(str(exc)) from None


class BindingSettings(Section):
    inputs: dict[str, str]
    """Table column -> model input."""
    outputs: dict[str, str]
    """Model output -> result column."""
    passthrough: dict[str, str] = Field(default_factory=dict)
    """Input columns copied into the result table (keys for joining back), with their wire
    type (``int64``, ``string``, ``float32``, ``vector[float32,384]``...): messages whose
    column has another type are dead-lettered as schema mismatches."""

    @field_validator("passthrough")
    @classmethod
    def _types_parse(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            try:
                ColumnType.parse(text)
            except ValueError as exc:
                raise ValueError(f"passthrough column {name!r}: {exc}") from None
        return value


class _SinkSection(Section):
    backoff_initial_s: float = Field(default=0.2, gt=0)
    """First wait after a transient sink failure (connection lost, database restarting,
    serialization failure, object-store throttling); doubles up to ``backoff_max_s``. Writes
    are retried for as long as the outage lasts, with consumption paused meanwhile."""
    backoff_max_s: float = Field(default=5.0, gt=0)
    startup_wait_s: float = Field(default=300.0, ge=0)
    """How long start-up waits for an unreachable sink (retrying with backoff) before giving
    up with an error."""
    write_concurrency: int = Field(default=2, ge=1)
    """Sink writes at once. Inference does not wait for writes: answered batches queue for
    the writers (bounded by ``budget_bytes``) and are coalesced into one write."""
    max_write_rows: int = Field(default=0, ge=0)
    """Most rows coalesced into one sink write; 0: four target batches."""

    @model_validator(mode="after")
    def _backoff_order(self) -> _SinkSection:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError("sink.backoff_initial_s must not exceed sink.backoff_max_s")
        return self


class SqliteSinkSettings(_SinkSection):
    kind: Literal["sqlite"] = "sqlite"
    path: Path = Path("rowbatch-results.sqlite")
    table: str = "results"


class PostgresSinkSettings(_SinkSection):
    kind: Literal["postgres"] = "postgres"
    dsn: SecretStr
    table: str = "results"
    db_schema: str = "public"


class ParquetSinkSettings(_SinkSection):
    kind: Literal["parquet"] = "parquet"
    url: str
    """A local path or an object-store URL understood by pyarrow (``s3://``, ``gs://``)."""
    table: str = "results"


SinkSettings = Annotated[
    SqliteSinkSettings | PostgresSinkSettings | ParquetSinkSettings, Field(discriminator="kind")
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
    model: ModelSettings
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
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _consistent(self) -> ConsumerConfig:
        if self.model.backoff_initial_s > self.model.backoff_max_s:
            raise ValueError("model.backoff_initial_s must not exceed model.backoff_max_s")
        clash = set(self.binding.outputs.values()) & set(self.binding.passthrough)
        if clash:
            raise ValueError(
                f"binding: result column(s) {sorted(clash)} are both passthrough and output"
            )
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
        field = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-"))
        lines.append(f"  {field or '(top level)'}: {err['msg']}")
    return "\n".join(lines)
