"""rowbatch against a real Seldon MLServer 1.7.1 (harness/mlserver.py) serving the ``scorer``
formula as a custom MLModel (deploy/oip_models/mlserver/scorer): what its Open Inference
Protocol answers look like, how its errors map to rowbatch's classes, ``rowbatch-consumer
check`` with nothing but the model's name and URL, and the consumer end to end on the real
Kafka broker and PostgreSQL. The facts asserted here are the ones docs/model-servers.md gives.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from bench.oip_servers import CASES
from bench.oip_servers import run as bench_oip_servers
from harness.consumer_process import ConsumerProcess, to_toml
from harness.kafka import KafkaEndpoint
from harness.mlserver import MLSERVER_VERSION, MLServerEndpoint, MLServerService
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.reference_models import score
from harness.service import RunDir
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    PoisonInferenceError,
    RetryableInferenceError,
    classify,
)
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from tests.integration.kafka_helpers import KafkaTopics, chunk_record, produce, read_all
from tests.integration.test_consumer_pubsub import scorer_chunks

#: COUNT that makes the scorer raise a plain exception (deploy/oip_models/mlserver/scorer).
CRASH_COUNT = -999_999
SCORER_BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}
CONSUMER = Path(sys.executable).with_name("rowbatch-consumer")


@pytest.fixture(scope="module")
def mlserver(run_dir: RunDir) -> Iterator[MLServerEndpoint]:
    """The scorer with adaptive batching on (up to 8 requests merged, 2 ms)."""
    with MLServerService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def mlserver_unbatched(run_dir: RunDir) -> Iterator[MLServerEndpoint]:
    """The scorer with adaptive batching off: each request is one predict call, so a model
    error fails only the request that holds the bad row."""
    service = MLServerService(
        run_dir, name="mlserver-unbatched", model_overrides={"scorer": {"max_batch_size": 1}}
    )
    with service as endpoint:
        yield endpoint


def inputs(features: np.ndarray, count: np.ndarray, aio: bool = False) -> list[Any]:
    module: Any = grpcaio if aio else grpcclient
    f = module.InferInput("FEATURES", list(features.shape), "FP32")
    f.set_data_from_numpy(features)
    c = module.InferInput("COUNT", list(count.shape), "INT64")
    c.set_data_from_numpy(count)
    return [f, c]


def rows(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, 16)).astype(np.float32)
    return features, rng.integers(0, 1000, size=(n, 1)).astype(np.int64)


def error_of(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as info:
        call()
    return info.value


# --- (a) what MLServer's OIP answers say ------------------------------------------------------


def test_metadata_describes_the_model_and_config_is_unimplemented(
    mlserver: MLServerEndpoint,
) -> None:
    client = grpcclient.InferenceServerClient(mlserver.grpc_url)
    try:
        assert client.get_server_metadata(as_json=True) == {
            "name": "mlserver",
            "version": MLSERVER_VERSION,
        }
        metadata = client.get_model_metadata("scorer", as_json=True)
        assert metadata == {
            "name": "scorer",
            "inputs": [
                {"name": "FEATURES", "datatype": "FP32", "shape": ["-1", "16"]},
                {"name": "COUNT", "datatype": "INT64", "shape": ["-1", "1"]},
            ],
            "outputs": [
                {"name": "SCORE", "datatype": "FP32", "shape": ["-1", "1"]},
                {"name": "LABEL", "datatype": "INT32", "shape": ["-1", "1"]},
            ],
        }, "no versions, no platform: only what model-settings.json declares"
        no_config = error_of(lambda: client.get_model_config("scorer", as_json=True))
        assert (str(no_config.status()), no_config.message()) == (
            "StatusCode.UNIMPLEMENTED",
            "Method not found!",
        )
        unknown = error_of(lambda: client.get_model_metadata("nope", as_json=True))
        assert str(unknown.status()) == "StatusCode.NOT_FOUND"
        assert unknown.message() == "Model nope with version  not found"
        # The version comes in each response (model-settings parameters.version), not in the
        # metadata.
        features, count = rows(5)
        answer = client.infer("scorer", inputs(features, count))
        response = answer.get_response(as_json=True)
        assert (response["model_name"], response["model_version"]) == ("scorer", "1")
        want_score, want_label = score(features, count)
        np.testing.assert_array_equal(answer.as_numpy("SCORE"), want_score)
        np.testing.assert_array_equal(answer.as_numpy("LABEL"), want_label)
    finally:
        client.close()


# --- (d) errors: MLServer's statuses, and rowbatch's class for each -----------------------------


def test_model_errors_map_to_poison_and_other_exceptions_to_fatal(
    mlserver: MLServerEndpoint,
) -> None:
    client = grpcclient.InferenceServerClient(mlserver.grpc_url)
    features, count = rows(8, seed=1)
    try:
        bad = features.copy()
        bad[3, 5] = np.nan
        model_error = error_of(lambda: client.infer("scorer", inputs(bad, count)))
        crashing = count.copy()
        crashing[2, 0] = CRASH_COUNT
        crash = error_of(lambda: client.infer("scorer", inputs(features, crashing)))
        unknown = error_of(lambda: client.infer("nope", inputs(features, count)))
    finally:
        client.close()
    # mlserver.errors.InferenceError (an MLServerError, HTTP 400) -> INVALID_ARGUMENT; from a
    # parallel worker its message is prefixed with the exception's class.
    assert str(model_error.status()) == "StatusCode.INVALID_ARGUMENT"
    assert model_error.message() == (
        "mlserver.errors.InferenceError: FEATURES must be finite; rows [3] are not"
    )
    poison = classify(model_error, model="scorer")
    assert isinstance(poison, PoisonInferenceError) and poison.status == "INVALID_ARGUMENT"
    # Any other exception -> INTERNAL -> fatal: bisected, and what fails alone is nacked (see
    # the process test).
    assert str(crash.status()) == "StatusCode.INTERNAL"
    assert crash.message() == f"builtins.RuntimeError: scorer crashed on COUNT {CRASH_COUNT}"
    fatal = classify(crash, model="scorer")
    assert isinstance(fatal, FatalInferenceError) and fatal.status == "INTERNAL"
    # An unknown model: NOT_FOUND, fatal at start-up, transient for a model already in use.
    assert str(unknown.status()) == "StatusCode.NOT_FOUND"
    assert isinstance(classify(unknown, model="nope"), FatalInferenceError)
    assert isinstance(classify(unknown, model="nope", served=True), RetryableInferenceError)


async def test_a_model_error_fails_every_request_merged_into_its_batch(
    run_dir: RunDir,
) -> None:
    """MLServer's adaptive batcher runs the merged requests as one predict call: one poison
    row fails every request merged with it, each with the same INVALID_ARGUMENT. (A generous
    max_batch_time makes the merge certain here.)"""
    service = MLServerService(
        run_dir,
        name="mlserver-merge",
        model_overrides={"scorer": {"max_batch_size": 4, "max_batch_time": 0.5}},
    )
    with service as endpoint:
        client = grpcaio.InferenceServerClient(endpoint.grpc_url)
        try:

            async def send(poison: bool) -> str:
                features, count = rows(64, seed=int(poison))
                if poison:
                    features[10, 0] = np.inf
                try:
                    await client.infer("scorer", inputs(features, count, aio=True))
                except InferenceServerException as exc:
                    return str(exc.status())
                return "ok"

            answers = await asyncio.gather(*(send(i == 0) for i in range(4)))
            alone = await send(False)
        finally:
            await client.close()
    assert answers == ["StatusCode.INVALID_ARGUMENT"] * 4
    assert alone == "ok"


# --- (b) rowbatch-consumer check with the model's name and URL only ---------------------------


def check(tmp_path: Path, url: str, model: str) -> subprocess.CompletedProcess[str]:
    config = {
        "source": {
            "kind": "kafka",
            "bootstrap_servers": "127.0.0.1:9",  # check does not reach the broker
            "topic": "in",
            "group_id": "g",
        },
        "model": {"url": url, "name": model},
        "binding": SCORER_BINDING,
        "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"},
    }
    path = tmp_path / f"check-{model}.toml"
    path.write_text(to_toml(config))
    return subprocess.run(
        [str(CONSUMER), "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_discovers_the_spec_from_metadata(mlserver: MLServerEndpoint, tmp_path: Path) -> None:
    done = check(tmp_path, mlserver.grpc_url, "scorer")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "model scorer" in out
    assert f"mlserver {MLSERVER_VERSION}" in out and "ModelMetadata" in out
    assert "input  FEATURES (FP32 [16])" in out
    assert "input  COUNT (INT64 [1])" in out
    assert "output SCORE (FP32 [1])" in out
    assert "output LABEL (INT32 [1])" in out
    assert "batch size 256" in out


def test_check_names_a_model_the_server_does_not_serve(
    mlserver: MLServerEndpoint, tmp_path: Path
) -> None:
    done = check(tmp_path, mlserver.grpc_url, "scorre")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{mlserver.grpc_url} does not serve model 'scorre'" in done.stderr
    assert "Traceback" not in done.stderr


# --- (c) the consumer end to end: Kafka -> MLServer -> PostgreSQL -----------------------------


def consumer_config(
    topics: KafkaTopics, mlserver: MLServerEndpoint, postgres: PostgresEndpoint, table: str
) -> dict[str, Any]:
    """Only the model's name and URL: spec, batch size and requests in flight are MLServer's
    defaults from discovery."""
    return {
        "source": {
            "kind": "kafka",
            "bootstrap_servers": topics.bootstrap,
            "topic": topics.topic,
            "group_id": topics.group,
            "commit_interval_s": 0.5,
        },
        "model": {"url": mlserver.grpc_url, "name": "scorer"},
        "binding": SCORER_BINDING,
        "sink": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
        "server": {"host": "127.0.0.1", "port": free_port()},
        "log_format": "text",
    }


def start_consumer(tmp_path: Path, config: dict[str, Any], name: str) -> ConsumerProcess:
    path = tmp_path / f"{name}.toml"
    path.write_text(to_toml(config))
    proc = ConsumerProcess(name, path, tmp_path / f"{name}.log", config["server"]["port"])
    proc.start()
    return proc


def wait_for(what: str, proc: ConsumerProcess, predicate: Any, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        proc.check_alive(what)
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{proc.log()}"
        time.sleep(0.2)


def table_rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return []
        return conn.execute(
            f"SELECT id, score, label, model_name, model_version FROM {table} ORDER BY id"
        ).fetchall()


def row_count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists is None or exists[0] is None:
            return 0
        found = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(found[0]) if found else 0


@pytest.mark.timeout(300)
async def test_consumer_writes_every_row_once_with_exact_values(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    mlserver: MLServerEndpoint,
    tmp_path: Path,
) -> None:
    total = 20_000
    topics = await KafkaTopics.create(kafka, partitions=4)
    chunks, expected = scorer_chunks(total, seed=16)
    await produce(kafka, topics.topic, [chunk_record(c) for c in chunks])
    table = f"mlserver_{int(time.time() * 1000) % 10**9}"
    proc = start_consumer(tmp_path, consumer_config(topics, mlserver, postgres, table), "e2e")
    try:
        started = time.monotonic()
        await asyncio.to_thread(
            wait_for, f"{total} rows", proc, lambda: row_count(postgres.dsn, table) >= total
        )
        elapsed = time.monotonic() - started
        assert proc.terminate(60) == 0, proc.log()
    finally:
        proc.stop()
    print(f"\nMLServer end to end: {total} rows in {elapsed:.1f} s from start")
    got = table_rows(postgres.dsn, table)
    assert [int(r[0]) for r in got] == list(range(total)), "every id exactly once"
    want_score = np.array([expected[i][0] for i in range(total)], dtype=np.float32)
    np.testing.assert_array_equal(np.array([r[1] for r in got], dtype=np.float32), want_score)
    assert [int(r[2]) for r in got] == [int(expected[i][1]) for i in range(total)]
    assert {(r[3], r[4]) for r in got} == {("scorer", "1")}, "model_version from the responses"
    assert await read_all(kafka, topics.dlq) == []


def scorer_chunk(n: int, size: int, *, nan_row: int | None = None) -> EncodedChunk:
    features, count = rows(size, seed=100 + n)
    if nan_row is not None:
        features[nan_row, 7] = np.nan
    cols = {
        "id": np.arange(n * 1000, n * 1000 + size, dtype=np.int64),
        "features": features,
        "count": count.reshape(-1),
    }
    return encode_chunk("events", cols, "arrow", f"p{n}")


POISON_MESSAGES = (37, 90, 151, 200, 233, 299, 340, 388)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("server", ["mlserver_unbatched", "mlserver"])
async def test_rows_the_model_rejects_are_dead_lettered_and_the_rest_written(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    server: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    """400 messages of 50 rows, 8 of them holding one NaN row each: the model's
    INVALID_ARGUMENT makes the consumer bisect each failing batch down to the message, then the
    message down to its rows; exactly the 8 NaN rows are dead-lettered, each as a row part of
    its message (``rejected-by-model``, with MLServer's message), and every other row is
    written once. With adaptive batching on too, where a failing request fails the good
    requests merged with it: isolation runs one batch at a time and a message is called poison
    only after failing alone twice, so no good message is pinned (docs/model-servers.md).
    """
    mlserver_unbatched: MLServerEndpoint = request.getfixturevalue(server)
    size = 50
    chunks = [
        scorer_chunk(n, size, nan_row=n % size if n in POISON_MESSAGES else None)
        for n in range(400)
    ]
    topics = await KafkaTopics.create(kafka, partitions=4)
    await produce(kafka, topics.topic, [chunk_record(c) for c in chunks])
    table = f"mlserver_poison_{int(time.time() * 1000) % 10**9}"
    config = consumer_config(topics, mlserver_unbatched, postgres, table)
    proc = start_consumer(tmp_path, config, "poison")
    try:

        def settled() -> bool:
            metrics = proc.metrics() or {}
            written = metrics.get("rowbatch_rows_written_total", 0.0)
            dead = metrics.get("rowbatch_rows_dead_lettered_total", 0.0)
            return written + dead >= 400 * size

        await asyncio.to_thread(wait_for, "every message settled", proc, settled)
        assert proc.terminate(60) == 0, proc.log()
    finally:
        proc.stop()
    dead = await read_all(kafka, topics.dlq)
    by_chunk = {}
    for record in dead:
        headers = {k: v.decode() for k, v in record.headers}
        by_chunk[headers["rowbatch-parent-chunk-id"]] = (headers, record.value)
    assert sorted(by_chunk) == sorted(f"p{n}" for n in POISON_MESSAGES)
    assert len(dead) == len(POISON_MESSAGES)
    for n in POISON_MESSAGES:
        headers, payload = by_chunk[f"p{n}"]
        assert headers["rowbatch-dlq-reason"] == "rejected-by-model"
        assert "INVALID_ARGUMENT" in headers["rowbatch-dlq-message"]
        # MLServer names the row's index in the failing request (a message's rows may be
        # split between batches), not in the message.
        assert "InferenceError: FEATURES must be finite; rows [" in headers["rowbatch-dlq-message"]
        assert headers["rowbatch-parent-rows"] == str(n % size)
        part = decode_chunk(payload, headers)
        assert part.row_count == 1
        assert part.columns["id"].tolist() == [n * 1000 + n % size]
    ids = [int(r[0]) for r in table_rows(postgres.dsn, table)]
    want = [n * 1000 + r for n in range(400) for r in range(size)]
    assert ids == [i for i in want if i not in {n * 1000 + n % size for n in POISON_MESSAGES}]


@pytest.mark.timeout(300)
async def test_an_internal_error_nacks_until_the_message_is_dead_lettered_as_too_many_attempts(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    mlserver_unbatched: MLServerEndpoint,
    tmp_path: Path,
) -> None:
    """INTERNAL is fatal for the batch, not for the consumer: its messages are nacked and
    redelivered, and a message that never succeeds is dead-lettered as ``too-many-attempts``
    after ``max_delivery_attempts``; the consumer keeps running."""
    features, count = rows(20, seed=3)
    count[4, 0] = CRASH_COUNT
    crash = encode_chunk(
        "events",
        {"id": np.arange(20, dtype=np.int64), "features": features, "count": count.reshape(-1)},
        "arrow",
        "crash",
    )
    topics = await KafkaTopics.create(kafka, partitions=1)
    await produce(kafka, topics.topic, [chunk_record(crash)])
    table = f"mlserver_crash_{int(time.time() * 1000) % 10**9}"
    config = consumer_config(topics, mlserver_unbatched, postgres, table)
    config["source"] |= {"max_delivery_attempts": 3, "redelivery_backoff_s": 0.2}
    proc = start_consumer(tmp_path, config, "crash")
    try:
        await asyncio.to_thread(
            wait_for,
            "the dead letter",
            proc,
            lambda: (proc.metric("rowbatch_messages_dead_lettered_total") or 0) >= 1,
        )
        log = proc.log_path.read_text(errors="replace")  # the whole log: tracebacks are long
        assert proc.terminate(60) == 0, proc.log()
    finally:
        proc.stop()
    assert "inference failed for good; nacking the batch's messages" in log, log
    assert f"INTERNAL: builtins.RuntimeError: scorer crashed on COUNT {CRASH_COUNT}" in log
    dead = await read_all(kafka, topics.dlq)
    assert len(dead) == 1
    headers = {k: v.decode() for k, v in dead[0].headers}
    assert headers["rowbatch-dlq-reason"] == "too-many-attempts"
    assert headers["rowbatch-chunk-id"] == "crash"
    assert row_count(postgres.dsn, table) == 0


@pytest.mark.timeout(300)
async def test_a_crashing_message_among_ten_is_isolated_and_only_it_dead_lettered(
    kafka: KafkaEndpoint,
    postgres: PostgresEndpoint,
    mlserver: MLServerEndpoint,
    tmp_path: Path,
) -> None:
    """Ten messages in one batch, one with a row the model raises on (INTERNAL), adaptive
    batching on: the batch is bisected (one isolation at a time, so its attempts are not
    merged with each other), the nine good messages are written once, and only the crashing
    one is nacked until ``max_delivery_attempts`` (3) runs out, then dead-lettered as
    ``too-many-attempts``."""
    features, count = rows(200, seed=4)
    count[87, 0] = CRASH_COUNT  # message 4 (rows 80..99)
    chunks = [
        encode_chunk(
            "events",
            {
                "id": np.arange(n * 20, n * 20 + 20, dtype=np.int64),
                "features": features[n * 20 : n * 20 + 20],
                "count": count[n * 20 : n * 20 + 20, 0],
            },
            "arrow",
            f"ten-{n}",
        )
        for n in range(10)
    ]
    topics = await KafkaTopics.create(kafka, partitions=1)
    await produce(kafka, topics.topic, [chunk_record(c) for c in chunks])
    table = f"mlserver_ten_{int(time.time() * 1000) % 10**9}"
    config = consumer_config(topics, mlserver, postgres, table)
    config["source"] |= {"max_delivery_attempts": 3, "redelivery_backoff_s": 0.2}
    config["model"]["max_wait_ms"] = 2000  # 200 rows < 256 a batch: all ten in one
    proc = start_consumer(tmp_path, config, "ten")
    try:
        await asyncio.to_thread(
            wait_for,
            "nine written and the dead letter",
            proc,
            lambda: (
                (proc.metric("rowbatch_messages_dead_lettered_total") or 0) >= 1
                and (proc.metric("rowbatch_rows_written_total") or 0) >= 180
            ),
        )
        written = proc.metric("rowbatch_rows_written_total")
        assert proc.terminate(60) == 0, proc.log()
        log = proc.log_path.read_text()
    finally:
        proc.stop()
    assert written == 180, "each good row once"
    assert "inference failed for good on 1 of the batch's 10 messages" in log, proc.log()
    dead = await read_all(kafka, topics.dlq)
    assert len(dead) == 1
    headers = {k: v.decode() for k, v in dead[0].headers}
    assert headers["rowbatch-dlq-reason"] == "too-many-attempts"
    assert headers["rowbatch-chunk-id"] == "ten-4"
    ids = [int(r[0]) for r in table_rows(postgres.dsn, table)]
    assert ids == [i for i in range(200) if not 80 <= i < 100]


def test_stop_ends_the_server_and_its_workers(run_dir: RunDir) -> None:
    service = MLServerService(run_dir, name="mlserver-stop", parallel_workers=2)
    with service:
        pid = service.pid
        assert pid is not None
        group = members(pid)
        assert len(group) >= 3, f"server + 2 workers in its process group: {group}"
    assert [p for p in members(pid) if not is_zombie(p)] == []


def members(pgid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            found.append(int(stat.parent.name))
    return found


def is_zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2 :].split()[0] == "Z"


def test_the_in_flight_bench_runs(run_dir: RunDir) -> None:
    """``python -m bench oip_servers`` on MLServer, briefly (a smoke test, not a figure)."""
    result = bench_oip_servers(
        [CASES["mlserver-unbatched"]], settings=(1, 2), seconds=0.3, rounds=1, run_dir=run_dir
    )
    assert [(m.case, m.in_flight) for m in result.measured] == [
        ("mlserver-unbatched", 1),
        ("mlserver-unbatched", 2),
    ]
    assert all(m.rows_per_s > 0 for m in result.measured)
    assert "2 in flight" in result.table().render()
