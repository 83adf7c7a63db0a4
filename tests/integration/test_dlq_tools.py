"""``rowbatch-consumer dlq`` on the real brokers (Kafka, the Pub/Sub emulator), Triton's chaos
model and PostgreSQL: the poison mix is dead-lettered by a running consumer; ``stats`` and
``show`` (the real command, in a subprocess) match it exactly and consume nothing; once the
model is "fixed", ``replay --reason rejected-by-model`` killed with -9 midway and run again puts
every rejected row in the table exactly once, empties the queue of them and leaves the other
reasons as they were; replaying into the same failure comes back with the replay counted, and
``--max-replays`` holds it back instead of looping. A copy of one dead letter (as a consumer
killed between its dead letter and its ack leaves) is counted, shown and replayed once, and
leaves the queue with it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from harness.chaos import ChaosControl
from harness.consumer_process import to_toml
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.service import REPO_ROOT
from harness.triton import TritonEndpoint
from rowbatch.consumer.dlq.letters import DeadLetter
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.consumer.service.dlq_cli import open_queue
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.chunks.row_parts import part_chunk_id
from rowbatch.wire.dead_letter import ATTR_DELIVERY_ATTEMPT
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, produce
from tests.integration.pubsub_helpers import use_emulator
from tests.integration.test_consumer_pubsub import dead_lettered, settled, text_chunk

MARKER = "POISON-ROW"
GOOD, REJECTED, ROWS = 40, 60, 4
"""Good chunks, chunks the model rejects (one marked row each), rows per chunk."""
CLI_TIMEOUT_S = 120


@dataclass
class Rig:
    """One broker: its topics, a consumer config for them, and how to publish."""

    name: str
    config: Callable[[dict[str, Any]], ConsumerConfig]
    publish: Callable[[list[EncodedChunk]], Awaitable[None]]
    publish_raw: Callable[[bytes, dict[str, str]], Awaitable[None]]
    env: dict[str, str]
    copy_dead_letter: Callable[[DeadLetter], Awaitable[None]]
    """Put a copy of a dead letter in the dead-letter queue, as a consumer dead-lettering a
    redelivered message again does (the same payload, key and headers, a later attempt)."""


def _config(source: dict[str, Any], triton: TritonEndpoint, sink: dict[str, Any]) -> ConsumerConfig:
    return ConsumerConfig.model_validate(
        {
            "source": source,
            "model": {"url": triton.grpc_url, "name": "chaos", "max_wait_ms": 50},
            "binding": {
                "inputs": {"text": "TEXT"},
                "outputs": {"EMBEDDING": "embedding"},
                "passthrough": {"id": "int64"},
            },
            "sink": sink,
            "server": {"port": 0},
            "log_format": "text",
        }
    )


@pytest.fixture(params=["kafka", "pubsub"])
def rig(
    request: pytest.FixtureRequest, triton: TritonEndpoint, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    ChaosControl().write(triton.chaos_control)
    if request.param == "kafka":
        kafka: KafkaEndpoint = request.getfixturevalue("kafka")
        t = asyncio.run(KafkaTopics.create(kafka, partitions=3))
        source = t.source()

        async def publish(chunks: list[EncodedChunk]) -> None:
            await produce(kafka, t.topic, [chunk_record(c) for c in chunks])

        async def publish_raw(payload: bytes, attributes: dict[str, str]) -> None:
            headers = [(k, v.encode()) for k, v in attributes.items()]
            await produce(kafka, t.topic, [(b"raw", payload, headers)])

        async def copy_dead_letter(letter: DeadLetter) -> None:
            headers = [(k, b"2" if k == ATTR_DELIVERY_ATTEMPT else v) for k, v in letter.headers]
            await produce(kafka, t.dlq, [(letter.key, letter.payload, headers)])

        yield Rig(
            "kafka",
            lambda sink: _config(source, triton, sink),
            publish,
            publish_raw,
            {},
            copy_dead_letter,
        )
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
        use_emulator(pubsub, monkeypatch)
        topics = Topics.create(pubsub)
        source = topics.source()

        async def publish_ps(chunks: list[EncodedChunk]) -> None:
            await asyncio.to_thread(topics.publish, chunks)

        async def publish_raw_ps(payload: bytes, attributes: dict[str, str]) -> None:
            await asyncio.to_thread(topics.publish_raw, payload, attributes)

        def copy_ps(letter: DeadLetter) -> None:
            attributes = {**letter.attributes, ATTR_DELIVERY_ATTEMPT: "2"}
            topics.publisher.publish(topics.dlq_topic, letter.payload, **attributes).result(60)

        async def copy_dead_letter_ps(letter: DeadLetter) -> None:
            await asyncio.to_thread(copy_ps, letter)

        env = {"PUBSUB_EMULATOR_HOST": os.environ["PUBSUB_EMULATOR_HOST"]}
        try:
            yield Rig(
                "pubsub",
                lambda sink: _config(source, triton, sink),
                publish_ps,
                publish_raw_ps,
                env,
                copy_dead_letter_ps,
            )
        finally:
            topics.close()
    ChaosControl().write(triton.chaos_control)


def dlq(config_file: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """The real command, ``python -m rowbatch.consumer dlq ...``."""
    return subprocess.run(
        [sys.executable, "-m", "rowbatch.consumer", "dlq", *args, "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    return result.stdout


def stats(config_file: Path, env: dict[str, str]) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(ok(dlq(config_file, env, "stats", "--json")))
    return found


async def dead_letter(config: ConsumerConfig, chunk_id: str) -> DeadLetter:
    """The dead letter of ``chunk_id`` as the tools read it (every letter is read, nothing
    consumed: Pub/Sub's are given back when the queue closes)."""
    queue = open_queue(config, 30.0, 10)
    try:
        found = [letter async for letter in queue.letters() if letter.chunk_id == chunk_id]
    finally:
        await queue.close()
    assert len(found) == 1, found
    return found[0]


def table_rows(dsn: str, table: str) -> tuple[int, set[tuple[str, int]]]:
    """(rows, distinct (chunk_id, row_index)) of the result table."""
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return 0, set()
        rows = conn.execute(f"SELECT chunk_id, row_index FROM {table}").fetchall()
    return len(rows), {(str(c), int(r)) for c, r in rows}


@pytest.mark.timeout(900)
async def test_stats_show_and_replay_after_a_fix_exactly_once(
    rig: Rig, triton: TritonEndpoint, postgres: PostgresEndpoint, tmp_path: Path
) -> None:
    ChaosControl(reject_marker=MARKER).write(triton.chaos_control)
    good = [text_chunk(n, ROWS) for n in range(GOOD)]
    rejected = [text_chunk(500 + n, ROWS, marker_row=n % ROWS) for n in range(REJECTED)]
    wrong_type = [
        encode_chunk(
            "docs",
            {"id": np.arange(3, dtype=np.int64), "text": np.arange(3, dtype=np.int64)},
            "json",
            f"wrong-type-{n}",
        )
        for n in range(2)
    ]
    await rig.publish(good[: GOOD // 2])
    await rig.publish(rejected)
    await rig.publish(wrong_type)
    await rig.publish_raw(b"\x00garbage{", dict(good[0].attributes))
    await rig.publish_raw(good[1].payload, {"content-type": "application/json"})
    await rig.publish(good[GOOD // 2 :])
    messages = GOOD + REJECTED + len(wrong_type) + 2
    # Each rejected message has one marked row: that row is dead-lettered as a row part, the
    # message's other rows written and the message acked.
    want_reasons = {"rejected-by-model": REJECTED, "schema-mismatch": 2, "undecodable": 2}
    whole = {"schema-mismatch": 2, "undecodable": 2}
    parts = {c.headers.chunk_id: part_chunk_id(c.headers.chunk_id, [n % ROWS])
             for n, c in enumerate(rejected)}  # fmt: skip

    table = f"emb_{uuid.uuid4().hex[:8]}"
    config = rig.config({"kind": "postgres", "dsn": postgres.dsn, "table": table})
    config_file = tmp_path / "consumer.toml"
    config_file.write_text(to_toml(config.model_dump(mode="json", exclude_none=True)))

    async with consumer_running(config) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry
        await wait_until(lambda: settled(registry) >= messages, 180, "all settled", run.task)
        await run.stop_and_wait()
        assert dead_lettered(registry) == whole
        assert (
            registry.get_sample_value(
                "rowbatch_rows_dead_lettered_total", {"reason": "rejected-by-model"}
            )
            == REJECTED
        )

    # stats: exactly the poison mix, and reading twice finds the same (nothing consumed).
    first = await asyncio.to_thread(stats, config_file, rig.env)
    assert first["by_reason"] == want_reasons, first
    assert first["read"] == first["selected"] == sum(want_reasons.values())
    groups = [g for g in first["groups"] if g["reason"] == "rejected-by-model"]
    assert sum(g["rows"] for g in groups) == REJECTED  # one row a part
    assert {g["table"] for g in groups} == {"docs"}
    assert first["duplicates"] == 0
    assert (await asyncio.to_thread(stats, config_file, rig.env))["by_reason"] == want_reasons

    # A copy of one part's dead letter (a consumer killed after dead-lettering it and before
    # its ack dead-letters it again under the same chunk id): counted, shown, replayed once.
    copied = parts[rejected[3].headers.chunk_id]
    await rig.copy_dead_letter(await dead_letter(config, copied))
    with_copy = await asyncio.to_thread(stats, config_file, rig.env)
    assert with_copy["by_reason"] == want_reasons, with_copy
    assert (with_copy["read"], with_copy["selected"], with_copy["duplicates"]) == (
        first["read"] + 1,
        first["selected"],
        1,
    ), with_copy

    # show: the rejected ones with their decoded rows, the undecodable ones with the error.
    shown = json.loads(
        ok(
            await asyncio.to_thread(
                dlq, config_file, rig.env, "show", "--reason", "rejected-by-model",
                "--limit", "1000", "--json",
            )
        )
    )  # fmt: skip
    assert sorted(s["chunk_id"] for s in shown) == sorted(parts.values())
    assert {s["chunk_id"]: s["seen"] for s in shown if s["seen"] != 1} == {copied: 2}
    for s in shown:
        assert s["code"] == "invalid_argument"
        assert s["preview"][0] == "1 rows; columns: id, text", s["preview"]
        assert s["attributes"]["rowbatch-dlq-reason"] == "rejected-by-model"
        assert parts[s["attributes"]["rowbatch-parent-chunk-id"]] == s["chunk_id"]
    garbage = json.loads(
        ok(
            await asyncio.to_thread(
                dlq, config_file, rig.env, "show", "--reason", "undecodable", "--json"
            )
        )
    )
    assert len(garbage) == 2
    assert all(g["preview"][0].startswith("does not decode") for g in garbage), garbage
    one = ok(
        await asyncio.to_thread(
            dlq, config_file, rig.env, "show", "--chunk-id", parts[rejected[3].headers.chunk_id]
        )
    )
    assert f"chunk    {parts[rejected[3].headers.chunk_id]} of table docs" in one
    assert "1 shown (--limit 10), 1 duplicate collapsed" in one, one
    assert "  seen     2 times: also at " in one, one

    # The fix is deployed: the model no longer rejects. A dry run changes nothing.
    ChaosControl().write(triton.chaos_control)
    dry = ok(
        await asyncio.to_thread(
            dlq, config_file, rig.env, "replay", "--reason", "rejected-by-model", "--dry-run"
        )
    )
    assert f"would replay {REJECTED} ({REJECTED} rows)" in dry, dry
    assert "1 duplicate of the selected letters" in dry and "would remove 1" in dry, dry
    assert (await asyncio.to_thread(stats, config_file, rig.env))["by_reason"] == want_reasons

    rejected_keys = {(c.headers.chunk_id, r) for c in rejected for r in range(ROWS)}
    marked_keys = {(c.headers.chunk_id, n % ROWS) for n, c in enumerate(rejected)}
    assert table_rows(postgres.dsn, table)[1] & rejected_keys == rejected_keys - marked_keys
    good_keys = {(c.headers.chunk_id, r) for c in good for r in range(ROWS)}
    async with consumer_running(config) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        # kill -9 the replay as soon as its first rows are written: one letter at a time, 20 a
        # second (60 take 3 s), so it is midway then; the rerun replays the rest at full speed.
        replay = await asyncio.create_subprocess_exec(
            *[sys.executable, "-m", "rowbatch.consumer", "dlq", "replay"],
            *["--reason", "rejected-by-model", "--lease", "10", "--in-flight", "1", "--rate", "20"],
            *["--config", str(config_file)],
            cwd=REPO_ROOT,
            env={**os.environ, **rig.env},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            await wait_until(
                lambda: (
                    bool(table_rows(postgres.dsn, table)[1] & marked_keys)
                    or replay.returncode is not None
                ),
                120,
                "the first replayed rows",
                run.task,
            )
        finally:
            if replay.returncode is None:
                replay.kill()
            out, err = await asyncio.wait_for(replay.communicate(), 30)
        assert replay.returncode == -signal.SIGKILL, (replay.returncode, out, err)
        # Pub/Sub: what the killed replay held comes back when its 10 s lease lapses.
        seen: dict[str, int] = {}

        def others_back() -> bool:
            seen.update(stats(config_file, rig.env)["by_reason"])
            return seen.get("schema-mismatch") == 2 and seen.get("undecodable") == 2

        await wait_until(others_back, 60, "the killed replay's letters back", run.task)
        left = (await asyncio.to_thread(stats, config_file, rig.env))["by_reason"]
        assert 0 < left.get("rejected-by-model", 0) < REJECTED, left  # killed midway

        rerun = ok(
            await asyncio.to_thread(
                dlq, config_file, rig.env, "replay", "--reason", "rejected-by-model"
            )
        )
        assert "stopped" not in rerun, rerun
        await wait_until(
            lambda: table_rows(postgres.dsn, table)[1] >= good_keys | rejected_keys,
            120,
            "every replayed row written",
            run.task,
        )
        # Replaying into the same failure: the schema mismatches come back, counted.
        mismatches = ok(
            await asyncio.to_thread(
                dlq, config_file, rig.env, "replay", "--reason", "schema-mismatch"
            )
        )
        assert "replayed 2 (6 rows)" in mismatches, mismatches
        registry = run.running[0].metrics.registry
        await wait_until(
            lambda: dead_lettered(registry).get("schema-mismatch") == 2,
            120,
            "the replayed mismatches dead-lettered again",
            run.task,
        )
        await run.stop_and_wait()

    count, keys = table_rows(postgres.dsn, table)
    assert keys == good_keys | rejected_keys
    assert count == len(keys)  # exactly once
    after = await asyncio.to_thread(stats, config_file, rig.env)
    assert after["by_reason"] == {"schema-mismatch": 2, "undecodable": 2}, after
    assert (after["read"], after["duplicates"]) == (4, 0), after  # the copy left with its part
    again = [g for g in after["groups"] if g["reason"] == "schema-mismatch"]
    assert sum(g["replayed_before"] for g in again) == 2
    held = ok(
        await asyncio.to_thread(
            dlq, config_file, rig.env, "replay", "--reason", "schema-mismatch",
            "--max-replays", "1",
        )
    )  # fmt: skip
    assert "replayed 0 (0 rows)" in held and "held back 2" in held, held
    assert (await asyncio.to_thread(stats, config_file, rig.env))["by_reason"] == after["by_reason"]
