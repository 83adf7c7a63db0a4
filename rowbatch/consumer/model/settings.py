"""The ``[model]`` and ``[binding]`` settings: which server and model, batch size, in-flight
requests, retries and TLS, the tensors when the server cannot describe them, and which columns
feed which inputs and which outputs become which result columns. The model package owns them;
the service only assembles them into the consumer's configuration."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Literal, Self

from pydantic import Field, ValidationError, field_validator, model_validator

from rowbatch.consumer.model.candidate import CandidateSettings
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
from rowbatch.consumer.section import Section
from rowbatch.timing import Backoff
from rowbatch.wire.columns.column_type import ColumnType


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


class ServerSettingsBase(Section):
    """What every model-server kind shares (``[model]`` for an Open Inference Protocol server
    and for an OpenAI-compatible one): the model's name, the latency bound of a partial batch,
    and the retry and start-up waits."""

    name: str
    """The model's name on the server."""
    max_wait_ms: float = Field(default=100.0, ge=0)
    """Latency bound: a partial batch is sent once its oldest row has waited this long."""
    backoff_initial_s: float = Field(default=0.1, gt=0)
    backoff_max_s: float = Field(default=10.0, gt=0)
    startup_wait_s: float = Field(default=300.0, ge=0)
    """How long start-up waits for an inference server that does not answer (retrying with
    backoff) before giving up with an error; an unknown model fails at once."""
    adapt: bool = True
    """Read each server's own queue and move the requests in flight there with it (below the
    configured or derived ceiling): shrink while requests wait past the target, grow while
    the queue is below it and every place is taken, so the server stays busy without a
    standing queue however many consumers share it. From Triton's model statistics (queue
    and compute time per model, over the gRPC channel), vLLM's ``vllm:num_requests_waiting``,
    SGLang's ``sglang:num_queue_reqs``, llama.cpp's ``llamacpp:requests_deferred``. A server
    that gives none of them (MLServer, KServe's Python server) keeps the fixed limit, moved
    only by its overload answers."""
    adapt_interval_s: float = Field(default=0.5, gt=0)
    """How often each server's queue is read."""
    candidate: CandidateSettings | None = None
    """``[model.candidate]``: a shadow or canary version beside this one
    (:mod:`rowbatch.consumer.model.candidate`)."""

    @model_validator(mode="after")
    def _backoff_order(self) -> ServerSettingsBase:
        if self.backoff_initial_s > self.backoff_max_s:
            raise ValueError("model.backoff_initial_s must not exceed model.backoff_max_s")
        return self

    @model_validator(mode="after")
    def _candidate_valid(self) -> ServerSettingsBase:
        self.candidate_model()  # its overrides are fields of this section, with valid values
        return self

    def candidate_model(self) -> Self | None:
        """The candidate's model settings: these, with ``[model.candidate]``'s model fields
        replaced (``None``: no candidate)."""
        if self.candidate is None:
            return None
        overrides = self.candidate.overrides()
        unknown = sorted(
            (set(overrides) - set(type(self).model_fields)) | ({"candidate"} & set(overrides))
        )
        if unknown:
            raise ValueError(
                f"model.candidate: {', '.join(unknown)} is neither a rollout field (mode, "
                "share, salt, table, backlog_rows, timeout_s) nor a field of [model]"
            )
        data = {**self.model_dump(exclude={"candidate"}, exclude_unset=True), **overrides}
        try:
            return type(self).model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"model.candidate: {problems}") from None

    @property
    def backoff(self) -> Backoff:
        """The waits between retries of the model server (requests, probes of an endpoint
        that keeps failing, the start-up wait)."""
        return Backoff(self.backoff_initial_s, self.backoff_max_s)


class ModelSettings(ServerSettingsBase):
    """``[model]`` for a server speaking the Open Inference Protocol over gRPC (Triton,
    MLServer, KServe): ``kind = "oip"``, the default."""

    kind: Literal["oip"] = "oip"
    url: str = "127.0.0.1:8001"
    """KServe v2 / Open Inference Protocol gRPC address (Triton, MLServer, KServe),
    ``host:port``; several servers as a list (in the
    environment: separated by commas, or a JSON list), ``dns:///name:port`` for every address
    of a name (a Kubernetes headless Service), or grpc's ``ipv4:a:p,b:p`` list. Each batch
    goes to the healthy server with the fewest requests outstanding."""
    resolve_interval_s: float = Field(default=10.0, gt=0)
    """How often ``dns:///`` names are resolved again (servers that appear join once they
    serve the same model; those that disappear are retired)."""
    version: str = ""
    """Empty: the server's choice (its version policy)."""
    batch_size: int | None = Field(default=None, ge=1)
    """Rows per request. Default per server kind (:mod:`rowbatch.consumer.model.server_kind`):
    Triton, from its ModelConfig, the largest preferred batch size, else ``max_batch_size``; servers
    without ModelConfig (MLServer, KServe, others) 256. Must not exceed a ModelConfig's
    ``max_batch_size``; required for a Triton model that does not batch."""
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
    target_queue_ratio: float = Field(default=1.0, gt=0)
    """With ``adapt``: the queue a Triton server's window aims at, as a multiple of its slots
    (the requests it was seen running at once: instances times what each execution takes).
    1.0: each request waits about one execution, so every instance's next one is ready when
    the last ends; lower trades some idle for a shorter queue."""
    isolation: Literal["serial", "concurrent"] = "serial"
    """How batches that fail are bisected to find their bad messages and rows: ``serial``, one
    isolation at a time (safe with any server: MLServer's adaptive batching, or a Triton model
    that raises for a whole execution, would fail one isolation's requests for another's
    poison); ``concurrent``, each batch's at once, for a server that fails each request on its
    own rows (a Triton model answering an error per request): isolations then stop holding up
    one another (docs/dead-letters.md)."""
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
    inputs: dict[str, str] = Field(default_factory=dict)
    """Table column -> model input (an Open Inference Protocol model's; an OpenAI-compatible
    model's columns are the ones its prompt template names)."""
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
