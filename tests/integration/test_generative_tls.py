"""The API key and TLS of ``[model] kind = "openai"`` against a real OpenAI-compatible server:
llama-cpp-python (harness/llama.py) started by this module with an API key and HTTPS only (a
certificate for ``127.0.0.1`` from a test CA, tests/integration/test_model_tls.py's
:func:`make_pki`). The server is checked to refuse a request without the key and to speak no
plain HTTP, so the consumer's success proves it sent the key and verified the certificate.

- The consumer, from Kafka, with ``url = "https://..."``, ``api_key_file`` and
  ``tls_ca_file`` writes every row of a few chat messages into SQLite, with the answers the
  server gives when asked directly.
- A wrong key stops start-up at once, naming ``model.api_key``.
- A client that trusts the system's CAs (no ``tls_ca_file``), or an unrelated CA, does not
  start, at once (a certificate that does not verify is a setting to mend, not an outage to
  wait out for ``model.startup_wait_s``): the error names the URL, the certificate failure and
  ``model.tls_ca_file``.
"""

from __future__ import annotations

import asyncio
import sqlite3
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from harness.llama import LlamaEndpoint, LlamaService, LlamaTls
from harness.service import RunDir
from rowbatch.consumer.model.inference.errors import FatalInferenceError
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import run_consumer
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import wait_until
from tests.integration.test_consumer import Broker, Run, broker, consumers, records, start
from tests.integration.test_consumer_pubsub import dead_lettered, settled
from tests.integration.test_model_tls import Pki, make_pki

__all__ = ["broker", "consumers"]  # fixtures used here

pytestmark = pytest.mark.timeout(900)  # the first start may wait for the llama venv's build
kafka_only = pytest.mark.parametrize("broker", ["kafka"], indirect=True)

API_KEY = "rowbatch-test-key-7f3a"
ROWS = 10
MESSAGES = 3
PROMPT = "Say something about {topic}."
MAX_TOKENS = 6


@dataclass(frozen=True)
class Secured:
    """The server with key and TLS, and the files a client configures."""

    endpoint: LlamaEndpoint
    pki: Pki
    other: Pki  # an unrelated CA
    key_file: Path  # holds API_KEY (with a trailing newline, as a mounted secret may)
    wrong_key_file: Path


@pytest.fixture(scope="module")
def secured(run_dir: RunDir, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """llama-cpp-python asking for API_KEY, over HTTPS only; stopped at the module's end."""
    certs = tmp_path_factory.mktemp("llama-pki")
    pki, other = make_pki(certs / "good", "good"), make_pki(certs / "other", "other")
    key_file, wrong_key_file = certs / "api-key", certs / "wrong-api-key"
    key_file.write_text(API_KEY + "\n")
    wrong_key_file.write_text("not-the-key\n")
    tls = LlamaTls(pki.server_cert, pki.server_key, pki.ca_cert)
    with LlamaService(run_dir, name="llama-tls", api_key=API_KEY, tls=tls) as endpoint:
        assert endpoint.url.startswith("https://127.0.0.1:")
        yield Secured(endpoint, pki, other, key_file, wrong_key_file)


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def chunk(n: int) -> EncodedChunk:
    topics = [f"topic {n}-{r} é" for r in range(ROWS)]
    ids = np.arange(n * 100, n * 100 + ROWS, dtype=np.int64)
    return encode_chunk("docs", {"id": ids, "topic": topics}, "arrow" if n % 2 else "json", f"s{n}")


def config(broker: Broker, secured: Secured, sink: Path, **model: Any) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": broker.source(),
            "model": {
                "kind": "openai",
                "url": secured.endpoint.url,
                "name": secured.endpoint.chat_model,
                "prompt": PROMPT,
                "max_tokens": MAX_TOKENS,
                "max_in_flight": 4,
                "max_wait_ms": 50,
                "startup_wait_s": 60,
                **model,
            },
            "binding": {
                "outputs": {
                    "text": "answer",
                    "finish_reason": "finish_reason",
                    "completion_tokens": "completion_tokens",
                },
                "passthrough": {"id": "int64"},
            },
            "sink": {"kind": "sqlite", "path": str(sink), "table": "chat"},
            "server": {"port": 0},
            "log_format": "text",
        }
    )


def direct_chat(secured: Secured, text: str) -> str:
    """What the server answers for ``text`` asked directly (with the key, temperature 0)."""
    answer = httpx.post(
        f"{secured.endpoint.url}/v1/chat/completions",
        json={
            "model": secured.endpoint.chat_model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": MAX_TOKENS,
            "temperature": 0.0,
        },
        headers=secured.endpoint.headers(),
        verify=trusting(secured.pki.ca_cert),
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["choices"][0]["message"]["content"])


