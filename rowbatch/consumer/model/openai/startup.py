"""Start-up against OpenAI-compatible servers (waited for, with backoff, by the service):
every endpoint answers ``GET /v1/models``; check each serves
``model.name``, and send one small request of the configured API (an embeddings model's answer
says its dimension). A wrong key, model or path fails here, with the server's words, instead of
dead-lettering the first rows. ``api = "batch"`` sends no probe: its rows may ask any of the
three APIs (an embeddings model answers no chat), so only ``GET /v1/models`` is checked, and a
rerun of a finished batch sends no request at all."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import orjson

from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.openai.client import (
    EndpointPool,
    HttpTimeout,
    HttpUnreachable,
    HttpUntrusted,
)
from rowbatch.consumer.model.openai.errors import classify_status
from rowbatch.consumer.model.openai.handler import PATHS
from rowbatch.consumer.model.openai.outputs import (
    batch_outputs,
    embedding_outputs,
    text_outputs,
)
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.spec import ModelSpec, TensorSpec

log = logging.getLogger(__name__)

PROBE_TEXT = "rowbatch start-up probe"


class OpenAIServerUnavailable(Exception):
    """An endpoint does not answer (yet)."""


@dataclass(frozen=True)
class Discovered:
    spec: ModelSpec
    owned_by: str


async def _models(pool: EndpointPool, settings: OpenAISettings) -> str:
    """Every endpoint lists the model; the first one's ``owned_by``."""
    owned = ""
    for endpoint in pool.endpoints:
        try:
            response = await endpoint.http.get("/v1/models", 10.0)
        except HttpUntrusted as exc:
            raise FatalInferenceError(str(exc), model=settings.name, status="TLS") from exc
        except (HttpTimeout, HttpUnreachable) as exc:
            raise OpenAIServerUnavailable(f"{endpoint.url}: {exc}") from exc
        if response.status in (502, 503, 504):
            raise OpenAIServerUnavailable(f"{endpoint.url}/v1/models: HTTP {response.status}")
        if response.status != 200:
            raise classify_status(
                response.status,
                response.body,
                model=settings.name,
                url=f"{endpoint.url}/v1/models",
                retry_after=None,
            )
        try:
            listed = orjson.loads(response.body).get("data") or []
            ids = {str(m.get("id")): str(m.get("owned_by") or "") for m in listed}
        except (orjson.JSONDecodeError, AttributeError) as exc:
            raise FatalInferenceError(
                f"{endpoint.url}/v1/models does not answer an OpenAI model list: "
                f"{response.body[:200]!r}",
                model=settings.name,
                status="BAD_ANSWER",
            ) from exc
        if ids and settings.name not in ids:
            raise FatalInferenceError(
                f"{endpoint.url} does not serve model {settings.name!r} (it serves "
                f"{sorted(ids)}): model.name",
                model=settings.name,
                status="404",
            )
        owned = owned or ids.get(settings.name, "")
    return owned


async def _probe(pool: EndpointPool, settings: OpenAISettings) -> int:
    """One small request per endpoint; the embedding dimension (0 for other APIs; none for
    ``batch``)."""
    if settings.api == "batch":
        return 0
    body: dict[str, object] = {"model": settings.name}
    if settings.api == "chat":
        body.update(messages=[{"role": "user", "content": PROBE_TEXT}], max_tokens=1)
    elif settings.api == "completions":
        body.update(prompt=PROBE_TEXT, max_tokens=1)
    else:
        body.update(settings.sampling, input=[PROBE_TEXT])
    dims = set()
    for endpoint in pool.endpoints:
        try:
            response = await endpoint.http.post(PATHS[settings.api], orjson.dumps(body))
        except HttpUntrusted as exc:
            raise FatalInferenceError(str(exc), model=settings.name, status="TLS") from exc
        except (HttpTimeout, HttpUnreachable) as exc:
            raise OpenAIServerUnavailable(f"{endpoint.url}: {exc}") from exc
        if response.status != 200:
            error = classify_status(
                response.status,
                response.body,
                model=settings.name,
                url=f"{endpoint.url}{PATHS[settings.api]}",
                retry_after=response.retry_after,
            )
            if isinstance(error, RetryableInferenceError):
                raise OpenAIServerUnavailable(str(error))
            raise error
        if settings.api == "embeddings":
            data = orjson.loads(response.body).get("data") or [{}]
            vector = data[0].get("embedding")
            if not isinstance(vector, list) or not vector:
                raise FatalInferenceError(
                    f"{endpoint.url}: the probe's embedding is {vector!r}, not a list of floats",
                    model=settings.name,
                    status="BAD_ANSWER",
                )
            dims.add(len(vector))
    if len(dims) > 1:
        raise FatalInferenceError(
            f"the endpoints answer embeddings of different sizes {sorted(dims)}: model.url",
            model=settings.name,
            status="BAD_ANSWER",
        )
    return dims.pop() if dims else 0


async def discover_once(
    pool: EndpointPool, settings: OpenAISettings, columns: tuple[str, ...]
) -> Discovered:
    """The model's spec (its inputs: the template's columns as text; its outputs by API);
    raises :class:`OpenAIServerUnavailable` while an endpoint does not answer (the caller
    waits), an :class:`InferenceError` naming a wrong setting."""
    owned = await _models(pool, settings)
    dim = await _probe(pool, settings)
    outputs = (
        embedding_outputs(dim)
        if settings.api == "embeddings"
        else batch_outputs()
        if settings.api == "batch"
        else text_outputs(settings.json_schema)
    )
    spec = ModelSpec(
        name=settings.name,
        version="",
        inputs=tuple(TensorSpec(c, "BYTES", ()) for c in columns),
        outputs=outputs,
        max_batch_size=0,
        source="configured",
        server_name=f"openai-compatible ({owned})" if owned else "openai-compatible",
    )
    return Discovered(spec, owned)


__all__ = ["Discovered", "OpenAIServerUnavailable", "discover_once"]
