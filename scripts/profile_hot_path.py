"""CPU cost per row of the consumer's hot path, in-process, no services.

Pre-encoded messages (chunks of ``--chunk-rows`` rows, JSON or Arrow, text or numeric rows) run
through the real ``Pipeline`` (intake -> batcher -> tensor building -> result rows -> sink ->
ledger/ack) with a fake source and a fake Triton client that encodes the real gRPC request
(protobuf) but runs no model. Reported: CPU microseconds per row (``time.process_time``, all
threads), in total and by stage (``time.thread_time`` of the stage's functions, exclusive of
nested stages; ``other`` is the rest: asyncio, metrics, pipeline glue).

Rows: ``text`` = ``id`` int64 + ``text`` (64 characters) -> ``embedder`` (TEXT -> EMBEDDING
fp32[384]); ``numeric`` = ``id`` + ``features`` vector[float32,16] + ``count`` int64 ->
``scorer`` (FEATURES, COUNT -> SCORE fp32, LABEL int32). ``id`` passes through.

Sinks: ``sqlite`` and ``parquet`` (real, in a temporary directory) and ``pg-encode`` (the
PostgreSQL sink's binary COPY encoding only: no server).

    .venv/bin/python scripts/profile_hot_path.py                      # table, all cases
    .venv/bin/python scripts/profile_hot_path.py --sink parquet --profile 20
    .venv/bin/python scripts/profile_hot_path.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import json
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's code first

import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import InferRequestedOutput
from tritonclient.grpc._utils import _get_inference_request

from consumer import batcher, intake, ledger, pipeline, service
from consumer.binding import Binding
from consumer.budget import ByteBudget
from consumer.inference import RetryingInferencer
from consumer.intake import Intake
from consumer.metrics import Metrics
from consumer.model import ModelSpec
from consumer.pipeline import Pipeline, PipelineSettings
from consumer.sinks import parquet, postgres, sqlite
from consumer.sinks.base import ColumnSpec, ResultRows, Sink, TableSpec, table_columns
from consumer.sources.base import DeadLetterReason, Delivery
from harness.model_specs import EMBEDDER, SCORER
from producer.columns import ColumnType
from producer.wire import encode_chunk

STAGES = ("decode", "check", "intake", "batch", "tensor", "grpc", "result", "sink", "ack")

TEXT_MODEL = EMBEDDER
NUMERIC_MODEL = SCORER
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


# --- stage timers ------------------------------------------------------------------------------


class Stages:
    """Exclusive thread CPU time per stage: a stage's time excludes stages nested inside it."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self._local = threading.local()
        self._lock = threading.Lock()

    def wrap(self, stage: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack: list[float] = self._local.__dict__.setdefault("stack", [])
            stack.append(0.0)  # time of nested stages
            started = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                nested = stack.pop()
                if stack:
                    stack[-1] += spent
                with self._lock:
                    self.seconds[stage] += spent - nested

        return timed

    @contextlib.contextmanager
    def patched(self, targets: Sequence[tuple[object, str, str]]) -> Iterator[None]:
        saved = []
        for owner, attr, stage in targets:
            if hasattr(owner, attr):
                original = getattr(owner, attr)
                saved.append((owner, attr, original))
                setattr(owner, attr, self.wrap(stage, original))
        try:
            yield
        finally:
            for owner, attr, original in reversed(saved):
                setattr(owner, attr, original)


# --- fakes -------------------------------------------------------------------------------------


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
    ) -> dict[str, NDArray[Any]]:
        self._encode(inputs, outputs)
        rows = int(inputs[0].shape()[0])
        if rows not in self._answers:
            self._answers[rows] = {
                t.name: np.ones(
                    (rows, *t.dims), dtype="float32" if t.datatype == "FP32" else "int32"
                )
                for t in self._spec.outputs
            }
        return {name: self._answers[rows][name] for name in outputs}


class PgEncodeSink:
    """The PostgreSQL sink's binary COPY encoding, without a server."""

    def __init__(self) -> None:
        self._columns: tuple[Any, ...] = ()
        self.bytes = 0

    async def open(self, table: TableSpec) -> None:
        pg: Any = postgres
        self._columns = tuple(
            pg._Column(c.name, pg._pg_type(c), pg._encoder(c), c) for c in table_columns(table)
        )

    async def write(self, rows: ResultRows) -> None:
        n, step = len(rows), 2_000
        for lo in range(0, n, step):
            self.bytes += len(postgres._encode(self._columns, rows, slice(lo, min(lo + step, n))))

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        pass

    async def close(self) -> None:
        pass


# --- messages ----------------------------------------------------------------------------------


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
        return sqlite.SqliteSink(folder / "results.sqlite")
    if name == "parquet":
        return parquet.ParquetSink(str(folder / "dataset"))
    return PgEncodeSink()


# --- one run -----------------------------------------------------------------------------------


