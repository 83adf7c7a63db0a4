"""The OpenAI-compatible endpoints as one pool: each request goes to the endpoint with a free
place in its :class:`~rowbatch.consumer.model.window.Window` and the fewest requests in
flight (waiting while every window is full), over one HTTP/1.1 connection pool per endpoint
(``aiohttp``), with the API key and TLS as configured. Answers are classified by
:mod:`rowbatch.consumer.model.openai.errors`; the retries are the caller's
(:class:`~rowbatch.consumer.model.inference.retry.RetryingInferencer`). While ``adapt`` is on,
one task per endpoint reads the server's queue from its metrics and moves the window."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import orjson

from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    RetryableInferenceError,
)
from rowbatch.consumer.model.openai.errors import OVERLOADED, classify_status
from rowbatch.consumer.model.openai.server_queue import read_queue
from rowbatch.consumer.model.openai.settings import OpenAISettings
from rowbatch.consumer.model.window import Window
from rowbatch.consumer.observe.metrics import EndpointMetrics
from rowbatch.timing import SYSTEM_CLOCKS, Clocks

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HttpAnswer:
    """What a server answered: the status, the body, its ``Retry-After``."""

    status: int
    body: bytes
    retry_after: str | None = None


class HttpTimeout(Exception):
    """No answer within the deadline."""


class HttpUnreachable(Exception):
    """The connection failed (refused, reset, closed mid-answer)."""


class HttpUntrusted(Exception):
    """The server's TLS certificate does not verify: a setting to mend (``model.tls_ca_file``,
    the URL's host), not an outage to wait out."""

    def __init__(self, url: str, detail: str) -> None:
        super().__init__(
            f"{url}: the server's TLS certificate is not trusted ({detail}): set "
            "model.tls_ca_file to the CA that signed it, or reach the server by a name its "
            "certificate holds"
        )


class HttpSession(Protocol):
    """HTTP/1.1 to one server (:class:`AiohttpSession`; tests pass fakes)."""

    async def post(self, path: str, body: bytes) -> HttpAnswer: ...

    async def get(self, path: str, timeout_s: float | None = None) -> HttpAnswer: ...

    async def close(self) -> None: ...


class AiohttpSession:
    """:class:`HttpSession` over an ``aiohttp`` connection pool sized to the window's ceiling,
    with the API key and TLS (aiohttp costs ~0.1 ms of CPU a request where httpx's pool cost
    2-5 ms at these concurrencies: unrecorded, measured while building this)."""

    def __init__(self, settings: OpenAISettings, base: str) -> None:
        headers = {"Content-Type": "application/json"}
        key = settings.key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        verify: ssl.SSLContext | bool = True
        if settings.tls_ca_file is not None:
            verify = ssl.create_default_context(cafile=str(settings.tls_ca_file))
        self._base = base
        self._headers = headers
        self._connector_args = {"limit": settings.window_ceiling + 2, "ssl": verify}
        self._timeout = aiohttp.ClientTimeout(
            total=settings.timeout_s, connect=min(10.0, settings.timeout_s)
        )
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Made on first use, inside the running loop (aiohttp binds a session to it).
        if self._session is None:
            self._session = aiohttp.ClientSession(
                base_url=self._base,
                headers=self._headers,
                connector=aiohttp.TCPConnector(**self._connector_args),  # type: ignore[arg-type]
                timeout=self._timeout,
            )
        return self._session

    async def _call(
        self, method: str, path: str, body: bytes | None, timeout_s: float | None
    ) -> HttpAnswer:
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s is not None else None
        try:
            async with self._open().request(
                method, path, data=body, timeout=timeout or self._timeout
            ) as response:
                return HttpAnswer(
                    response.status, await response.read(), response.headers.get("Retry-After")
                )
        except TimeoutError as exc:
            raise HttpTimeout(f"{type(exc).__name__}") from exc
        except aiohttp.ClientConnectorCertificateError as exc:
            raise HttpUntrusted(self._base, str(exc.certificate_error)) from exc
        except aiohttp.ClientError as exc:
            raise HttpUnreachable(f"{type(exc).__name__}: {exc}") from exc

    async def post(self, path: str, body: bytes) -> HttpAnswer:
        return await self._call("POST", path, body, None)

    async def get(self, path: str, timeout_s: float | None = None) -> HttpAnswer:
        return await self._call("GET", path, None, timeout_s)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


