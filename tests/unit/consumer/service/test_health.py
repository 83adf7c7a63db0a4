from __future__ import annotations

import asyncio
import contextlib

from rowbatch.consumer.observe.metrics import Metrics
from rowbatch.consumer.service.health import HealthServer


async def get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=5)
    writer.close()
    await writer.wait_closed()
    head, _, body = data.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


async def test_endpoints() -> None:
    metrics = Metrics()
    metrics.rows_written.inc(7)
    ready = False
    server = HealthServer(metrics.registry, lambda: ready, "127.0.0.1", 0)
    await server.start()
    try:
        assert await get(server.port, "/healthz") == (200, "ok\n")
        assert (await get(server.port, "/readyz"))[0] == 503
        ready = True
        assert (await get(server.port, "/readyz"))[0] == 200
        status, body = await get(server.port, "/metrics")
        assert status == 200
        assert "rowbatch_rows_written_total 7.0" in body
        assert (await get(server.port, "/nope"))[0] == 404
    finally:
        await server.close()


async def test_close_closes_a_connection_still_waiting_for_its_request() -> None:
    server = HealthServer(Metrics().registry, lambda: True, "127.0.0.1", 0)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"GET /metrics HTTP/1.1\r\n")  # no blank line: the server waits for more
        await writer.drain()
        for _ in range(100):  # the server's side accepted it (a bounded number of loop turns)
            if server.connections:
                break
            await asyncio.sleep(0)
        assert server.connections == 1
        await server.close()
        # The server's side is closed by close(), not left to the event loop's end (where it
        # leaked as an unclosed transport); the client sees the end of the stream or a reset.
        assert server.connections == 0
        with contextlib.suppress(ConnectionResetError):
            assert await asyncio.wait_for(reader.read(), timeout=5) == b""
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