async def failed_start(cfg: ConsumerConfig, within_s: float) -> tuple[BaseException, float]:
    """What ``run_consumer`` fails with, and after how many seconds."""
    started = time.monotonic()
    with pytest.raises(Exception) as caught:  # the type: checked by the caller
        await asyncio.wait_for(run_consumer(cfg, asyncio.Event()), within_s)
    took = time.monotonic() - started
    print(f"\n{type(caught.value).__name__} after {took:.1f} s: {caught.value}")
    return caught.value, took


def test_the_server_asks_for_the_key_over_https_only(secured: Secured) -> None:
    """What the tests below rely on: without the key 401, with it 200; plain HTTP and a
    client trusting another CA get no answer."""
    url = secured.endpoint.url
    verify = trusting(secured.pki.ca_cert)
    refused = httpx.get(f"{url}/v1/models", verify=verify, timeout=30)
    assert refused.status_code == 401, refused.text
    assert refused.json() == {"detail": "Invalid API key"}
    wrong = httpx.get(
        f"{url}/v1/models", headers={"Authorization": "Bearer nope"}, verify=verify, timeout=30
    )
    assert wrong.status_code == 401, wrong.text
    ok = httpx.get(f"{url}/v1/models", headers=secured.endpoint.headers(), verify=verify)
    assert ok.status_code == 200, ok.text
    with pytest.raises(httpx.TransportError):
        httpx.get(url.replace("https://", "http://") + "/v1/models", timeout=30)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{url}/v1/models", verify=trusting(secured.other.ca_cert), timeout=30)


@kafka_only
async def test_chat_rows_over_https_with_the_api_key_into_sqlite(
    broker: Broker, secured: Secured, consumers: list[Run], tmp_path: Path
) -> None:
    """``url = "https://..."``, ``api_key_file`` and ``tls_ca_file``: every row of the
    messages written once, with the text the server answers directly."""
    await broker.prepare(partitions=2)
    await broker.publish(records([chunk(n) for n in range(MESSAGES)]))
    sink = tmp_path / "chat.sqlite"
    cfg = config(
        broker,
        secured,
        sink,
        api_key_file=str(secured.key_file),
        tls_ca_file=str(secured.pki.ca_cert),
    )
    run = await start(consumers, cfg)
    registry = run.registry
    await wait_until(lambda: settled(registry) == MESSAGES, 180, "all settled", run.task)
    await broker.drained(registry, None)
    await run.stop_and_wait()

    assert dead_lettered(registry) == {}
    assert registry.get_sample_value("rowbatch_rows_written_total") == MESSAGES * ROWS
    with sqlite3.connect(sink) as conn:
        rows = conn.execute(
            "SELECT id, answer, finish_reason, completion_tokens FROM chat ORDER BY id"
        ).fetchall()
    assert [r[0] for r in rows] == [n * 100 + r for n in range(MESSAGES) for r in range(ROWS)]
    for _, answer, finish, tokens in rows:
        assert isinstance(answer, str)
        assert finish in ("length", "stop")
        assert 0 < tokens <= MAX_TOKENS
    answers = {r[0]: r[1] for r in rows}
    assert answers[0] == direct_chat(secured, PROMPT.format(topic="topic 0-0 é"))
    assert answers[209] == direct_chat(secured, PROMPT.format(topic="topic 2-9 é"))


@kafka_only
async def test_a_wrong_api_key_stops_start_up_naming_the_setting(
    broker: Broker, secured: Secured, tmp_path: Path
) -> None:
    """The server's 401 is fatal at start-up (not waited out): the error names the URL, the
    status and ``model.api_key``."""
    await broker.prepare(partitions=1)
    cfg = config(
        broker,
        secured,
        tmp_path / "never.sqlite",
        api_key_file=str(secured.wrong_key_file),
        tls_ca_file=str(secured.pki.ca_cert),
    )
    error, took = await failed_start(cfg, 60)
    assert isinstance(error, FatalInferenceError), repr(error)
    message = str(error)
    assert f"{secured.endpoint.url}/v1/models: HTTP 401" in message
    assert "Invalid API key" in message  # the server's words
    assert "model.api_key / model.api_key_file" in message
    assert took < 30


@kafka_only
@pytest.mark.parametrize("trust", ["system", "other-ca"])
async def test_an_untrusted_certificate_stops_start_up_naming_it(
    broker: Broker, secured: Secured, tmp_path: Path, trust: str
) -> None:
    """Without ``tls_ca_file`` (the system's CAs) or with an unrelated CA, start-up fails at
    once (``startup_wait_s`` is the default's minutes) with the URL, the certificate
    verification failure and the setting to mend."""
    await broker.prepare(partitions=1)
    ca = {} if trust == "system" else {"tls_ca_file": str(secured.other.ca_cert)}
    cfg = config(
        broker,
        secured,
        tmp_path / "never.sqlite",
        api_key_file=str(secured.key_file),
        startup_wait_s=300,
        **ca,
    )
    error, took = await failed_start(cfg, 60)
    message = str(error)
    assert secured.endpoint.url in message
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert "model.tls_ca_file" in message
    assert took < 10  # not waited out as an outage
