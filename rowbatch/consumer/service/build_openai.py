"""Building the model side for an OpenAI-compatible server (``[model] kind = "openai"``): the
endpoint pool, start-up discovery (waiting with backoff while no server answers), the binding
checked against the outputs the API has, and the handler with its retries, which pause intake
while they back off as the Open Inference Protocol's do."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rowbatch.consumer.engine.gate import Gate
from rowbatch.consumer.model.binding import Binding, BindingError, check_binding
from rowbatch.consumer.model.inference.errors import error_kind
from rowbatch.consumer.model.inference.retry import InferenceRetry, RetryingInferencer
from rowbatch.consumer.model.openai.client import EndpointPool
from rowbatch.consumer.model.openai.handler import BATCH_COLUMNS, OpenAIHandler
from rowbatch.consumer.model.openai.outputs import USAGE_OUTPUTS
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.openai.startup import OpenAIServerUnavailable, discover_once
from rowbatch.consumer.model.openai.template import PromptTemplate
from rowbatch.consumer.model.openai.token_rate import TokenRate
from rowbatch.consumer.model.settings import BindingSettings
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.startup import wait_for
from rowbatch.timing import SYSTEM_CLOCKS, Clocks
from rowbatch.wire.columns.column_type import ColumnType

#: Batches in flight for an OpenAI-compatible model: each is half the windows' ceiling in
#: rows, so the windows stay full while a batch's last rows finish.
OPENAI_BATCHES_IN_FLIGHT = 4


@dataclass
class OpenAIModel:
    pool: EndpointPool
    handler: OpenAIHandler
    spec: ModelSpec
    binding: Binding
    batches_in_flight: int = OPENAI_BATCHES_IN_FLIGHT


def template_columns(settings: OpenAISettings) -> tuple[str, ...]:
    """The columns the prompt (and system prompt) name; ``api = "batch"``: the request's
    (``custom_id``, ``url``, ``body``)."""
    if settings.api == "batch":
        return BATCH_COLUMNS
    names = PromptTemplate(settings.prompt or "").columns
    if settings.system_prompt is not None:
        names += PromptTemplate(settings.system_prompt).columns
    return tuple(dict.fromkeys(names))


def openai_binding(settings: OpenAISettings, binding: BindingSettings, spec: ModelSpec) -> Binding:
    """The binding the engine uses: each template column feeds an input of its own name; the
    outputs and passthrough as configured. Raises :class:`BindingError` for outputs the API
    does not have, and for token counts with several rows per request."""
    bound = Binding(
        inputs={c: c for c in template_columns(settings)},
        outputs=binding.outputs,
        passthrough=tuple(binding.passthrough),
    )
    check_binding(spec, bound)
    per_request = sorted(set(binding.outputs) & USAGE_OUTPUTS)
    if settings.requests_rows > 1 and per_request:
        raise BindingError(
            spec.name,
            [
                f"output(s) {per_request} count a whole request, and model.rows_per_request is "
                f"{settings.requests_rows}: set it to 1 to have them per row, or unbind them"
            ],
        )
    return bound


def target_rows(settings: OpenAISettings, pool: EndpointPool) -> int:
    """Rows per engine batch: ``model.batch_size``, else half the windows' ceiling in rows."""
    if settings.batch_size is not None:
        return settings.batch_size
    return max(1, pool.capacity * settings.requests_rows // 2)


async def open_openai(
    settings: OpenAISettings,
    binding: BindingSettings,
    passthrough: Mapping[str, ColumnType],
    *,
    metrics: Metrics,
    gate: Gate,
    clocks: Clocks = SYSTEM_CLOCKS,
) -> OpenAIModel:
    """The pool, checked against the servers, and the handler over it (the pool is closed
    again when this fails)."""
    pool = EndpointPool(settings, meter=metrics.endpoint, clocks=clocks)
    try:
        columns = template_columns(settings)
        found = await wait_for(
            lambda: discover_once(pool, settings, columns),
            what=f"OpenAI-compatible server {', '.join(settings.url)}",
            unavailable=OpenAIServerUnavailable,
            wait_s=settings.startup_wait_s,
            backoff=settings.backoff,
            setting="model.startup_wait_s",
            clocks=clocks,
        )
        bound = openai_binding(settings, binding, found.spec)
        retrying = RetryingInferencer(
            None,
            InferenceRetry(settings.backoff, client_timeout_s=settings.timeout_s),
            on_backoff_start=gate.backoff_started,
            on_backoff_end=gate.backoff_ended,
            on_error=lambda exc: metrics.inference_errors.labels(error_kind(exc)).inc(),
            clocks=clocks,
        )

        async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            return await retrying.call(lambda: pool.post(path, body))

        def tokens(prompt: int, completion: int) -> None:
            metrics.tokens.labels("prompt").inc(prompt)
            metrics.tokens.labels("completion").inc(completion)

        handler = OpenAIHandler(
            post,
            settings,
            [t for t in found.spec.outputs if t.name in bound.outputs],
            passthrough,
            target_batch_size=target_rows(settings, pool),
            clock=clocks.monotonic,
            on_tokens=tokens,
            token_rate=(
                TokenRate(settings.tokens_per_minute, clocks.monotonic, clocks.sleep)
                if settings.tokens_per_minute is not None
                else None
            ),
        )
    except BaseException:
        await pool.close()
        raise
    pool.start_watching()
    return OpenAIModel(pool, handler, found.spec, bound)
