"""CPU per row by stage: chunks of many rows through the real ``Pipeline`` with a fake Triton
and a real (SQLite, Parquet) or encode-only (PostgreSQL COPY) sink."""

from __future__ import annotations

import pstats
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.hot_path.fakes import BINDINGS, MODELS, FakeTriton, make_sink
from bench.hot_path.pipeline_run import run_pipeline
from bench.hot_path.timers import Stages
from rowbatch.consumer.engine import batcher, decode, ledger, results
from rowbatch.consumer.model import handler as handler_module
from rowbatch.consumer.model.handler import OipHandler
from rowbatch.consumer.model.inference.retry import RetryingInferencer
from rowbatch.consumer.sinks.parquet.sink import ParquetSink
from rowbatch.consumer.sinks.postgres import copy_binary
from rowbatch.consumer.sinks.sqlite import sink as sqlite_sink
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.columns.column_type import ColumnType


def run_once(
    encoding: str, kind: str, sink_name: str, deliveries: Sequence[Delivery], profile: bool
) -> tuple[float, dict[str, float], int, pstats.Stats | None]:
    """(total CPU s, stage CPU s, rows, profile) for one run of the pipeline over ``deliveries``."""
    spec, binding = MODELS[kind], BINDINGS[kind]
    stages = Stages()
    inferencer = RetryingInferencer(FakeTriton(spec, stages))
    passthrough = {"id": ColumnType.parse("int64")}
    handler = OipHandler(inferencer, spec, binding, passthrough, max(spec.preferred_batch_sizes))
    check = stages.wrap("check", handler.check)
    targets = [
        (decode, "decode_chunk", "decode"),
        (decode.MessageDecoder, "rows", "intake"),
        (batcher.Batcher, "add", "batch"),
        (batcher.Batcher, "ready", "batch"),
        (batcher.Batcher, "drain", "batch"),
        (handler_module, "build_inputs", "tensor"),
        (results.ResultBuilder, "build", "result"),
        (sqlite_sink, "records", "sink"),
        (sqlite_sink, "sqlite_transaction", "sink"),
        (ParquetSink, "_write", "sink"),
        (copy_binary, "encode_tuples", "sink"),
        (ledger.Ledger, "open", "ack"),
        (ledger.Ledger, "written", "ack"),
    ]
    with tempfile.TemporaryDirectory() as folder, stages.patched(targets):
        total, stats = run_pipeline(
            kind,
            deliveries,
            sink=make_sink(sink_name, Path(folder)),
            check=check,
            model=handler,
            profile=profile,
        )
    rows = sum(int(d.attributes["rowbatch-row-count"]) for d in deliveries)
    return total, stages.seconds, rows, stats
