"""``[model]`` with ``kind = "openai"``: an OpenAI-compatible server, the API used, the prompt
template over the row's columns, sampling, and the concurrency window."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rowbatch.consumer.model.openai.template import PromptTemplate, TemplateError
from rowbatch.consumer.model.settings import ServerSettingsBase

Api = Literal["chat", "completions", "embeddings", "batch"]

#: Rows per request of the APIs that take a list (``prompt`` / ``input``), unless configured.
DEFAULT_ROWS_PER_REQUEST: dict[str, int] = {
    "chat": 1,
    "completions": 16,
    "embeddings": 64,
    "batch": 1,
}


class OpenAISettings(ServerSettingsBase):
    """``[model]`` for an OpenAI-compatible HTTP server."""

    kind: Literal["openai"]
    url: tuple[str, ...] = ("http://127.0.0.1:8000",)
    """Base URL(s) of the server(s), ``http(s)://host:port`` (a trailing ``/v1`` is allowed);
    several as a list, or separated by commas in the environment. Each request goes to the
    endpoint with a free place in its window and the fewest requests in flight."""
    api: Api = "chat"
    """``chat``: ``/v1/chat/completions``, one row per request; ``completions``:
    ``/v1/completions``, ``rows_per_request`` prompts per request; ``embeddings``:
    ``/v1/embeddings``, ``rows_per_request`` inputs per request; ``batch``: each row is a
    request of the OpenAI Batch API file format (columns ``custom_id``, ``url``, ``body``: the
    body's JSON, sent to the row's ``url`` with its ``model`` replaced by ``model.name``), one
    row per request (``rowbatch-consumer openai-batch``, docs/generative.md)."""
    prompt: str | None = Field(default=None, validate_default=True)
    """The text sent for each row: a template naming the row's columns in braces
    (``"Summarise: {body}"``; ``{{`` and ``}}`` for literal braces). The user message of a chat,
    the prompt of a completion, the input of an embedding. Required, except with ``batch``
    (which takes none: each row's body is the request)."""
    system_prompt: str | None = None
    """Chat only: a system message before each row's user message (a template too)."""
    max_tokens: int = Field(default=256, ge=1)
    """Most tokens generated per row (not for embeddings); also what the byte budget sets
    aside per row in flight. With ``batch`` only the latter (and the ``tokens_per_minute``
    estimate of a body without ``max_tokens``): each body says its own."""
    temperature: float | None = Field(default=0.0, ge=0)
    """Sampling temperature; 0 (the default) for repeatable results; ``None``: the server's."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """More request fields, sent as they are (``top_p``, ``seed``, ``stop``,
    ``presence_penalty``, vLLM's ``top_k``...)."""
    json_schema: dict[str, Any] | None = None
    """Chat and completions: structured output. The JSON schema (an object with
    ``properties``) goes as ``response_format`` (``json_schema``); each answer is parsed, and
    its top-level fields are outputs named ``json.<field>``, typed from the schema (string,
    integer, number, boolean). A row whose answer does not parse is a row error
    (``unparseable_output``)."""
    rows_per_request: int | None = Field(default=None, ge=1)
    """Rows per request for ``completions`` and ``embeddings`` (16 and 64 by default); chat is
    always one."""
    batch_size: int | None = Field(default=None, ge=1)
    """Rows per engine batch (each batch's rows are spread over requests in the window).
    Default: half of the window's ceiling in rows, so two batches keep it full."""
    max_in_flight: int = Field(default=16, ge=1)
    """Requests in flight per endpoint to start with: the server's slots (vLLM's
    ``max_num_seqs``, SGLang's ``max_running_requests``), or a hosted endpoint's allowed
    concurrency. A 429 or 503 halves it for a while; with ``adapt`` it follows the server's
    queue."""
    max_window: int | None = Field(default=None, ge=1)
    """The most requests in flight per endpoint the window may grow to (default: twice
    ``max_in_flight``)."""
    metrics_path: str = "/metrics"
    """Where the server's Prometheus metrics are read (``adapt``)."""
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """A hosted endpoint's limit: requests wait so that their prompt (estimated from its
    bytes, then corrected by the answer's ``usage``) plus ``max_tokens`` stay within it."""
    timeout_s: float = Field(default=600.0, gt=0)
    """Per-request deadline (generation can take minutes)."""
    api_key: SecretStr | None = None
    """Sent as ``Authorization: Bearer``; better from the environment
    (``ROWBATCH_MODEL__API_KEY``) or ``api_key_file``."""
    api_key_file: Path | None = None
    """A file holding the API key (a mounted secret)."""
    tls_ca_file: Path | None = None
    """PEM root certificate(s) an ``https`` server's certificate must chain to (default: the
    system's)."""

    @field_validator("url", mode="before")
    @classmethod
    def _url_list(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("[") and text.endswith("]"):
                with contextlib.suppress(ValueError):
                    return tuple(json.loads(text))
            return tuple(part.strip() for part in text.split(",") if part.strip())
        return value

    @field_validator("url")
    @classmethod
    def _urls_valid(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("name at least one server (http://host:port)")
        out = []
        for url in value:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http:// or https:// URL")
            base = url.rstrip("/").removesuffix("/v1")
            if base in out:
                raise ValueError(f"{url!r} is listed twice")
            out.append(base)
        return tuple(out)

    @field_validator("prompt", "system_prompt")
    @classmethod
    def _template_parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                PromptTemplate(value)
            except TemplateError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("prompt")
    @classmethod
    def _prompt_unless_batch(cls, value: str | None, info: ValidationInfo) -> str | None:
        api = info.data.get("api")
        if value is None and api is not None and api != "batch":
            raise PydanticCustomError("missing", "Field required")
        return value

    @field_validator("api_key_file")
    @classmethod
    def _key_file_readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value

    @field_validator("sampling")
    @classmethod
    def _sampling_not_ours(cls, value: dict[str, Any]) -> dict[str, Any]:
        ours = sorted(set(value) & _FIELDS_WE_SET)
        if ours:
            raise ValueError(
                f"{ours} are set by rowbatch (model.* settings) or not supported (one answer"
                " per row, read whole)"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> OpenAISettings:
        if self.api == "batch":
            self._batch_consistent()
        if self.api == "chat" and self.rows_per_request not in (None, 1):
            raise ValueError("model.rows_per_request: a chat request holds one row")
        if self.api == "embeddings" and self.json_schema is not None:
            raise ValueError("model.json_schema: embeddings have no structured output")
        if self.api != "chat" and self.system_prompt is not None:
            raise ValueError("model.system_prompt is for api = 'chat'")
        if self.api_key is not None and self.api_key_file is not None:
            raise ValueError("model.api_key and model.api_key_file: set one")
        if self.max_window is not None and self.max_window < self.max_in_flight:
            raise ValueError("model.max_window must not be below model.max_in_flight")
        if self.json_schema is not None:
            props = self.json_schema.get("properties")
            if self.json_schema.get("type", "object") != "object" or not isinstance(props, dict):
                raise ValueError("model.json_schema: an object schema with 'properties'")
        return self

    def _batch_consistent(self) -> None:
        """``api = "batch"``: the rows' bodies are the requests, so nothing shapes them."""
        shaping = [
            name
            for name in ("prompt", "system_prompt", "json_schema")
            if getattr(self, name) is not None
        ]
        if self.sampling:
            shaping.append("sampling")
        if "temperature" in self.model_fields_set:
            shaping.append("temperature")
        if shaping:
            names = ", ".join(f"model.{name}" for name in shaping)
            raise ValueError(
                f"{names}: not with api = 'batch' (each row's body is the request as it is)"
            )
        if self.rows_per_request not in (None, 1):
            raise ValueError("model.rows_per_request: a batch request holds one row")

    @property
    def requests_rows(self) -> int:
        """Rows per request."""
        return self.rows_per_request or DEFAULT_ROWS_PER_REQUEST[self.api]

    @property
    def window_ceiling(self) -> int:
        """The most requests in flight per endpoint."""
        return self.max_window or 2 * self.max_in_flight

    def key(self) -> str | None:
        """The API key, read from ``api_key_file`` when given; None without one."""
        if self.api_key_file is not None:
            return self.api_key_file.read_text().strip() or None
        return self.api_key.get_secret_value() if self.api_key is not None else None


_FIELDS_WE_SET = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "input",
        "max_tokens",
        "temperature",
        "response_format",
        "n",  # one answer per row: several would not fit the row's result
        "stream",  # answers are read whole
    }
)
