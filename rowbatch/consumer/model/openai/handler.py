"""The model handler for OpenAI-compatible servers (the engine's
:class:`~rowbatch.consumer.model.handler.ModelHandler`): a batch's rows become prompts from the
template, then requests (one row each for chat; ``rows_per_request`` for completions and
embeddings) sent together through the endpoints' windows; the answers become the bound outputs.

A row the server refuses on its own (a 400: a prompt over the context length), whose
structured output does not parse, or whose template column is null fails alone: the batch's
answer is raised as :class:`~rowbatch.consumer.model.answer.RowsFailed`, and the engine writes
the other rows and dead-letters those. A request of several rows refused as a whole is sent
again one row per request (at most ``rows_per_request`` more requests), so only its bad rows
fail. Transient failures (429, 503, timeouts) are retried with backoff, pausing intake, as for
any server; a request failing for good (500, 401, 404, an answer that does not fit) fails its
rows as ``fatal``: the engine nacks their messages (redelivered) and writes the rest.

With ``api = "batch"`` each row is a request of the OpenAI Batch API file format: its ``body``
column (JSON text) is sent to its ``url`` column's path with ``model`` set to ``model.name``,
and the answer's JSON is the ``response`` output. A row whose url is not one of the three
paths, or whose body is not a JSON object (or asks to ``stream``), fails alone
(``invalid_request``), as does one the server refuses, and one that fails for good (a 500:
``server_error``, dead-lettered rather than nacked, so every request gets an outcome)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from rowbatch.consumer.model.answer import Answer, RowError, RowsFailed
from rowbatch.consumer.model.chunk_check import check_passthrough
from rowbatch.consumer.model.handler import BatchRows
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    PoisonInferenceError,
)
from rowbatch.consumer.model.mismatch import SchemaMismatch
from rowbatch.consumer.model.openai.errors import row_code
from rowbatch.consumer.model.openai.outputs import (
    RowValues,
    batch_values,
    choice_values,
    usage_of,
)
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.openai.template import PromptTemplate
from rowbatch.consumer.model.openai.token_rate import TokenRate, estimate_tokens
from rowbatch.consumer.model.spec import TensorSpec
from rowbatch.wire.chunks.decode import DecodedChunk
from rowbatch.wire.columns.column_type import ColumnType, Kind

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}
BATCH_COLUMNS = ("custom_id", "url", "body")
"""The columns of a row of ``api = "batch"`` (the OpenAI Batch API file format's fields;
``method`` is always POST)."""
BATCH_PATHS = frozenset(PATHS.values())


class OpenAIHandler:
    """A model behind OpenAI-compatible endpoints (see the module's docstring)."""

    def __init__(
        self,
        post: Callable[[str, dict[str, Any]], Any],
        settings: OpenAISettings,
        outputs: Sequence[TensorSpec],
        passthrough: Mapping[str, ColumnType],
        *,
        target_batch_size: int,
        clock: Callable[[], float],
        on_tokens: Callable[[int, int], None] = lambda _p, _c: None,
        token_rate: TokenRate | None = None,
    ) -> None:
        self._post = post
        self._settings = settings
        self._api = settings.api
        self._path = PATHS.get(settings.api, "")
        self._outputs = tuple(outputs)
        self._json_fields = tuple(t for t in outputs if t.name.startswith("json."))
        self._passthrough = dict(passthrough)
        self._prompt = PromptTemplate(settings.prompt or "")
        self._system = (
            PromptTemplate(settings.system_prompt) if settings.system_prompt is not None else None
        )
        self.columns = tuple(
            dict.fromkeys((*self._prompt.columns, *(self._system.columns if self._system else ())))
        )
        """The columns the templates name (``api = "batch"``: :data:`BATCH_COLUMNS`)."""
        if self._api == "batch":
            self.columns = BATCH_COLUMNS
        self._target = target_batch_size
        self._clock = clock
        self._on_tokens = on_tokens
        self._rate = token_rate
        self._per_request = settings.requests_rows
        self._body = self._base_body()

    @property
    def target_batch_size(self) -> int:
        return self._target

    @property
    def output_bytes_per_row(self) -> int:
        size = 64
        for t in self._outputs:
            if t.dims:
                size += 4 * t.dims[0]
            elif t.datatype == "BYTES":
                size += 4 * self._settings.max_tokens if t.name in ("text",) else 32
                if t.name == "response":  # the answer's JSON: the text and its envelope
                    size += 4 * self._settings.max_tokens + 1024
            else:
                size += 8
        return size

    def _base_body(self) -> dict[str, Any]:
        s = self._settings
        body: dict[str, Any] = {"model": s.name, **s.sampling}
        if self._api != "embeddings":
            body["max_tokens"] = s.max_tokens
            if s.temperature is not None:
                body["temperature"] = s.temperature
            if s.json_schema is not None:
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "row", "schema": s.json_schema},
                }
        return body

    def check(self, chunk: DecodedChunk) -> None:
        """The templates' columns are present and not vectors; passthrough columns have their
        configured type."""
        missing = [c for c in self.columns if c not in chunk.columns]
        if missing:
            raise SchemaMismatch(
                f"chunk of table {chunk.table!r} lacks column(s) {missing} that the prompt "
                f"template names; it has {sorted(chunk.columns)}",
                column=missing[0],
                expected="present",
                found="absent",
                code="missing_column",
            )
        for name in self.columns:
            got = chunk.types[name]
            if got.kind is Kind.VECTOR:
                raise SchemaMismatch(
                    f"column {name!r} is {got}; a prompt template takes text and scalars",
                    column=name,
                    expected="a scalar or text",
                    found=str(got),
                )
        check_passthrough(chunk, self._passthrough)

    async def run(self, batch: BatchRows) -> Answer:
        if self._api == "batch":
            return await self._run_requests(batch)
        rows = len(batch)
        failed: dict[int, RowError] = {}
        prompts = self._render(self._prompt, batch, failed)
        system = self._render(self._system, batch, failed) if self._system else None
        values = RowValues(self._outputs, rows)
        live = [r for r in range(rows) if r not in failed]
        groups = [live[i : i + self._per_request] for i in range(0, len(live), self._per_request)]
        await _all(self._group(group, prompts, system, values, failed) for group in groups)
        return _answer(values, failed)

    async def _run_requests(self, batch: BatchRows) -> Answer:
        """``api = "batch"``: each row's request as it is, all of them at once through the
        windows; a row refused (by us or by the server) fails alone."""
        rows = len(batch)
        failed: dict[int, RowError] = {}
        values = RowValues(self._outputs, rows)
        urls, bodies = (self._batch_texts(batch, name) for name in ("url", "body"))
        requests: list[tuple[int, str, dict[str, Any]]] = []
        for row in range(rows):
            request = self._batch_request(urls[row], bodies[row])
            if isinstance(request, RowError):
                failed[row] = request
            else:
                requests.append((row, *request))
        await _all(self._batch_row(row, path, body, values, failed) for row, path, body in requests)
        return _answer(values, failed)

    @staticmethod
    def _batch_texts(batch: BatchRows, name: str) -> list[str | None]:
        """Column ``name`` as text per row (None where null)."""
        null = batch.nulls.get(name)
        out: list[str | None] = []
        for i, value in enumerate(batch.columns[name].tolist()):
            if null is not None and null[i]:
                out.append(None)
            elif isinstance(value, bytes | bytearray):
                out.append(bytes(value).decode("utf-8", "replace"))
            else:
                out.append(str(value))
        return out

    def _batch_request(
        self, url: str | None, body_text: str | None
    ) -> tuple[str, dict[str, Any]] | RowError:
        """A row's path and body (``model`` set to ours), or why it is not a request."""
        if url is None or url not in BATCH_PATHS:
            return RowError(
                "invalid_request",
                f"url {url!r} is not one of {', '.join(sorted(BATCH_PATHS))}",
            )
        try:
            body = json.loads(body_text) if body_text is not None else None
        except ValueError as exc:
            return RowError("invalid_request", f"the body is not JSON: {exc}")
        if not isinstance(body, dict):
            return RowError("invalid_request", f"the body is {type(body).__name__}, not an object")
        if body.get("stream"):
            return RowError("invalid_request", "stream: a batch request is answered whole")
        body["model"] = self._settings.name
        return url, body

    async def _batch_row(
        self,
        row: int,
        path: str,
        body: dict[str, Any],
        values: RowValues,
        failed: dict[int, RowError],
    ) -> None:
        """One request of ``api = "batch"``, its answer into ``values`` (or ``failed``)."""
        estimate = 0
        if self._rate is not None:
            asked = body.get("max_tokens") or body.get("max_completion_tokens")
            max_out = 0 if path == PATHS["embeddings"] else self._settings.max_tokens
            if isinstance(asked, int) and max_out:
                max_out = asked
            estimate = estimate_tokens(len(json.dumps(body)), max_out)
            await self._rate.take(estimate)
        started = self._clock()
        try:
            answer: dict[str, Any] = await self._post(path, body)
        except PoisonInferenceError as exc:
            failed[row] = RowError(row_code(exc.message), exc.message)
            return
        except FatalInferenceError as exc:
            # Dead-lettered, not nacked: a batch request has an outcome, and table mode
            # redelivers a nacked row at once, forever (llama.cpp answers a malformed body
            # with a 500 every time).
            failed[row] = RowError("server_error", exc.message)
            return
        latency_ms = (self._clock() - started) * 1000.0
        prompt_tokens, completion_tokens = usage_of(answer)
        self._on_tokens(prompt_tokens, completion_tokens)
        if self._rate is not None:
            self._rate.settle(estimate, prompt_tokens + completion_tokens)
        got = batch_values(answer, model=self._settings.name, latency_ms=latency_ms)
        values.put(row, got)

    def _render(
        self, template: PromptTemplate | None, batch: BatchRows, failed: dict[int, RowError]
    ) -> list[str]:
        assert template is not None
        texts, nulls = template.render(batch.columns, batch.nulls, len(batch))
        for row, column in nulls.items():
            failed.setdefault(
                row,
                RowError("null_not_allowed", f"column {column!r} is null, and the prompt names it"),
            )
        return texts

    async def _group(
        self,
        rows: Sequence[int],
        prompts: Sequence[str],
        system: Sequence[str] | None,
        values: RowValues,
        failed: dict[int, RowError],
    ) -> None:
        """Answer ``rows`` in one request; when it is refused as poison, each row alone."""
        try:
            answer, latency_ms = await self._request(rows, prompts, system)
        except PoisonInferenceError as exc:
            if len(rows) == 1:
                failed[rows[0]] = RowError(row_code(exc.message), exc.message)
                return
            async with asyncio.TaskGroup() as tasks:
                for row in rows:
                    tasks.create_task(self._group([row], prompts, system, values, failed))
            return
        except FatalInferenceError as exc:
            _failed_for_good(rows, exc, failed)
            return
        try:
            self._fill(rows, answer, latency_ms, values, failed)
        except FatalInferenceError as exc:
            _failed_for_good(rows, exc, failed)

    async def _request(
        self, rows: Sequence[int], prompts: Sequence[str], system: Sequence[str] | None
    ) -> tuple[dict[str, Any], float]:
        body = dict(self._body)
        if self._api == "chat":
            row = rows[0]
            messages = [{"role": "user", "content": prompts[row]}]
            if system is not None:
                messages.insert(0, {"role": "system", "content": system[row]})
            body["messages"] = messages
            text_bytes = sum(len(m["content"]) for m in messages)
        else:
            texts = [prompts[r] for r in rows]
            body["prompt" if self._api == "completions" else "input"] = texts
            text_bytes = sum(len(t) for t in texts)
        estimate = 0
        if self._rate is not None:
            max_out = 0 if self._api == "embeddings" else self._settings.max_tokens
            estimate = estimate_tokens(text_bytes, max_out)
            await self._rate.take(estimate)
        started = self._clock()
        answer: dict[str, Any] = await self._post(self._path, body)
        latency_ms = (self._clock() - started) * 1000.0
        prompt_tokens, completion_tokens = usage_of(answer)
        self._on_tokens(prompt_tokens, completion_tokens)
        if self._rate is not None:
            self._rate.settle(estimate, prompt_tokens + completion_tokens)
        return answer, latency_ms

    def _fill(
        self,
        rows: Sequence[int],
        answer: Mapping[str, Any],
        latency_ms: float,
        values: RowValues,
        failed: dict[int, RowError],
    ) -> None:
        items = answer.get("data" if self._api == "embeddings" else "choices")
        if not isinstance(items, list) or len(items) < len(rows):
            raise FatalInferenceError(
                f"model {self._settings.name!r}: the answer holds "
                f"{len(items) if isinstance(items, list) else 'no'} result(s) for {len(rows)} "
                "row(s)",
                model=self._settings.name,
                status="BAD_ANSWER",
            )
        ordered = sorted(items, key=lambda item: int(item.get("index", 0)))
        prompt_tokens, completion_tokens = usage_of(answer)
        common = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "model": str(answer.get("model") or self._settings.name),
            "latency_ms": latency_ms,
        }
        for row, item in zip(rows, ordered, strict=False):
            if self._api == "embeddings":
                values.put(row, {**common, "embedding": self._vector(item.get("embedding"))})
                continue
            got = choice_values(item, chat=self._api == "chat", json_fields=self._json_fields)
            if isinstance(got, RowError):
                failed[row] = got
            else:
                values.put(row, {**common, **got})

    def _vector(self, value: Any) -> Any:
        dim = self._outputs[0].dims[0]
        if not isinstance(value, list) or len(value) != dim:
            raise FatalInferenceError(
                f"model {self._settings.name!r}: an embedding of "
                f"{len(value) if isinstance(value, list) else type(value).__name__} values, "
                f"where start-up found {dim} (base64 encoding is not read: leave "
                "encoding_format out of model.sampling)",
                model=self._settings.name,
                status="BAD_ANSWER",
            )
        return value

    def is_poison(self, exc: BaseException) -> bool:
        return isinstance(exc, PoisonInferenceError)

    def is_fatal(self, exc: BaseException) -> bool:
        return isinstance(exc, FatalInferenceError)


def _failed_for_good(
    rows: Sequence[int], error: FatalInferenceError, failed: dict[int, RowError]
) -> None:
    """The rows of a request that failed for good (their messages are nacked, the batch's
    other rows written): no bisection, whose re-requests would cost generations."""
    for row in rows:
        failed[row] = RowError("server_error", error.message, fatal=True)


async def _all(requests: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``requests`` at once (each through a window); the first to raise cancels the rest
    and its error is raised (not a group)."""
    try:
        async with asyncio.TaskGroup() as tasks:
            for request in requests:
                tasks.create_task(request)
    except BaseExceptionGroup as group_error:
        raise _first(group_error) from None


def _answer(values: RowValues, failed: Mapping[int, RowError]) -> Answer:
    """The batch's answer, raised as :class:`RowsFailed` when some rows failed."""
    answer = Answer(values.columns)
    if failed:
        raise RowsFailed(answer, failed)
    return answer


def _first(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first failure of a task group (the others were cancelled by it)."""
    first = group.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first
