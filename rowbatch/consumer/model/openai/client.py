"""The OpenAI-compatible endpoints as one pool: each request goes to the endpoint with a free
place in its :class:`~rowbatch.consumer.model.openai.window.Window` and the fewest requests in
flight (waiting while every window is full), over one HTTP/1.1 connection pool per endpoint
(``httpx``), with the API key and TLS as configured. Answers are classified by
:mod:`rowbatch.consumer.model.openai.errors`; the retries are the caller's
(:class:`~rowbatch.consumer.model.inference.retry.RetryingInferencer`). While ``adapt`` is on,
one task per endpoint reads the server's queue from its metrics and moves the window."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.openai.errors import OVERLOADED, classify_status
from rowbatch.consumer.model.openai.server_queue import read_queue
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.openai.window import Window
from rowbatch.consumer.observe.metrics import EndpointMetrics
from rowbatch.timing import SYSTEM_CLOCKS, Clocks

log = logging.getLogger(__name__)


@dataclass
class Endpoint:
    """One server: its base URL, connection pool, window and series."""

    url: str
    http: httpx.AsyncClient
    window: Window
    meter: EndpointMetrics | None


def http_client(settings: OpenAISettings, base: str) -> httpx.AsyncClient:
    """A connection pool to ``base`` sized to the window's ceiling, with the key and TLS."""
    headers = {"Content-Type": "application/json"}
    key = settings.key()
    if key:
        headers["Authorization"] = f"Bearer {key}"
    verify: ssl.SSLContext | bool = True
    if settings.tls_ca_file is not None:
        verify = ssl.create_default_context(cafile=str(settings.tls_ca_file))
    ceiling = settings.window_ceiling
    return httpx.AsyncClient(
        base_url=base,
        headers=headers,
        verify=verify,
        timeout=httpx.Timeout(settings.timeout_s, connect=min(10.0, settings.timeout_s)),
        limits=httpx.Limits(max_connections=ceiling + 2, max_keepalive_connections=ceiling + 2),
    )


class EndpointPool:
    """The endpoints of one model; :meth:`post` sends one request through a window."""

    def __init__(
        self,
        settings: OpenAISettings,
        *,
        meter: Callable[[str], EndpointMetrics] | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        transport: Callable[[str], httpx.AsyncClient] | None = None,
    ) -> None:
        self._settings = settings
        self._clocks = clocks
        self._room = asyncio.Event()
        make = transport or (lambda base: http_client(settings, base))
        self.endpoints: list[Endpoint] = []
        for url in settings.url:
            series = meter(url) if meter is not None else None
            window = Window(
                settings.max_in_flight,
                settings.window_ceiling,
                on_change=series.window if series is not None else lambda _: None,
                on_room=self._wake,
            )
            if series is not None:
                series.healthy(True)
            self.endpoints.append(Endpoint(url, make(url), window, series))
        self._watches: list[asyncio.Task[None]] = []

    @property
    def capacity(self) -> int:
        """Requests the windows allow in flight at their ceiling, over every endpoint."""
        return self._settings.window_ceiling * len(self.endpoints)

    def _wake(self) -> None:
        self._room.set()
        self._room = asyncio.Event()

    async def _acquire(self) -> Endpoint:
        while True:
            free = [ep for ep in self.endpoints if ep.window.free > 0]
            if free:
                chosen = min(free, key=lambda ep: ep.window.in_use)
                chosen.window.take()
                if chosen.meter is not None:
                    chosen.meter.in_flight(chosen.window.in_use)
                return chosen
            await self._room.wait()

    def _release(self, endpoint: Endpoint) -> None:
        endpoint.window.give()
        if endpoint.meter is not None:
            endpoint.meter.in_flight(endpoint.window.in_use)

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The JSON answer of one request to the next endpoint with room; raises a classified
        :class:`~rowbatch.consumer.model.inference.errors.InferenceError`."""
        endpoint = await self._acquire()
        model = self._settings.name
        try:
            if endpoint.meter is not None:
                endpoint.meter.sent()
            try:
                response = await endpoint.http.post(path, content=orjson.dumps(body))
            except httpx.TimeoutException as exc:
                raise RetryableInferenceError(
                    f"model {model!r} at {endpoint.url}: no answer within "
                    f"{self._settings.timeout_s} s ({type(exc).__name__})",
                    model=model,
                    status="DEADLINE_EXCEEDED",
                ) from exc
            except httpx.TransportError as exc:
                raise RetryableInferenceError(
                    f"model {model!r} at {endpoint.url}: connection failed "
                    f"({type(exc).__name__}): {exc}",
                    model=model,
                    status=type(exc).__name__,
                ) from exc
            if response.status_code >= 300:
                if response.status_code in OVERLOADED:
                    endpoint.window.overloaded(self._clocks.monotonic())
                error = classify_status(
                    response.status_code,
                    response.content,
                    model=model,
                    url=f"{endpoint.url}{path}",
                    retry_after=response.headers.get("retry-after"),
                )
                if endpoint.meter is not None:
                    endpoint.meter.failed("http")
                raise error
            try:
                answer = orjson.loads(response.content)
            except orjson.JSONDecodeError as exc:
                raise FatalInferenceError(
                    f"model {model!r} at {endpoint.url}{path}: the answer is not JSON: "
                    f"{response.content[:200]!r}",
                    model=model,
                    status="BAD_ANSWER",
                ) from exc
            if not isinstance(answer, dict):
                raise FatalInferenceError(
                    f"model {model!r} at {endpoint.url}{path}: the answer is not a JSON object",
                    model=model,
                    status="BAD_ANSWER",
                )
            endpoint.window.answered()
            return answer
        finally:
            self._release(endpoint)

    def start_watching(self) -> None:
        """With ``adapt``: read each server's queue every ``adapt_interval_s``."""
        if self._settings.adapt and not self._watches:
            self._watches = [asyncio.ensure_future(self._watch(ep)) for ep in self.endpoints]

    async def _watch(self, endpoint: Endpoint) -> None:
        settings = self._settings
        failures = 0
        while True:
            await self._clocks.sleep(settings.adapt_interval_s)
            try:
                response = await endpoint.http.get(settings.metrics_path, timeout=5.0)
            except httpx.HTTPError as exc:
                failures += 1
                if failures == 3:
                    log.warning("cannot read %s%s: %s", endpoint.url, settings.metrics_path, exc)
                continue
            failures = 0
            reading = None
            if response.status_code == 200:
                reading = read_queue(response.text, settings.name)
            if reading is None:
                log.info(
                    "%s%s has no queue metrics this consumer knows (vllm:num_requests_waiting, "
                    "sglang:num_queue_reqs, llamacpp:requests_deferred): its window stays at "
                    "%d, moved only by 429/503",
                    endpoint.url,
                    settings.metrics_path,
                    settings.max_in_flight,
                )
                return
            if endpoint.meter is not None:
                endpoint.meter.server_waiting(reading.waiting)
            endpoint.window.server_queue(reading.waiting, reading.running, self._clocks.monotonic())

    async def get(self, path: str) -> tuple[int, bytes]:
        """A GET to the first endpoint (start-up checks): its status and body."""
        response = await self.endpoints[0].http.get(path)
        return response.status_code, response.content

    async def close(self) -> None:
        for task in self._watches:
            task.cancel()
        for task in self._watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for endpoint in self.endpoints:
            await endpoint.http.aclose()
