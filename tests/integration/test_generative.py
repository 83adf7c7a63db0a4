"""Generative models end to end on a real OpenAI-compatible server (llama-cpp-python on a tiny
local model, harness/llama.py): chat rows through both brokers into PostgreSQL, a prompt over the
server's context dead-lettered as a row part of its message (its siblings written once), text
completions and embeddings into Parquet and PostgreSQL, and a table run from a JSON Lines file.
The server answers one request at a time, so these check correctness, not the window
(bench/generative.py measures that on the fixed-step server)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psycopg
import pyarrow.dataset as ds
import pytest

from harness.llama import LlamaEndpoint
from harness.postgres import PostgresEndpoint
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.runner import Running, run_consumer
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.consumer_helpers import wait_until
from tests.integration.test_consumer import Broker, Run, broker, consumers, records, start
from tests.integration.test_consumer_pubsub import dead_lettered, settled

__all__ = ["broker", "consumers"]  # fixtures used here

ROWS = 12
MESSAGES = 4
LONG_ROW = (2, 5)  # (message, row) whose prompt overflows the server's context
PROMPT = "Say something about {topic}."


def chunk(n: int) -> EncodedChunk:
    topics = [f"topic {n}-{r} é" for r in range(ROWS)]
    if n == LONG_ROW[0]:
        topics[LONG_ROW[1]] = "very long " * 200  # ~2,000 tokens, over n_ctx
    ids = np.arange(n * 100, n * 100 + ROWS, dtype=np.int64)
    return encode_chunk("docs", {"id": ids, "topic": topics}, "arrow" if n % 2 else "json", f"g{n}")


def model_section(llama: LlamaEndpoint, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "openai",
        "url": llama.url,
        "name": llama.chat_model,
        "prompt": PROMPT,
        "max_tokens": 6,
        "max_in_flight": 4,
        "max_wait_ms": 50,
        "startup_wait_s": 60,
        **extra,
    }


def config(
    broker: Broker, llama: LlamaEndpoint, sink: dict[str, Any], **model: Any
) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": broker.source(),
            "model": model_section(llama, **model),
            "binding": {
                "outputs": {
                    "text": "answer",
                    "finish_reason": "finish_reason",
                    "prompt_tokens": "prompt_tokens",
                    "completion_tokens": "completion_tokens",
                },
                "passthrough": {"id": "int64"},
            },
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
        }
    )


def direct_chat(llama: LlamaEndpoint, text: str) -> str:
    """What the server answers for ``text`` asked directly (temperature 0)."""
    answer = httpx.post(
        f"{llama.url}/v1/chat/completions",
        json={
            "model": llama.chat_model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 6,
            "temperature": 0.0,
        },
        timeout=60,
    ).json()
    return str(answer["choices"][0]["message"]["content"])


@pytest.mark.timeout(900)  # the first test may wait for the llama venv build
async def test_chat_rows_into_postgresql_and_a_prompt_too_long_costs_its_row(
    broker: Broker, llama: LlamaEndpoint, consumers: list[Run], postgres: PostgresEndpoint
) -> None:
    """Chat completions, one row per request, into PostgreSQL: every row written once with its
    text, finish reason and token counts, the same text the server gives when asked directly;
    the one prompt over the server's context is dead-lettered alone as a row part
    (rejected-by-model, ``prompt_too_long``, the server's words), no message whole."""
    await broker.prepare(partitions=2)
    table = f"chat_{broker.name}_{int(time.time() * 1000)}"
    sink = {"kind": "postgres", "dsn": postgres.dsn, "table": table}
    chunks = [chunk(n) for n in range(MESSAGES)]
    await broker.publish(records(chunks))
    run = await start(consumers, config(broker, llama, sink))
    registry = run.registry
    await wait_until(lambda: settled(registry) == MESSAGES, 180, "all settled", run.task)
    await broker.drained(registry, None)
    await run.stop_and_wait()

    assert dead_lettered(registry) == {}
    assert (
        registry.get_sample_value(
            "rowbatch_rows_dead_lettered_total", {"reason": "rejected-by-model"}
        )
        == 1
    )
    assert (
        registry.get_sample_value("rowbatch_model_tokens_total", {"kind": "completion"}) or 0
    ) > 0
    letters = await broker.dead_letters(expect=1)
    letter = letters[0]
    assert letter.text("rowbatch-parent-chunk-id") == f"g{LONG_ROW[0]}"
    assert letter.text("rowbatch-parent-rows") == str(LONG_ROW[1])
    assert letter.text("rowbatch-dlq-reason") == "rejected-by-model"
    assert letter.text("rowbatch-dlq-code") == "prompt_too_long"
    assert "context" in letter.text("rowbatch-dlq-message")
    part = decode_chunk(letter.payload, {k: v.decode() for k, v in letter.headers.items()})
    assert part.columns["id"].tolist() == [LONG_ROW[0] * 100 + LONG_ROW[1]]

    with psycopg.connect(postgres.dsn) as conn:
        rows = conn.execute(
            f"SELECT id, answer, finish_reason, prompt_tokens, completion_tokens, chunk_id, "
            f"row_index FROM {table} ORDER BY id"
        ).fetchall()
    want = {n * 100 + r for n in range(MESSAGES) for r in range(ROWS)}
    want.discard(LONG_ROW[0] * 100 + LONG_ROW[1])
    assert [r[0] for r in rows] == sorted(want)  # each once
    for _, answer, finish, prompt_tokens, completion_tokens, _, _ in rows:
        assert finish in ("length", "stop")
        assert prompt_tokens > 0 and 0 < completion_tokens <= 6
        assert isinstance(answer, str)
    first = next(r for r in rows if r[0] == 0)
    assert first[1] == direct_chat(llama, PROMPT.format(topic="topic 0-0 é"))


@pytest.mark.timeout(900)  # the first test may wait for the llama venv build
async def test_completions_into_parquet_and_embeddings_into_postgresql(
    broker: Broker,
    llama: LlamaEndpoint,
    consumers: list[Run],
    postgres: PostgresEndpoint,
    tmp_path: Path,
) -> None:
    """``/v1/completions`` (one prompt per request: this server takes no list) into Parquet,
    then ``/v1/embeddings`` (eight rows per request) into PostgreSQL: every row once, the
    vectors of the server's dimension."""
    await broker.prepare(partitions=1)
    chunks = [chunk(n) for n in range(MESSAGES) if n != LONG_ROW[0]]
    await broker.publish(records(chunks))
    out = tmp_path / "completions"
    sink = {"kind": "parquet", "url": str(out), "table": "completions", "commit_interval_s": 0.5}
    cfg = ConsumerConfig.model_validate(
        {
            "source": broker.source(),
            "model": model_section(llama, api="completions", rows_per_request=1),
            "binding": {
                "outputs": {"text": "completion", "completion_tokens": "tokens"},
                "passthrough": {"id": "int64"},
            },
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
        }
    )
    run = await start(consumers, cfg)
    await wait_until(lambda: settled(run.registry) == len(chunks), 180, "all settled", run.task)
    await broker.drained(run.registry, None)
    await run.stop_and_wait()
    table = ds.dataset(str(out), format="parquet").to_table().to_pydict()
    ids = sorted(table["id"])
    assert ids == sorted(
        n * 100 + r for n in range(MESSAGES) if n != LONG_ROW[0] for r in range(ROWS)
    )
    assert all(0 < t <= 6 for t in table["tokens"])

    await broker.prepare(partitions=1)
    await broker.publish(records(chunks))
    embed_table = f"emb_{broker.name}_{int(time.time() * 1000)}"
    cfg = ConsumerConfig.model_validate(
        {
            "source": broker.source(),
            "model": {
                "kind": "openai",
                "url": llama.url,
                "name": llama.embed_model,
                "api": "embeddings",
                "prompt": "{topic}",
                "rows_per_request": 8,
                "startup_wait_s": 60,
                "max_wait_ms": 50,
            },
            "binding": {"outputs": {"embedding": "vec"}, "passthrough": {"id": "int64"}},
            "sink": {"kind": "postgres", "dsn": postgres.dsn, "table": embed_table},
            "server": {"port": 0},
            "log_format": "text",
        }
    )
    run = await start(consumers, cfg)
    await wait_until(lambda: settled(run.registry) == len(chunks), 180, "all settled", run.task)
    await broker.drained(run.registry, None)
    await run.stop_and_wait()
    with psycopg.connect(postgres.dsn) as conn:
        got = conn.execute(f"SELECT id, vec FROM {embed_table} ORDER BY id").fetchall()
    assert len(got) == len(chunks) * ROWS == len({i for i, _ in got})
    assert {len(v) for _, v in got} == {llama.embedding_dim}


@pytest.mark.timeout(900)  # the first test may wait for the llama venv build
async def test_a_table_run_of_chat_rows_from_json_lines(
    llama: LlamaEndpoint, tmp_path: Path
) -> None:
    """Table mode: a JSON Lines file of rows through chat into Parquet, every row once, the
    run ending when the table is done; a null in the prompt's column goes to the dead-letter
    file as that row alone (``null_not_allowed``)."""
    rows = 30
    path = tmp_path / "prompts.jsonl"
    with path.open("w") as out:
        for i in range(rows):
            topic = None if i == 7 else f"table row {i}"
            out.write(json.dumps({"id": i, "topic": topic}) + "\n")
    cfg = ConsumerConfig.model_validate(
        {
            "source": {
                "kind": "table",
                "input": str(path),
                "state": str(tmp_path / "state"),
                "chunk_rows": 8,
                "schema": "id:int64,topic:string",
            },
            "model": model_section(llama),
            "binding": {"outputs": {"text": "answer"}, "passthrough": {"id": "int64"}},
            "sink": {"kind": "parquet", "url": str(tmp_path / "out"), "table": "chat"},
            "server": {"port": 0},
            "log_format": "text",
        }
    )
    running: list[Running] = []
    await asyncio.wait_for(run_consumer(cfg, asyncio.Event(), on_running=running.append), 240)
    table = ds.dataset(str(tmp_path / "out"), format="parquet").to_table().to_pydict()
    assert sorted(table["id"]) == [i for i in range(rows) if i != 7]
    letters = list((tmp_path / "state").rglob("*dead*"))
    assert letters, f"no dead-letter file under {tmp_path / 'state'}"
