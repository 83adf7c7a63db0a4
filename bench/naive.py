"""A consumer written "the common way", for comparison (section 3): each message is decoded,
sent to Triton as its own request, written to PostgreSQL with ``executemany`` and committed,
then acked (Pub/Sub: ``message.ack()`` in the client library's callback threads) or committed
(Kafka: one record at a time). No rows of different messages ever share a request.

    python -m bench.naive --broker kafka --bootstrap HOST:PORT --topic T --group G \
        --triton HOST:PORT --model embedder --dsn postgresql://... --table T --rows N

Runs until ``--rows`` rows are written or ``--timeout-s`` passes, then prints one JSON line:
``{"rows": ..., "seconds": ..., "messages": ...}`` (seconds from the first row written to the
last).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
import tritonclient.grpc as grpcclient
from aiokafka import AIOKafkaConsumer
from google.cloud import pubsub_v1

from bench.help_text import description
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.headers.fields import kafka_headers_to_attributes

_CREATE = """CREATE TABLE IF NOT EXISTS {table} (
    chunk_id text NOT NULL, row_index bigint NOT NULL, id bigint, embedding real[],
    processed_at timestamptz DEFAULT now(), PRIMARY KEY (chunk_id, row_index))"""
_INSERT = (
    "INSERT INTO {table} (chunk_id, row_index, id, embedding) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT DO NOTHING"
)


@dataclass
class Progress:
    rows: int = 0
    messages: int = 0
    first_at: float | None = None
    last_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)

    def add(self, rows: int, target: int) -> None:
        with self.lock:
            now = time.monotonic()
            if self.first_at is None:
                self.first_at = now
            self.rows += rows
            self.messages += 1
            self.last_at = now
            if self.rows >= target:
                self.done.set()


def handle(
    payload: bytes,
    attributes: Mapping[str, str],
    *,
    triton: Any,
    model: str,
    conn: psycopg.Connection[Any],
    table: str,
) -> int:
    """Decode one message, one inference call, write its rows, commit: its row count."""
    chunk = decode_chunk(payload, attributes)
    texts = np.array([[t.encode()] for t in chunk.columns["text"]], dtype=np.object_)
    tensor = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(texts)
    embeddings = triton.infer(model, [tensor]).as_numpy("EMBEDDING")
    ids = chunk.columns["id"]
    with conn.cursor() as cur:
        cur.executemany(
            _INSERT.format(table=table),
            [
                (chunk.chunk_id, i, int(ids[i]), embeddings[i].tolist())
                for i in range(chunk.row_count)
            ],
        )
    conn.commit()
    return chunk.row_count


def run_pubsub(args: argparse.Namespace, progress: Progress) -> None:
    local = threading.local()

    def callback(message: Any) -> None:
        if not hasattr(local, "conn"):
            local.conn = psycopg.connect(args.dsn)
            local.triton = grpcclient.InferenceServerClient(args.triton)
        rows = handle(
            message.data,
            dict(message.attributes),
            triton=local.triton,
            model=args.model,
            conn=local.conn,
            table=args.table,
        )
        message.ack()
        progress.add(rows, args.rows)

    subscriber = pubsub_v1.SubscriberClient()
    future = subscriber.subscribe(args.subscription, callback)
    try:
        progress.done.wait(args.timeout_s)
    finally:
        future.cancel()
        subscriber.close()


async def run_kafka(args: argparse.Namespace, progress: Progress) -> None:
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    triton = grpcclient.InferenceServerClient(args.triton)
    deadline = time.monotonic() + args.timeout_s
    await consumer.start()
    try:
        with psycopg.connect(args.dsn) as conn:
            while not progress.done.is_set() and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=500, max_records=1)
                for _, records in batch.items():
                    for record in records:
                        attrs = kafka_headers_to_attributes(record.headers)
                        rows = handle(
                            record.value, attrs, triton=triton, model=args.model, conn=conn,
                            table=args.table,
                        )  # fmt: skip
                        await consumer.commit()
                        progress.add(rows, args.rows)
    finally:
        await consumer.stop()
        triton.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.naive", description=description(__doc__))
    parser.add_argument("--broker", choices=["pubsub", "kafka"], required=True)
    parser.add_argument("--subscription", help="Pub/Sub: projects/P/subscriptions/S")
    parser.add_argument("--bootstrap", help="Kafka: host:port")
    parser.add_argument("--topic", help="Kafka topic")
    parser.add_argument("--group", help="Kafka group id")
    parser.add_argument("--triton", required=True, help="Triton gRPC host:port")
    parser.add_argument("--model", default="embedder")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, default=60.0)
    args = parser.parse_args(argv)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(_CREATE.format(table=args.table))
    progress = Progress()
    if args.broker == "pubsub":
        run_pubsub(args, progress)
    else:
        asyncio.run(run_kafka(args, progress))
    seconds = progress.last_at - progress.first_at if progress.first_at is not None else 0.0
    print(json.dumps({"rows": progress.rows, "messages": progress.messages, "seconds": seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
