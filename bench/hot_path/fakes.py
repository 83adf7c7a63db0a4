"""What the hot-path profile runs the real pipeline with instead of services: pre-encoded
deliveries from a list, a Triton client that encodes the real gRPC request but runs no model,
sinks that encode without storing (PostgreSQL's binary COPY) or store nothing, and the two
example models with their bindings and result tables."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import InferRequestedOutput
from tritonclient.grpc._utils import _get_inference_request

from bench.hot_path.timers import Stages
from harness.model_specs import EMBEDDER, SCORER
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.binding import Binding
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.sinks.base import ColumnSpec, ResultRows, Sink, TableSpec, table_columns
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.postgres import copy_binary
from rowbatch.consumer.sinks.sqlite.sink import SqliteSink
from rowbatch.consumer.sources.delivery import DeadLetterReason, Delivery
from rowbatch.wire.chunks.encode import encode_chunk

MODELS = {"text": EMBEDDER, "numeric": SCORER}
BINDINGS = {
    "text": Binding({"text": "TEXT"}, {"EMBEDDING": "embedding"}, ("id",)),
    "numeric": Binding(
        {"features": "FEATURES", "count": "COUNT"}, {"SCORE": "score", "LABEL": "label"}, ("id",)
    ),
}
TABLES = {
    "text": TableSpec(
        "t", (ColumnSpec("id", "int64"),), (ColumnSpec("embedding", "float32", 384),)
    ),
    "numeric": TableSpec(
        "t",
        (ColumnSpec("id", "int64"),),
        (ColumnSpec("score", "float32"), ColumnSpec("label", "int32")),
    ),
}


class ListSource:
    def __init__(self, deliveries: Sequence[Delivery]) -> None:
        self._deliveries = deliveries
        self.acked = 0

    async def check(self) -> None:
        pass

    async def deliveries(self) -> AsyncIterator[Delivery]:
        for d in self._deliveries:
            yield d

    async def ack(self, delivery: Delivery) -> None:
        self.acked += 1

    async def nack(self, delivery: Delivery) -> None:
        raise AssertionError(f"nacked {delivery.message_id}")

    async def dead_letter(self, delivery: Delivery, reason: DeadLetterReason) -> None:
        raise AssertionError(f"dead-lettered {delivery.message_id}: {reason.message}")

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass

    async def close(self) -> None:
        pass


class VectorListSource(ListSource):
    """``ListSource`` that yields vectors of ``size`` deliveries (as the Kafka and Pub/Sub pull
    sources do) and acks a write's messages at once."""

    def __init__(self, deliveries: Sequence[Delivery], size: int) -> None:
        super().__init__(deliveries)
        self._size = size

    async def vectors(self) -> AsyncIterator[Sequence[Delivery]]:
        for at in range(0, len(self._deliveries), self._size):
            yield self._deliveries[at : at + self._size]

    async def ack_many(self, deliveries: Sequence[Delivery]) -> None:
        self.acked += len(deliveries)


def list_source(deliveries: Sequence[Delivery], vector: int) -> ListSource:
    """One delivery at a time (``vector`` 0), or in vectors of ``vector``."""
    return VectorListSource(deliveries, vector) if vector > 0 else ListSource(deliveries)


class FakeTriton:
    """Encodes the real gRPC request, answers with ready-made outputs (a model doing no work)."""

    def __init__(self, spec: ModelSpec, stages: Stages) -> None:
        self._spec = spec
        self._encode = stages.wrap("grpc", self._request)
        self._answers: dict[int, dict[str, NDArray[Any]]] = {}

    def _request(self, inputs: Sequence[Any], outputs: Sequence[str]) -> int:
        requested = [InferRequestedOutput(name) for name in outputs]
        request = _get_inference_request(
            self._spec.name,
            inputs,
            self._spec.version,
            "",
            requested,
            0,
            False,
            False,
            0,
            None,
            None,
        )
        return len(request.SerializeToString())

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        self._encode(inputs, outputs)
        rows = int(inputs[0].shape()[0])
        if rows not in self._answers:
            self._answers[rows] = {
                t.name: np.ones(
                    (rows, *t.dims), dtype="float32" if t.datatype == "FP32" else "int32"
                )
                for t in self._spec.outputs
            }
        return Answer({name: self._answers[rows][name] for name in outputs})


class PgEncodeSink:
    """The PostgreSQL sink's binary COPY encoding, without a server."""

    def __init__(self) -> None:
        self._columns: tuple[Any, ...] = ()
        self.bytes = 0

    async def open(self, table: TableSpec) -> None:
        pg: Any = copy_binary
        self._columns = tuple(
            pg.PgColumn(c.name, pg.pg_type(c), pg.column_encoder(c), c)
            for c in table_columns(table)
        )

    async def write(self, rows: ResultRows) -> int:
        n, step = len(rows), 2_000
        for lo in range(0, n, step):
            part = slice(lo, min(lo + step, n))
            self.bytes += len(copy_binary.encode_tuples(self._columns, rows, part))
        return n

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        pass

    async def close(self) -> None:
        pass


class NullSink:
    """Stores nothing: the sink's own cost is per row, not per message."""

    async def open(self, table: TableSpec) -> None:
        pass

    async def write(self, rows: ResultRows) -> int:
        return len(rows)

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        pass

    async def close(self) -> None:
        pass


def make_deliveries(encoding: str, kind: str, messages: int, rows: int) -> list[Delivery]:
    rng = np.random.default_rng(7)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyz      0123456789éü"), dtype=object)
    out = []
    for m in range(messages):
        ids = np.arange(m * rows, (m + 1) * rows, dtype=np.int64)
        columns: dict[str, Any]
        if kind == "text":
            letters = rng.choice(alphabet, size=(rows, 64))
            columns = {"id": ids, "text": np.array(["".join(r) for r in letters], dtype=object)}
        else:
            columns = {
                "id": ids,
                "features": rng.standard_normal((rows, 16)).astype(np.float32),
                "count": rng.integers(0, 1000, rows),
            }
        enc = encode_chunk("rows", columns, encoding, f"chunk-{m:05d}")
        out.append(Delivery(f"m{m}", enc.payload, enc.attributes, time.time(), 1, "sub"))
    return out


def make_sink(name: str, folder: Path) -> Sink:
    if name == "sqlite":
        return SqliteSink(folder / "results.sqlite")
    if name == "parquet":
        return ParquetSink(str(folder / "dataset"))
    return PgEncodeSink()