@dataclass
class Endpoint:
    """One server: its base URL, HTTP session, window and series."""

    url: str
    http: HttpSession
    window: Window
    meter: EndpointMetrics | None


class EndpointPool:
    """The endpoints of one model; :meth:`post` sends one request through a window."""

    def __init__(
        self,
        settings: OpenAISettings,
        *,
        meter: Callable[[str], EndpointMetrics] | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        transport: Callable[[str], HttpSession] | None = None,
    ) -> None:
        self._settings = settings
        self._clocks = clocks
        self._waiting: deque[asyncio.Future[None]] = deque()
        make = transport or (lambda base: AiohttpSession(settings, base))
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

    @property
    def saturated(self) -> bool:
        """Every server's queue stands at its target (from its metrics, with ``adapt``)."""
        return all(ep.window.saturated for ep in self.endpoints)

    def _wake(self) -> None:
        """Places freed or grew: wake as many waiting requests, first come first served (not
        all of them: hundreds of requests may wait on a full window)."""
        room = sum(ep.window.free for ep in self.endpoints)
        while room > 0 and self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1

    async def _acquire(self) -> Endpoint:
        if self._waiting:  # others wait for a place already: behind them
            await self._queue_up()
        while True:
            chosen: Endpoint | None = None
            for ep in self.endpoints:
                if ep.window.free > 0 and (
                    chosen is None or ep.window.in_use < chosen.window.in_use
                ):
                    chosen = ep
            if chosen is not None:
                chosen.window.take()
                if chosen.meter is not None:
                    chosen.meter.in_flight(chosen.window.in_use)
                return chosen
            await self._queue_up()

    async def _queue_up(self) -> None:
        """Wait to be woken by :meth:`_wake` (a place freed)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake()  # pass on the place it was woken for
            raise

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
                response = await endpoint.http.post(path, orjson.dumps(body))
            except HttpTimeout as exc:
                if endpoint.meter is not None:
                    endpoint.meter.failed("deadline-exceeded")
                raise RetryableInferenceError(
                    f"model {model!r} at {endpoint.url}: no answer within "
                    f"{self._settings.timeout_s} s ({exc})",
                    model=model,
                    status="DEADLINE_EXCEEDED",
                ) from exc
            except HttpUntrusted as exc:
                raise FatalInferenceError(
                    f"model {model!r}: {exc}", model=model, status="TLS"
                ) from exc
            except HttpUnreachable as exc:
                if endpoint.meter is not None:
                    endpoint.meter.failed("connection")
                raise RetryableInferenceError(
                    f"model {model!r} at {endpoint.url}: connection failed ({exc})",
                    model=model,
                    status="CONNECTION",
                ) from exc
            if response.status >= 300:
                if response.status in OVERLOADED:
                    endpoint.window.overloaded(self._clocks.monotonic())
                error = classify_status(
                    response.status,
                    response.body,
                    model=model,
                    url=f"{endpoint.url}{path}",
                    retry_after=response.retry_after,
                )
                if endpoint.meter is not None:
                    endpoint.meter.failed("http")
                raise error
            try:
                answer = orjson.loads(response.body)
            except orjson.JSONDecodeError as exc:
                raise FatalInferenceError(
                    f"model {model!r} at {endpoint.url}{path}: the answer is not JSON: "
                    f"{response.body[:200]!r}",
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
                response = await endpoint.http.get(settings.metrics_path, 5.0)
            except (HttpTimeout, HttpUnreachable) as exc:
                failures += 1
                if failures == 3:
                    log.warning("cannot read %s%s: %s", endpoint.url, settings.metrics_path, exc)
                continue
            failures = 0
            reading = None
            if response.status == 200:
                reading = read_queue(response.body.decode("utf-8", "replace"), settings.name)
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
            if endpoint.meter is not None:
                endpoint.meter.saturated(endpoint.window.saturated)

    async def close(self) -> None:
        for task in self._watches:
            task.cancel()
        for task in self._watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for endpoint in self.endpoints:
            await endpoint.http.close()
