"""Tracing end to end on the real services: the producer CLI (``--trace``) publishes to Kafka or
the Pub/Sub emulator, a consumer process (``[tracing] enabled``) infers through Triton's chaos
model into PostgreSQL, and both send spans by OTLP to a real Jaeger; the test then reads the
spans back through Jaeger's query API and checks:

- every message has one producer ``send`` span and one consumer ``process`` span, the child of
  it (matched by the broker's message id), ended ``acked`` or ``dead_lettered``;
- the ``infer`` spans (with their ``links`` children past the link limit, 8 here) link to the
  producer spans of exactly the messages they carried: per message, the rows the links name
  add up to the message's rows; each has a gRPC request span under it with the endpoint;
- the poison message's trace ends in a ``dead-letter`` span with its reason, and an
  ``isolate`` span sits under the request that carried it;
- a model-server outage (the chaos model answering UNAVAILABLE for 3 s) shows as ``backoff``
  spans under the request that waited;
- sink writes have spans linked to the requests whose rows they wrote;
- (Kafka) after a kill -9 and a restart, the messages the second consumer processed (those the
  first had not committed) are children of their original producer spans.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.chaos import ChaosControl
from harness.consumer_process import ConsumerProcess, to_toml
from harness.jaeger import JaegerEndpoint, attribute
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.proc import free_port
from harness.pubsub import PubSubEndpoint
from harness.service import REPO_ROOT
from harness.triton import TritonEndpoint
from rowbatch.consumer.service.config import load_config
from tests.integration.consumer_helpers import Topics
from tests.integration.kafka_helpers import KafkaTopics
from tests.integration.pubsub_helpers import use_emulator
from tests.integration.test_dlq_tools import table_rows

MARKER = "POISON-ROW"
ROWS = 3
"""Rows per message."""
LINK_LIMIT = 8
WAIT_S = 120.0


@dataclass
class Rig:
    name: str
    source: dict[str, Any]
    broker_args: list[str]
    env: dict[str, str]


@pytest.fixture(params=["kafka", "pubsub"])
def rig(
    request: pytest.FixtureRequest, triton: TritonEndpoint, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    ChaosControl().write(triton.chaos_control)
    if request.param == "kafka":
        yield kafka_rig(request.getfixturevalue("kafka"))
    else:
        pubsub: PubSubEndpoint = request.getfixturevalue("pubsub")
        use_emulator(pubsub, monkeypatch)
        topics = Topics.create(pubsub)
        source = topics.source()
        args = ["--broker", "pubsub", "--topic", topics.topic, "--emulator-host", pubsub.host]
        try:
            yield Rig("pubsub", source, args, pubsub.env())
        finally:
            topics.close()
    ChaosControl().write(triton.chaos_control)


def kafka_rig(kafka: KafkaEndpoint) -> Rig:
    t = asyncio.run(KafkaTopics.create(kafka, partitions=2))
    source = t.source()
    args = ["--broker", "kafka", "--bootstrap", t.bootstrap, "--topic", t.topic]
    return Rig("kafka", source, args, {})


def write_input(path: Path, messages: int, first_id: int, poison: int | None) -> None:
    """``messages`` x ``ROWS`` rows as JSON Lines; message ``poison``'s second row carries the
    marker the chaos model rejects."""
    with path.open("w") as out:
        for m in range(messages):
            for r in range(ROWS):
                text = f"message {m} row {r}" + (f" {MARKER}" if m == poison and r == 1 else "")
                out.write(json.dumps({"id": first_id + m * ROWS + r, "text": text}) + "\n")


def publish(rig: Rig, jaeger: JaegerEndpoint, path: Path, service: str) -> None:
    """The producer CLI, tracing on, one message per ``ROWS`` rows."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rowbatch.producer",
            "publish",
            *rig.broker_args,
            "--file",
            str(path),
            "--chunk-rows",
            str(ROWS),
            "--table",
            "docs",
            "--trace",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
        env={
            **os.environ,
            **rig.env,
            "OTEL_EXPORTER_OTLP_ENDPOINT": jaeger.otlp,
            "OTEL_SERVICE_NAME": service,
        },
        check=False,
    )
    assert done.returncode == 0, (done.stdout, done.stderr)


