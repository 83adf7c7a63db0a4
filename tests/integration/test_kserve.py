"""KServe's Python model server (``kserve`` 0.21.0, from its own venv) serving the ``scorer``
formula as a custom ``kserve.Model`` (``deploy/oip_models/kserve/scorer.py``), for real:

- what the server says over the Open Inference Protocol (gRPC), read with tritonclient: no
  ModelConfig, ModelMetadata with shapes but no versions, NOT_FOUND for an unknown model,
  the response's ``model_version``, and the status each kind of model error gets;
- how rowbatch classifies those errors (:func:`rowbatch.consumer.model.inference.errors.classify`);
- ``rowbatch-consumer check`` discovering the spec from ModelMetadata with only the model's
  name and URL configured;
- the consumer end to end on the Pub/Sub emulator and PostgreSQL: every row once, values
  exact; rows the model rejects (InvalidInput) dead-lettered; a model that raises (INTERNAL)
  nacked until the message runs out of delivery attempts, the consumer staying up.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client import CollectorRegistry
from tritonclient.utils import InferenceServerException

from harness.consumer_process import to_toml
from harness.kserve import (
    CRASH_COUNT,
    INVALID_COUNT,
    KSERVE_VERSION,
    KServeEndpoint,
    KServeModel,
    KServeService,
)
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.reference_models import FEATURE_DIM, score
from harness.service import RunDir
from rowbatch.consumer.model.inference.errors import (
    FatalInferenceError,
    InferenceError,
    PoisonInferenceError,
    classify,
)
from rowbatch.consumer.service.config import ConsumerConfig
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.chunks.encode import EncodedChunk, encode_chunk
from rowbatch.wire.dead_letter import ATTR_MESSAGE, ATTR_MESSAGE_ID, ATTR_REASON
from tests.integration.consumer_helpers import Topics, consumer_running, wait_until

pytestmark = pytest.mark.timeout(600)

MODEL = "scorer"
BINDING = {
    "inputs": {"features": "FEATURES", "count": "COUNT"},
    "outputs": {"SCORE": "score", "LABEL": "label"},
    "passthrough": {"id": "int64"},
}


@pytest.fixture(scope="module")
def kserve(run_dir: RunDir) -> Iterator[KServeEndpoint]:
    with KServeService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def kserve_undeclared(run_dir: RunDir) -> Iterator[KServeEndpoint]:
    """The same model with nothing in ModelMetadata's inputs and outputs, like a
    ``kserve.Model`` that does not override ``get_input_types`` / ``get_output_types``."""
    undeclared = KServeModel(declare_tensors=False)
    with KServeService(run_dir, model=undeclared, name="kserve-undeclared") as endpoint:
        yield endpoint


@pytest.fixture
def client(kserve: KServeEndpoint) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(kserve.grpc_url)
    yield c
    c.close()


def rows(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, FEATURE_DIM)).astype(np.float32)
    counts = rng.integers(0, 1000, size=(n, 1)).astype(np.int64)
    return features, counts


def infer(
    client: grpcclient.InferenceServerClient,
    features: np.ndarray,
    counts: np.ndarray,
    *,
    outputs: tuple[str, ...] = ("SCORE", "LABEL"),
    model: str = MODEL,
    version: str = "",
    features_type: str = "FP32",
) -> grpcclient.InferResult:
    inputs = [
        grpcclient.InferInput("FEATURES", list(features.shape), features_type),
        grpcclient.InferInput("COUNT", list(counts.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(features)
    inputs[1].set_data_from_numpy(counts)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, inputs, outputs=requested, model_version=version)


def failure(call: Any) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return caught.value


def status(exc: InferenceServerException) -> str:
    return str(exc.status()).removeprefix("StatusCode.")


# --- what the server says (raw Open Inference Protocol over gRPC) ---------------------------


def _listening(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) of sockets listening on port."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.append(address)
    return found


def test_both_listeners_are_on_loopback_only(kserve: KServeEndpoint) -> None:
    """KServe 0.21 binds 0.0.0.0 (REST) and [::] (gRPC); the model script rebinds both."""
    loopback = {"0100007F", "0000000000000000FFFF00000100007F"}  # 127.0.0.1, ::ffff:127.0.0.1
    for url in (kserve.grpc_url, kserve.http_url):
        port = int(url.rsplit(":", 1)[1])
        addresses = _listening(port)
        assert addresses, f"nothing listens on {port}"
        assert set(addresses) <= loopback, f"port {port} listens on {addresses}"


def test_server_metadata_names_kserve_and_its_version(
    client: grpcclient.InferenceServerClient,
) -> None:
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "kserve"
    assert metadata["version"] == KSERVE_VERSION


def test_model_metadata_lists_every_tensor_with_a_batch_axis_and_no_versions(
    client: grpcclient.InferenceServerClient,
) -> None:
    metadata = client.get_model_metadata(MODEL, as_json=True)
    # int64 fields come back as JSON strings, as from every server tritonclient reads.
    assert metadata["inputs"] == [
        {"name": "FEATURES", "datatype": "FP32", "shape": ["-1", "16"]},
        {"name": "COUNT", "datatype": "INT64", "shape": ["-1", "1"]},
    ]
    assert metadata["outputs"] == [
        {"name": "SCORE", "datatype": "FP32", "shape": ["-1", "1"]},
        {"name": "LABEL", "datatype": "INT32", "shape": ["-1", "1"]},
    ]
    assert "versions" not in metadata  # KServe: "model versioning is not supported yet"
    assert not metadata.get("platform")
    # A version in the request is ignored: the same metadata comes back.
    assert client.get_model_metadata(MODEL, "7", as_json=True) == metadata


def test_model_config_and_statistics_are_unimplemented(
    client: grpcclient.InferenceServerClient,
) -> None:
    for call in (
        lambda: client.get_model_config(MODEL, as_json=True),
        lambda: client.get_model_config("no-such-model", as_json=True),
        lambda: client.get_inference_statistics(MODEL, as_json=True),
    ):
        exc = failure(call)
        assert status(exc) == "UNIMPLEMENTED"
        assert exc.message() == "Method not found!"


def test_a_model_it_does_not_serve_is_not_found(client: grpcclient.InferenceServerClient) -> None:
    features, counts = rows(2, seed=1)
    for call in (
        lambda: client.get_model_metadata("no-such-model", as_json=True),
        lambda: client.is_model_ready("no-such-model"),  # an error, not False
        lambda: infer(client, features, counts, model="no-such-model"),
    ):
        exc = failure(call)
        assert status(exc) == "NOT_FOUND"
        assert exc.message() == "Model with name no-such-model does not exist."


def test_answers_equal_the_reference_and_carry_the_model_version(
    kserve: KServeEndpoint, client: grpcclient.InferenceServerClient
) -> None:
    features, counts = rows(1000, seed=2)
    counts[:5, 0] = [-1, -5, 0, INVALID_COUNT + 1, CRASH_COUNT - 1]  # negatives count as 0
    want_scores, want_labels = score(features, counts)
    result = infer(client, features, counts)
    scores, labels = result.as_numpy("SCORE"), result.as_numpy("LABEL")
    assert scores.dtype == np.float32 and scores.shape == (1000, 1)
    assert labels.dtype == np.int32 and labels.shape == (1000, 1)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_array_equal(labels, want_labels)
    assert result.get_response().model_version == kserve.model_version == "1"
    # A requested version is not checked: the model answers, with its own version.
    other = infer(client, features[:3], counts[:3], version="7", outputs=("SCORE",))
    assert other.get_response().model_version == "1"
    assert [o.name for o in other.get_response().outputs] == ["SCORE"]


@pytest.mark.parametrize(
    ("count", "want_status", "want_class", "want_message"),
    [
        (
            INVALID_COUNT,
            "INVALID_ARGUMENT",
            PoisonInferenceError,
            f"model scorer: COUNT {INVALID_COUNT} is not a valid count",
        ),
        (CRASH_COUNT, "INTERNAL", FatalInferenceError, "Internal server error"),
    ],
    ids=["invalid-input", "plain-exception"],
)
def test_model_errors_map_to_statuses_and_rowbatch_classes(
    client: grpcclient.InferenceServerClient,
    count: int,
    want_status: str,
    want_class: type[InferenceError],
    want_message: str,
) -> None:
    """``kserve.errors.InvalidInput`` (and KServe's own ``InferenceError``) -> INVALID_ARGUMENT
    with the message -> poison; any other exception -> INTERNAL "Internal server error" (the
    message stays in the server's log) -> fatal."""
    features, counts = rows(8, seed=3)
    counts[5, 0] = count
    exc = failure(lambda: infer(client, features, counts))
    assert status(exc) == want_status
    assert exc.message() == want_message
    for served in (False, True):
        classified = classify(exc, model=MODEL, served=served)
        assert type(classified) is want_class
        assert classified.status == want_status
        assert want_message in classified.message


def test_a_wrong_input_datatype_is_invalid_argument_so_poison(
    client: grpcclient.InferenceServerClient,
) -> None:
    features, counts = rows(2, seed=4)
    exc = failure(lambda: infer(client, features.astype(np.float64), counts, features_type="FP64"))
    assert status(exc) == "INVALID_ARGUMENT"
    assert "FEATURES has datatype FP64, expected FP32" in exc.message()
    assert isinstance(classify(exc, model=MODEL), PoisonInferenceError)


# --- rowbatch-consumer check: the spec from ModelMetadata -----------------------------------


def _check(
    tmp_path: Path, topics: Topics, kserve: KServeEndpoint, model: str, **settings: Any
) -> subprocess.CompletedProcess[str]:
    config: dict[str, Any] = {
        "source": {"kind": "pubsub", "subscription": topics.subscription},
        "model": {"url": kserve.grpc_url, "name": model, **settings},
        "binding": BINDING,
        "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "scores"},
        "log_format": "text",
    }
    path = tmp_path / f"check-{model}.toml"
    tables = _tensor_tables(config["model"])  # takes inputs/outputs out of the model table
    path.write_text(to_toml(config) + tables)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    env.update(topics.endpoint.env())  # the emulator's address, so no credentials are asked for
    return subprocess.run(
        [str(Path(sys.executable).with_name("rowbatch-consumer")), "check", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def _tensor_tables(settings: dict[str, Any]) -> str:
    """``[[model.inputs]]`` / ``[[model.outputs]]`` arrays of tables (to_toml writes neither)."""
    text = ""
    for key in ("inputs", "outputs"):
        for tensor in settings.pop(key, ()):
            dims = ", ".join(str(d) for d in tensor["dims"])
            text += (
                f'\n[[model.{key}]]\nname = "{tensor["name"]}"\n'
                f'datatype = "{tensor["datatype"]}"\ndims = [{dims}]\n'
            )
    return text


def test_check_discovers_the_spec_from_model_metadata(
    tmp_path: Path, topics: Topics, kserve: KServeEndpoint
) -> None:
    done = _check(tmp_path, topics, kserve, MODEL)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for line in (
        "input  FEATURES (FP32 [16])",
        "input  COUNT (INT64 [1])",
        "output SCORE (FP32 [1])",
        "output LABEL (INT32 [1])",
        "batch size 256",
    ):
        assert line in out, out
    print(f"\n{out}")


def test_check_names_a_model_the_server_does_not_serve(
    tmp_path: Path, topics: Topics, kserve: KServeEndpoint
) -> None:
    done = _check(tmp_path, topics, kserve, "no-such-model")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "'no-such-model'" in done.stderr
    assert "does not serve" in done.stderr
    assert "ModelConfig" not in done.stderr, done.stderr  # not the old "no ModelConfig RPC"
    print(f"\n{done.stderr}")


UNDECLARED_INPUTS = [
    {"name": "FEATURES", "datatype": "FP32", "dims": [16]},
    {"name": "COUNT", "datatype": "INT64", "dims": [1]},
]
UNDECLARED_OUTPUTS = [
    {"name": "SCORE", "datatype": "FP32", "dims": [1]},
    {"name": "LABEL", "datatype": "INT32", "dims": [1]},
]


def test_a_model_without_declared_tensors_needs_them_configured(
    tmp_path: Path, topics: Topics, kserve_undeclared: KServeEndpoint
) -> None:
    client = grpcclient.InferenceServerClient(kserve_undeclared.grpc_url)
    try:
        metadata = client.get_model_metadata(MODEL, as_json=True)
    finally:
        client.close()
    assert not metadata.get("inputs") and not metadata.get("outputs"), metadata
    bare = _check(tmp_path, topics, kserve_undeclared, MODEL)
    assert bare.returncode == 2, bare.stdout + bare.stderr
    assert "model.inputs" in bare.stderr, bare.stderr
    print(f"\n{bare.stderr}")
    done = _check(
        tmp_path,
        topics,
        kserve_undeclared,
        MODEL,
        inputs=UNDECLARED_INPUTS,
        outputs=UNDECLARED_OUTPUTS,
    )
    assert done.returncode == 0, done.stderr
    assert "input  FEATURES (FP32 [16])" in done.stdout, done.stdout
    print(done.stdout)


# --- the consumer end to end: Pub/Sub emulator -> KServe -> PostgreSQL ----------------------


def consumer_config(
    topics: Topics, kserve: KServeEndpoint, postgres: PostgresEndpoint, table: str, **extra: Any
) -> ConsumerConfig:
    source = {
        "kind": "pubsub",
        "subscription": topics.subscription,
        "dead_letter_topic": topics.dlq_topic,
        **extra.pop("source", {}),
    }
    return ConsumerConfig.model_validate(
        {
            "source": source,
            "model": {"url": kserve.grpc_url, "name": MODEL},  # nothing else: discovered
            "binding": BINDING,
            "sink": {"kind": "postgres", "dsn": postgres.dsn, "table": table},
            "server": {"port": 0},
            "log_format": "text",
            **extra,
        }
    )


def chunks_of(
    features: np.ndarray, counts: np.ndarray, size: int, tag: str, first_id: int = 0
) -> list[EncodedChunk]:
    out = []
    for n, start in enumerate(range(0, len(features), size)):
        sl = slice(start, start + size)
        cols = {
            "id": np.arange(first_id + start, first_id + start + len(features[sl]), dtype=np.int64),
            "features": features[sl],
            "count": counts[sl, 0],
        }
        out.append(encode_chunk("events", cols, "arrow" if n % 2 else "json", f"{tag}-{n}"))
    return out


def dead_lettered(registry: CollectorRegistry) -> dict[str, float]:
    return {
        s.labels["reason"]: s.value
        for m in registry.collect()
        for s in m.samples
        if s.name == "rowbatch_messages_dead_lettered_total" and s.value
    }


def counter(registry: CollectorRegistry, name: str) -> float:
    return sum(s.value for m in registry.collect() for s in m.samples if s.name == name)


def stored(dsn: str, table: str) -> dict[int, tuple[float, int, str]]:
    with psycopg.connect(dsn) as conn:
        found = conn.execute(f"SELECT id, score, label, model_version FROM {table}").fetchall()
    out = {int(i): (float(s), int(lab), str(v)) for i, s, lab, v in found}
    assert len(out) == len(found), "a row was written twice"
    return out


def assert_exact(got: dict[int, tuple[float, int, str]], features: np.ndarray, counts: np.ndarray,
                 ids: np.ndarray, version: str) -> None:  # fmt: skip
    want_scores, want_labels = score(features, counts)
    assert set(got) == {int(i) for i in ids}
    scores = np.array([got[int(i)][0] for i in ids], dtype=np.float64)
    # The column is PostgreSQL REAL (float4): read back, each value is the float32 sent.
    np.testing.assert_array_equal(scores.astype(np.float32), want_scores[:, 0])
    assert [got[int(i)][1] for i in ids] == want_labels[:, 0].tolist()
    assert {v for _, _, v in got.values()} == {version}


async def test_20k_rows_every_row_once_with_exact_values(
    topics: Topics, kserve: KServeEndpoint, postgres: PostgresEndpoint
) -> None:
    total = 20_000
    features, counts = rows(total, seed=5)
    chunks = chunks_of(features, counts, 400, "k")
    table = f"kserve_e2e_{topics.subscription.rsplit('-', 1)[1]}"
    topics.publish(chunks)
    async with consumer_running(consumer_config(topics, kserve, postgres, table)) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry
        await wait_until(
            lambda: counter(registry, "rowbatch_messages_acked_total") == len(chunks),
            300,
            f"{len(chunks)} acked",
            run.task,
        )
        await run.stop_and_wait()
        assert dead_lettered(registry) == {}
        assert counter(registry, "rowbatch_rows_written_total") == total
        assert registry.get_sample_value("rowbatch_target_batch_size") == 256
    assert_exact(stored(postgres.dsn, table), features, counts, np.arange(total), "1")


async def test_rows_the_model_rejects_are_dead_lettered_and_the_rest_written(
    topics: Topics, kserve: KServeEndpoint, postgres: PostgresEndpoint
) -> None:
    """InvalidInput -> INVALID_ARGUMENT -> poison: the batch is bisected by message, then the
    message holding the rejected row by row: that row alone is dead-lettered, as a row part
    of its message (``rejected-by-model``, KServe's message kept); every other row is
    written."""
    features, counts = rows(3000, seed=6)
    counts[1234, 0] = INVALID_COUNT  # in message p-12 (rows 1200..1299)
    chunks = chunks_of(features, counts, 100, "p")
    bad = chunks[12]
    table = f"kserve_poison_{topics.subscription.rsplit('-', 1)[1]}"
    ids = topics.publish(chunks)
    async with consumer_running(consumer_config(topics, kserve, postgres, table)) as run:
        await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
        registry = run.running[0].metrics.registry

        def settled() -> float:
            acked = counter(registry, "rowbatch_messages_acked_total")
            return acked + sum(dead_lettered(registry).values())

        await wait_until(lambda: settled() == len(chunks), 120, "all settled", run.task)
        await run.stop_and_wait()
        assert dead_lettered(registry) == {}
        assert counter(registry, "rowbatch_rows_dead_lettered_total") == 1
    [dead] = topics.dead_letters(expect=1)
    assert dead.attributes[ATTR_REASON] == "rejected-by-model"
    assert dead.attributes[ATTR_MESSAGE_ID] == ids[12]
    assert dead.attributes["rowbatch-parent-chunk-id"] == bad.headers.chunk_id
    assert dead.attributes["rowbatch-parent-rows"] == "34"
    part = decode_chunk(dead.data, dict(dead.attributes))
    assert part.row_count == 1
    message = dead.attributes[ATTR_MESSAGE]
    assert "INVALID_ARGUMENT" in message and f"COUNT {INVALID_COUNT}" in message, message
    good = np.array([i for i in range(3000) if i != 1234])
    assert_exact(stored(postgres.dsn, table), features[good], counts[good], good, "1")


async def test_a_model_that_raises_is_nacked_until_attempts_run_out_and_the_consumer_stays_up(
    pubsub: PubSubEndpoint,
    kserve: KServeEndpoint,
    postgres: PostgresEndpoint,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plain exception -> INTERNAL -> fatal class: the consumer logs "inference failed for
    good", nacks the batch's messages and keeps running. The broker redelivers; past
    ``source.max_delivery_attempts`` the message is dead-lettered as ``too-many-attempts``.
    Messages published after it are written. (The crashing message is published alone here;
    among others, the batch is bisected so that only it is nacked: the next test.)"""
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    topics = Topics.create(pubsub, policy_max_attempts=10)
    try:
        features, counts = rows(600, seed=7)
        counts[50, 0] = CRASH_COUNT
        crashing = chunks_of(features[:100], counts[:100], 100, "crash")
        good_chunks = chunks_of(features[100:], counts[100:], 100, "after", first_id=100)
        table = f"kserve_crash_{topics.subscription.rsplit('-', 1)[1]}"
        cfg = consumer_config(topics, kserve, postgres, table, source={"max_delivery_attempts": 2})
        [crash_id] = topics.publish(crashing)
        async with consumer_running(cfg) as run:
            await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
            registry = run.running[0].metrics.registry
            await wait_until(
                lambda: dead_lettered(registry) == {"too-many-attempts": 1},
                120,
                "the crashing message dead-lettered",
                run.task,
            )
            assert counter(registry, "rowbatch_messages_nacked_total") >= 2
            errors = {
                s.labels["kind"]: s.value
                for m in registry.collect()
                for s in m.samples
                if s.name == "rowbatch_inference_errors_total" and s.value
            }
            assert errors.get("other", 0) >= 2, errors  # INTERNAL is counted as "other"
            assert counter(registry, "rowbatch_rows_written_total") == 0
            topics.publish(good_chunks)
            await wait_until(
                lambda: counter(registry, "rowbatch_messages_acked_total") == len(good_chunks),
                120,
                "the later messages written",
                run.task,
            )
            assert not run.task.done()
            await run.stop_and_wait()
        [dead] = topics.dead_letters(expect=1)
        assert dead.attributes[ATTR_REASON] == "too-many-attempts"
        assert dead.attributes[ATTR_MESSAGE_ID] == crash_id
        ids = np.arange(100, 600)
        assert_exact(stored(postgres.dsn, table), features[100:], counts[100:], ids, "1")
    finally:
        topics.close()


async def test_a_crashing_message_among_ten_is_isolated_and_only_it_dead_lettered(
    pubsub: PubSubEndpoint,
    kserve: KServeEndpoint,
    postgres: PostgresEndpoint,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Ten messages published together, one with a row the model raises on (INTERNAL), in one
    batch: the batch is bisected, the nine good messages written once and acked, the crashing
    one nacked alone until ``max_delivery_attempts`` (3) runs out, then dead-lettered as
    ``too-many-attempts``: no good message spends its attempts with it."""
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)
    topics = Topics.create(pubsub, policy_max_attempts=10)
    try:
        features, counts = rows(200, seed=8)
        counts[87, 0] = CRASH_COUNT  # message 4 (rows 80..99)
        chunks = chunks_of(features, counts, 20, "ten")
        table = f"kserve_ten_{topics.subscription.rsplit('-', 1)[1]}"
        cfg = consumer_config(
            topics,
            kserve,
            postgres,
            table,
            source={"max_delivery_attempts": 3},
            # 200 rows < 256 a batch: wait long enough for all ten to share one.
            model={"url": kserve.grpc_url, "name": MODEL, "max_wait_ms": 2000},
        )
        ids = topics.publish(chunks)
        with caplog.at_level("WARNING", logger="rowbatch.consumer.engine.inference_stage"):
            async with consumer_running(cfg) as run:
                await wait_until(lambda: bool(run.running), 60, "consumer start", run.task)
                registry = run.running[0].metrics.registry
                await wait_until(
                    lambda: (
                        dead_lettered(registry) == {"too-many-attempts": 1}
                        and counter(registry, "rowbatch_messages_acked_total") == 9
                    ),
                    180,
                    "nine acked and the crashing message dead-lettered",
                    run.task,
                )
                assert counter(registry, "rowbatch_rows_written_total") == 180  # once each
                assert counter(registry, "rowbatch_messages_nacked_total") >= 2
                await run.stop_and_wait()
        assert "inference failed for good on 1 of the batch's" in caplog.text, caplog.text
        [dead] = topics.dead_letters(expect=1)
        assert dead.attributes[ATTR_REASON] == "too-many-attempts"
        assert dead.attributes[ATTR_MESSAGE_ID] == ids[4]
        good = np.array([i for i in range(200) if not 80 <= i < 100])
        assert_exact(stored(postgres.dsn, table), features[good], counts[good], good, "1")
    finally:
        topics.close()
