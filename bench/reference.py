"""A simple reference consumer for the saturation section (``bench/saturation.py``): what a team
would write first, done properly, following each client library's own pattern.

Per message it decodes the chunk, sends its rows to Triton as requests of their own (numeric
rows: FEATURES, COUNT -> SCORE; a message over ``--max-batch`` rows, the model's
``max_batch_size``, as consecutive requests of at most that many rows) and writes them to
PostgreSQL (``executemany`` INSERT + COMMIT on the thread's own connection). Rows of different
messages never share a request. Whether concurrent requests share an *execution* depends on the
model, not on this client: the one-instance ``fixed_latency`` has no dynamic batching, so every
request is an execution of its own (a 1-row message costs a whole 8 ms execution, and no client
of this kind passes ~125 messages/s); ``fixed_latency_batched`` (dynamic batching, two
instances) merges the requests that wait together.

- Pub/Sub: Google's subscriber pattern, ``SubscriberClient.subscribe`` (streaming pull) with a
  callback per message on ``--threads`` threads and flow control of ``--pull`` messages; each
  message is acked by its callback as soon as its rows are committed.
- Kafka: aiokafka ``getmany`` of up to ``--pull`` records, handled on ``--threads`` threads,
  then one commit once all of them are written (Kafka commits an offset, so a record cannot be
  acknowledged alone out of order).

    python -m bench.reference --broker kafka --bootstrap HOST:PORT --topic T --group G \
        --triton HOST:PORT --model fixed_latency --dsn postgresql://... --table T --rows N

Runs until ``--rows`` rows are written or ``--timeout-s`` passes (from its first message), then
prints one JSON line: ``{"rows", "messages", "seconds", "first_rows"}`` (seconds from the
first message written to the last; ``first_rows``: the rows of that first message).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
import tritonclient.grpc as grpcclient
from aiokafka import AIOKafkaConsumer
from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

from bench.help_text import description
from rowbatch.wire.chunks.decode import decode_chunk
from rowbatch.wire.headers.fields import kafka_headers_to_attributes

_CREATE = """CREATE TABLE IF NOT EXISTS {table} (
    chunk_id text NOT NULL, row_index bigint NOT NULL, id bigint, score real,
    processed_at timestamptz DEFAULT now(), PRIMARY KEY (chunk_id, row_index))"""
_INSERT = (
    "INSERT INTO {table} (chunk_id, row_index, id, score) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT DO NOTHING"
)


@dataclass
class Progress:
    rows: int = 0
    messages: int = 0
    first_at: float | None = None
    first_rows: int = 0
    last_at: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, rows: int) -> None:
        with self.lock:
            now = time.monotonic()
            if self.first_at is None:
                self.first_at, self.first_rows = now, rows
            self.rows += rows
            self.messages += 1
            self.last_at = now


class Worker:
    """Per thread: one Triton client and one PostgreSQL connection."""

    def __init__(self, args: argparse.Namespace, progress: Progress) -> None:
        self.args = args
        self.progress = progress
        self.local = threading.local()

    def handle(self, payload: bytes, attributes: Mapping[str, str]) -> int:
        """Decode one message, one inference request, write its rows, commit."""
        local = self.local
        if not hasattr(local, "conn"):
            local.conn = psycopg.connect(self.args.dsn)
            local.triton = grpcclient.InferenceServerClient(self.args.triton)
        chunk = decode_chunk(payload, attributes)
        rows = chunk.row_count
        features = np.asarray(chunk.columns["features"], dtype=np.float32).reshape(rows, -1)
        count = np.asarray(chunk.columns["count"], dtype=np.int64).reshape(rows, 1)
        step = self.args.max_batch
        scores = np.concatenate(
            [self.infer(features[i : i + step], count[i : i + step]) for i in range(0, rows, step)]
        )
        ids = np.asarray(chunk.columns["id"], dtype=np.int64)
        conn: psycopg.Connection[Any] = local.conn
        with conn.cursor() as cur:
            cur.executemany(
                _INSERT.format(table=self.args.table),
                [(chunk.chunk_id, i, int(ids[i]), float(scores[i, 0])) for i in range(rows)],
            )
        conn.commit()
        self.progress.add(rows)
        return rows

    def infer(self, features: np.ndarray[Any, Any], count: np.ndarray[Any, Any]) -> Any:
        tensors = [
            grpcclient.InferInput("FEATURES", list(features.shape), "FP32"),
            grpcclient.InferInput("COUNT", list(count.shape), "INT64"),
        ]
        tensors[0].set_data_from_numpy(np.ascontiguousarray(features))
        tensors[1].set_data_from_numpy(np.ascontiguousarray(count))
        return self.local.triton.infer(self.args.model, tensors).as_numpy("SCORE")


def _all(pool: ThreadPoolExecutor, jobs: Sequence[Callable[[], int]]) -> int:
    """Run every job on the pool and wait for all: the rows written."""
    return sum(f.result() for f in [pool.submit(job) for job in jobs])


def run_pubsub(args: argparse.Namespace, worker: Worker, pool: ThreadPoolExecutor) -> None:
    """Streaming pull with a callback per message that acks it once its rows are written."""
    subscriber = pubsub_v1.SubscriberClient()
    done = threading.Event()
    failed: list[BaseException] = []

    def callback(message: Any) -> None:
        try:
            worker.handle(message.data, dict(message.attributes))
        except Exception as exc:  # noqa: BLE001 - reported after the run; the message is nacked
            failed.append(exc)
            message.nack()
            done.set()
            return
        message.ack()
        if worker.progress.rows >= args.rows:
            done.set()

    future = subscriber.subscribe(
        args.subscription,
        callback,
        flow_control=pubsub_v1.types.FlowControl(max_messages=args.pull),
        scheduler=ThreadScheduler(pool),
    )
    try:
        while not done.wait(0.05):
            first = worker.progress.first_at
            if first is not None and time.monotonic() > first + args.timeout_s:
                break
    finally:
        future.cancel()
        with contextlib.suppress(Exception):  # cancelled: the stream's end is not an error
            future.result(timeout=30)
        subscriber.close()
    if failed:
        raise failed[0]


async def run_kafka(args: argparse.Namespace, worker: Worker, pool: ThreadPoolExecutor) -> None:
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=args.pull,
    )
    loop = asyncio.get_running_loop()
    deadline: float | None = None
    await consumer.start()
    try:
        while worker.progress.rows < args.rows:
            if deadline is not None and time.monotonic() > deadline:
                break
            batch = await consumer.getmany(timeout_ms=500, max_records=args.pull)
            records = [r for part in batch.values() for r in part]
            if not records:
                continue
            if deadline is None:
                deadline = time.monotonic() + args.timeout_s
            jobs = [
                lambda r=r: worker.handle(r.value, kafka_headers_to_attributes(r.headers))
                for r in records
            ]
            await loop.run_in_executor(None, _all, pool, jobs)
            await consumer.commit()
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reference", description=description(__doc__)
    )
    parser.add_argument("--broker", choices=["pubsub", "kafka"], required=True)
    parser.add_argument("--subscription", help="Pub/Sub: projects/P/subscriptions/S")
    parser.add_argument("--bootstrap", help="Kafka: host:port")
    parser.add_argument("--topic", help="Kafka topic")
    parser.add_argument("--group", help="Kafka group id")
    parser.add_argument("--triton", required=True, help="Triton gRPC host:port")
    parser.add_argument("--model", default="fixed_latency")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--rows", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--pull", type=int, default=100, help="messages per pull")
    parser.add_argument("--max-batch", type=int, default=256, help="rows per request at most")
    args = parser.parse_args(argv)
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(_CREATE.format(table=args.table))
    progress = Progress()
    worker = Worker(args, progress)
    with ThreadPoolExecutor(args.threads) as pool:
        if args.broker == "pubsub":
            run_pubsub(args, worker, pool)
        else:
            asyncio.run(run_kafka(args, worker, pool))
    seconds = progress.last_at - progress.first_at if progress.first_at is not None else 0.0
    print(
        json.dumps(
            {
                "rows": progress.rows,
                "messages": progress.messages,
                "seconds": seconds,
                "first_rows": progress.first_rows,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