def run_once(
    encoding: str, kind: str, sink_name: str, deliveries: Sequence[Delivery], profile: bool
) -> tuple[float, dict[str, float], int, pstats.Stats | None]:
    """(total CPU s, stage CPU s, rows, profile) for one run of the pipeline over ``deliveries``."""
    spec = TEXT_MODEL if kind == "text" else NUMERIC_MODEL
    binding = BINDINGS[kind]
    stages = Stages()
    check = stages.wrap(
        "check", service.make_check(spec, binding, {"id": ColumnType.parse("int64")})
    )
    inferencer = RetryingInferencer(FakeTriton(spec, stages))
    targets = [
        (intake, "decode_chunk", "decode"),
        (intake.Intake, "rows", "intake"),
        (batcher.Batcher, "add", "batch"),
        (batcher.Batcher, "ready", "batch"),
        (batcher.Batcher, "drain", "batch"),
        (service, "build_inputs", "tensor"),
        (pipeline.Pipeline, "_result_rows", "result"),
        (sqlite, "_records", "sink"),
        (sqlite, "sqlite_transaction", "sink"),
        (parquet.ParquetSink, "_write", "sink"),
        (postgres, "_encode", "sink"),
        (ledger.Ledger, "open", "ack"),
        (ledger.Ledger, "written", "ack"),
    ]
    with tempfile.TemporaryDirectory() as folder, stages.patched(targets):
        sink = make_sink(sink_name, Path(folder))
        source = ListSource(deliveries)

        async def main() -> float:
            await sink.open(TABLES[kind])
            pipe = Pipeline(
                source=source,
                sink=sink,
                intake=Intake(binding.columns, check),
                run_batch=service.make_run_batch(inferencer, spec, binding),
                isolate=service.isolate_batch,
                is_poison=service.is_poison,
                settings=PipelineSettings(
                    target_batch_size=max(spec.preferred_batch_sizes),
                    max_wait_s=0.05,
                    max_in_flight=2,
                    output_bytes_per_row=1536,
                    outputs=binding.outputs,
                    passthrough=binding.passthrough,
                    model_name=spec.name,
                    model_version=spec.version,
                ),
                budget=ByteBudget(1 << 30),
                metrics=Metrics(),
            )
            started = time.process_time()
            await pipe.run(asyncio.Event())
            spent = time.process_time() - started
            await sink.close()
            return spent

        with profiled(profile) as profilers:
            total = asyncio.run(main())
    rows = sum(int(d.attributes["rowbatch-row-count"]) for d in deliveries)
    if source.acked != len(deliveries):
        raise AssertionError(f"{source.acked} of {len(deliveries)} messages acked")
    stats = None
    if profilers:
        stats = pstats.Stats(profilers[0])
        stats.add(*profilers[1:])
    return total, stages.seconds, rows, stats


@contextlib.contextmanager
def profiled(enabled: bool) -> Iterator[list[cProfile.Profile]]:
    """cProfile (thread CPU time) on this thread and on every thread started meanwhile (the
    sinks' worker threads)."""
    profilers: list[cProfile.Profile] = []
    if not enabled:
        yield profilers
        return

    def start(*_: object) -> None:
        sys.setprofile(None)
        profiler = cProfile.Profile(time.thread_time)
        profilers.append(profiler)
        profiler.enable()

    start()
    threading.setprofile(start)
    try:
        yield profilers
    finally:
        threading.setprofile(None)
        profilers[0].disable()


def print_profile(title: str, stats: pstats.Stats, rows: int, top: int) -> None:
    entries = getattr(stats, "stats", {})
    ranked = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print(f"\ncProfile {title}: top {top} by own time (us/row own, cumulative; calls)")
    for (file, line, func), (_, calls, own, cum, _) in ranked:
        where = f"{Path(file).name}:{line}({func})" if line else func
        print(f"  {own / rows * 1e6:7.2f} {cum / rows * 1e6:8.2f}  {calls:>8}  {where[:90]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40)
    parser.add_argument("--chunk-rows", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest counts")
    parser.add_argument("--encoding", default="json,arrow")
    parser.add_argument("--kind", default="text,numeric")
    parser.add_argument("--sink", default="sqlite,parquet,pg-encode")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="cProfile top N")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()

    results = []
    header = f"{'case':<26}{'total':>7}" + "".join(f"{s:>8}" for s in (*STAGES, "other"))
    print(f"CPU us/row, {args.messages} messages x {args.chunk_rows} rows, best of {args.repeat}")
    print(header)
    for encoding in args.encoding.split(","):
        for kind in args.kind.split(","):
            deliveries = make_deliveries(encoding, kind, args.messages, args.chunk_rows)
            for sink_name in args.sink.split(","):
                runs = [
                    run_once(encoding, kind, sink_name, deliveries, False)
                    for _ in range(args.repeat)
                ]
                total, stages, rows, _ = min(runs, key=lambda r: r[0])
                per_row = {s: v / rows * 1e6 for s, v in stages.items()}
                per_row["other"] = total / rows * 1e6 - sum(per_row.values())
                case = f"{encoding}/{kind}/{sink_name}"
                print(
                    f"{case:<26}{total / rows * 1e6:7.1f}"
                    + "".join(f"{per_row[s]:8.2f}" for s in (*STAGES, "other"))
                )
                results.append({"case": case, "total": total / rows * 1e6, **per_row})
                if args.profile:
                    _, _, rows, stats = run_once(encoding, kind, sink_name, deliveries, True)
                    assert stats is not None
                    print_profile(case, stats, rows, args.profile)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