def start_consumer(
    tmp_path: Path,
    name: str,
    rig: Rig,
    triton: TritonEndpoint,
    jaeger: JaegerEndpoint,
    table: str,
    dsn: str,
    *,
    batch_size: int | None = None,
    max_in_flight: int | None = None,
) -> ConsumerProcess:
    port = free_port()
    model: dict[str, Any] = {"url": triton.grpc_url, "name": "chaos", "max_wait_ms": 50}
    if batch_size is not None:
        model["batch_size"] = batch_size
    if max_in_flight is not None:
        model["max_in_flight"] = max_in_flight
    config = {
        "source": rig.source,
        "model": model,
        "binding": {
            "inputs": {"text": "TEXT"},
            "outputs": {"EMBEDDING": "embedding"},
            "passthrough": {"id": "int64"},
        },
        "sink": {"kind": "postgres", "dsn": dsn, "table": table},
        "server": {"host": "127.0.0.1", "port": port},
        "tracing": {
            "enabled": True,
            "endpoint": jaeger.otlp,
            "service_name": name,
            "link_limit": LINK_LIMIT,
        },
        "log_format": "json",
    }
    path = tmp_path / f"{name}.toml"
    path.write_text(to_toml(config))
    load_config(path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROWBATCH_", "OTEL_"))}
    proc = ConsumerProcess(name, path, tmp_path / f"{name}.log", port, env | rig.env)
    proc.start()
    return proc


def wait_for(predicate: Callable[[], bool], what: str, proc: ConsumerProcess | None = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if proc is not None:
            proc.check_alive(what)
        if time.monotonic() > deadline:
            tail = f"\n{proc.log()}" if proc is not None else ""
            raise AssertionError(f"timed out waiting for {what}{tail}")
        time.sleep(0.2)


def settled(proc: ConsumerProcess) -> float:
    return (proc.metric("rowbatch_messages_acked_total") or 0.0) + (
        proc.metric("rowbatch_messages_dead_lettered_total") or 0.0
    )


def spans_of(jaeger: JaegerEndpoint, service: str, name_prefix: str, count: int) -> list[Any]:
    """The spans of ``service`` named ``name_prefix...``, once at least ``count`` are stored."""
    found: list[Any] = []

    def enough() -> bool:
        nonlocal found
        found = [s for s in jaeger.spans(service) if s["name"].startswith(name_prefix)]
        return len(found) >= count

    wait_for(enough, f"{count} {name_prefix!r} spans of {service} in Jaeger")
    return found


def rows_in(dsn: str, table: str) -> int:
    return table_rows(dsn, table)[0]


def ancestors(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    while (parent := by_id.get(span.get("parentSpanId", ""))) is not None:
        out.append(parent)
        span = parent
    return out


@pytest.mark.timeout(600)
def test_spans_link_each_request_to_the_messages_it_carried(
    rig: Rig,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    jaeger: JaegerEndpoint,
    tmp_path: Path,
) -> None:
    uid = uuid.uuid4().hex[:8]
    producer, consumer = f"producer-{rig.name}-{uid}", f"consumer-{rig.name}-{uid}"
    table = f"traced_{uid}"
    ChaosControl(reject_marker=MARKER).write(triton.chaos_control)
    first, poison = 30, 7
    write_input(tmp_path / "first.jsonl", first, 0, poison)
    publish(rig, jaeger, tmp_path / "first.jsonl", producer)
    proc = start_consumer(tmp_path, consumer, rig, triton, jaeger, table, postgres.dsn)
    try:
        wait_for(lambda: settled(proc) >= first, "the first wave settled", proc)
        # An outage: every request answers UNAVAILABLE for 3 s, so requests back off.
        ChaosControl.unavailable_for(3.0).write(triton.chaos_control)
        second = 4
        write_input(tmp_path / "second.jsonl", second, 10_000, None)
        publish(rig, jaeger, tmp_path / "second.jsonl", producer)
        wait_for(lambda: settled(proc) >= first + second, "the second wave settled", proc)
        assert proc.terminate() == 0  # SIGTERM: the consumer exports what it buffered
    finally:
        proc.stop()
        ChaosControl().write(triton.chaos_control)
    messages = first + second
    # The poison row is dead-lettered as a row part; its message's other rows are written.
    assert rows_in(postgres.dsn, table) == messages * ROWS - 1

    sends = spans_of(jaeger, producer, "send ", messages)
    processes = spans_of(jaeger, consumer, "process ", messages)
    assert len(sends) == messages
    assert len(processes) == messages
    send_by_message = {attribute(s, "messaging.message.id"): s for s in sends}
    assert len(send_by_message) == messages

    # Each message's consumer span is the child of its producer span, in the same trace.
    outcomes: dict[str, int] = defaultdict(int)
    for span in processes:
        send = send_by_message[attribute(span, "messaging.message.id")]
        assert (span["traceId"], span["parentSpanId"]) == (send["traceId"], send["spanId"])
        outcomes[attribute(span, "rowbatch.outcome")] += 1
    assert outcomes == {"acked": messages}

    # Requests: the links (on the span and its "links" children) name every message's rows once.
    everything = jaeger.spans(consumer)
    by_id = {s["spanId"]: s for s in everything}
    infers = [s for s in everything if s["name"] == "infer chaos"]
    link_parts = [s for s in everything if s["name"] == "infer chaos links"]
    send_rows: dict[str, int] = defaultdict(int)
    for span in infers + link_parts:
        assert len(span.get("links") or []) <= LINK_LIMIT
        for link in span.get("links") or []:
            send_rows[link["spanId"]] += attribute(link, "rowbatch.rows")
    for span in infers:
        parts = [p for p in link_parts if p.get("parentSpanId") == span["spanId"]]
        linked = len(span.get("links") or []) + sum(len(p["links"]) for p in parts)
        assert linked == attribute(span, "messaging.batch.message_count")
    assert send_rows == {s["spanId"]: ROWS for s in sends}
    assert link_parts, "no request carried more than LINK_LIMIT messages: the split is untested"

    # Each request has a gRPC span under it naming the server.
    requests = [s for s in everything if s["name"].endswith("/ModelInfer")]
    assert {by_id[r["parentSpanId"]]["name"] for r in requests if "parentSpanId" in r} >= {
        "infer chaos"
    }
    assert all(attribute(r, "server.address") == "127.0.0.1" for r in requests)

    # The poison message: its own trace holds a dead-letter span with the reason (its bad row's
    # part), and its request was isolated.
    (poison_send,) = [
        s
        for s in sends
        if any(x["name"].startswith("dead-letter") for x in jaeger.trace(s["traceId"]))
    ]
    carriers = [
        i
        for i in infers
        if poison_send["spanId"]
        in {
            link["spanId"]
            for span in [i, *(p for p in link_parts if p.get("parentSpanId") == i["spanId"])]
            for link in span.get("links") or []
        }
    ]
    assert [attribute(c, "rowbatch.outcome") for c in carriers] == ["isolated"]
    assert any(
        s["name"] == "isolate" and s["parentSpanId"] == carriers[0]["spanId"] for s in everything
    )
    dead = [s for s in jaeger.trace(poison_send["traceId"]) if s["name"].startswith("dead-letter")]
    assert len(dead) == 1
    assert attribute(dead[0], "rowbatch.dlq.reason") == "rejected-by-model"

    # The outage: backoff spans under a request.
    backoffs = [s for s in everything if s["name"] == "backoff"]
    assert backoffs, "no backoff span during the outage"
    for backoff in backoffs:
        assert any(a["name"] == "infer chaos" for a in ancestors(backoff, by_id))

    snapshot = os.environ.get("ROWBATCH_TRACE_SNAPSHOT")
    if snapshot:  # the README's picture (harness/trace_view.py)
        panels = {
            f"{rig.name}: a poison message, published, processed and dead-lettered": jaeger.trace(
                poison_send["traceId"]
            ),
            f"{rig.name}: the request that carried it (isolated)": jaeger.trace(
                carriers[0]["traceId"]
            ),
            f"{rig.name}: a request during the outage": jaeger.trace(backoffs[0]["traceId"]),
        }
        Path(f"{snapshot}.{rig.name}.json").write_text(json.dumps(panels))

    # Sink writes link to the requests whose rows they wrote.
    writes = [s for s in everything if s["name"] == "write postgres"]
    assert writes
    infer_ids = {s["spanId"] for s in infers}
    assert all({link["spanId"] for link in w.get("links") or []} <= infer_ids for w in writes)
    assert sum(attribute(w, "rowbatch.rows") for w in writes) >= (messages - 1) * ROWS


@pytest.mark.timeout(600)
def test_redelivered_messages_keep_their_producer_context_after_a_kill(
    kafka: KafkaEndpoint,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    jaeger: JaegerEndpoint,
    tmp_path: Path,
) -> None:
    rig = kafka_rig(kafka)
    uid = uuid.uuid4().hex[:8]
    producer = f"producer-restart-{uid}"
    table = f"traced_{uid}"
    messages = 40
    # One message per request, one request at a time, 0.25 s each: the kill lands with most
    # messages not yet done. (With requests in parallel, Triton's dynamic batching ran them in
    # a few executes, and every row was written before the kill on a CI run.)
    ChaosControl(delay_s=0.25).write(triton.chaos_control)
    write_input(tmp_path / "rows.jsonl", messages, 0, None)
    publish(rig, jaeger, tmp_path / "rows.jsonl", producer)
    first = start_consumer(
        tmp_path,
        f"first-{uid}",
        rig,
        triton,
        jaeger,
        table,
        postgres.dsn,
        batch_size=ROWS,
        max_in_flight=1,
    )
    second: ConsumerProcess | None = None
    try:
        wait_for(lambda: rows_in(postgres.dsn, table) >= 5 * ROWS, "some rows written", first)
        first.send(signal.SIGKILL)
        first.wait(30)
        assert rows_in(postgres.dsn, table) < messages * ROWS, "the kill came too late"
        ChaosControl().write(triton.chaos_control)
        second = start_consumer(tmp_path, f"second-{uid}", rig, triton, jaeger, table, postgres.dsn)
        wait_for(lambda: rows_in(postgres.dsn, table) >= messages * ROWS, "every row", second)
        assert second.terminate() == 0
    finally:
        first.stop()
        if second is not None:
            second.stop()
        ChaosControl().write(triton.chaos_control)

    sends = spans_of(jaeger, producer, "send ", messages)
    send_by_message = {attribute(s, "messaging.message.id"): s for s in sends}
    # the second consumer's spans reach Jaeger a moment after its exit (export, then storage)
    redelivered = spans_of(jaeger, f"second-{uid}", "process ", 1)
    for span in redelivered:
        send = send_by_message[attribute(span, "messaging.message.id")]
        assert (span["traceId"], span["parentSpanId"]) == (send["traceId"], send["spanId"])
        assert attribute(span, "rowbatch.outcome") == "acked"
