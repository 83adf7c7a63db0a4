"""``/metrics`` (Prometheus text), ``/healthz`` (the event loop answers) and ``/readyz`` (the
consumer is connected and consuming) on one small asyncio HTTP server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

_MAX_REQUEST_LINE = 8192
_CLOSE_WAIT_S = 2.0


class HealthServer:
    def __init__(
        self, registry: CollectorRegistry, ready: Callable[[], bool], host: str, port: int
    ) -> None:
        self._registry = registry
        self._ready = ready
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._open: dict[asyncio.StreamWriter, asyncio.Task[object] | None] = {}

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        if self._server is None:
            return self._port
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._handle, self._host, self._port)
        except OSError as exc:
            raise OSError(
                f"cannot listen on {self._host}:{self._port} for /metrics (server.port): {exc}"
            ) from exc
        log.info("serving /metrics, /healthz, /readyz on http://%s:%d", self._host, self.port)

    @property
    def connections(self) -> int:
        """Connections accepted and not yet closed."""
        return len(self._open)

    async def close(self) -> None:
        """Stop listening and close the connections still open (a scraper that connected and
        has not sent its request yet): closing the server alone leaves them to the event loop's
        end, where their sockets leak."""
        if self._server is not None:
            self._server.close()
            for writer in self._open:
                writer.close()  # its handler reads the end of the stream and returns
            handlers = {task for task in self._open.values() if task is not None}
            if handlers:
                await asyncio.wait(handlers, timeout=_CLOSE_WAIT_S)
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open[writer] = asyncio.current_task()
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=10)
            while (await asyncio.wait_for(reader.readline(), timeout=10)) not in (b"\r\n", b""):
                pass  # headers are not needed
            parts = line[:_MAX_REQUEST_LINE].decode("latin-1").split()
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            status, ctype, body = self._route(path)
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode("latin-1") + body)
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            self._open.pop(writer, None)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _route(self, path: str) -> tuple[str, str, bytes]:
        text = "text/plain; charset=utf-8"
        if path == "/metrics":
            return "200 OK", CONTENT_TYPE_LATEST, generate_latest(self._registry)
        if path == "/healthz":
            return "200 OK", text, b"ok\n"
        if path == "/readyz":
            if self._ready():
                return "200 OK", text, b"ready\n"
            return "503 Service Unavailable", text, b"not ready\n"
        return "404 Not Found", text, b"not found\n"
