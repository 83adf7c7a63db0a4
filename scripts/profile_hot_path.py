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

``--per-message``: CPU microseconds per *message* for small messages (``--sizes``, default 1
and 16 rows), through the same ``Pipeline`` with a sink that stores nothing and a model that
answers at once (no tensors, no gRPC unless ``--tensor``): rowbatch's own per-message cost
(headers, decode, check, intake, ledger entry, batcher add, batch take, result rows, settle;
``other`` is the pipeline's glue: asyncio, metrics, the byte budget, the writer). The total is
from uninstrumented runs; stage figures are corrected for the timers' own cost. The broker
clients' per-message receive cost (aiokafka record parsing, the Pub/Sub client's message
wrapper) is measured apart (``--broker``).

    .venv/bin/python scripts/profile_hot_path.py                      # table, all cases
    .venv/bin/python scripts/profile_hot_path.py --sink parquet --profile 20
    .venv/bin/python scripts/profile_hot_path.py --json out.json
    .venv/bin/python scripts/profile_hot_path.py --per-message --broker   # us/message
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import inspect
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

from consumer.engine import batcher, intake, ledger, pipeline
from consumer.engine.budget import ByteBudget
from consumer.engine.intake import Intake
from consumer.engine.pipeline import Pipeline, PipelineSettings
from consumer.model import binding as binding_module
from consumer.model.binding import Binding
from consumer.model.discovery import ModelSpec
from consumer.model.inference import RetryingInferencer
from consumer.observe.metrics import Metrics
from consumer.service import runner as service
from consumer.sinks import parquet, postgres, sqlite
from consumer.sinks.base import ColumnSpec, ResultRows, Sink, TableSpec, table_columns
from consumer.sources.base import DeadLetterReason, Delivery
from harness.model_specs import EMBEDDER, SCORER
from wire.chunks import encode_chunk
from wire.columns import ColumnType

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

    def __init__(self, stages: Sequence[str] = STAGES) -> None:
        self.seconds = dict.fromkeys(stages, 0.0)
        self.calls = dict.fromkeys(stages, 0)
        self.nested = dict.fromkeys(stages, 0)
        """Calls of other stages made from inside this one (for the timer-cost correction)."""
        self._local = threading.local()
        self._lock = threading.Lock()

    def wrap(self, stage: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack: list[list[float]] = self._local.__dict__.setdefault("stack", [])
            frame = [0.0, 0.0]  # time and number of nested stage calls
            stack.append(frame)
            started = time.thread_time()
            try:
                return func(*args, **kwargs)
            finally:
                spent = time.thread_time() - started
                stack.pop()
                if stack:
                    stack[-1][0] += spent
                    stack[-1][1] += 1
                with self._lock:
                    self.seconds[stage] = self.seconds.get(stage, 0.0) + spent - frame[0]
                    self.calls[stage] = self.calls.get(stage, 0) + 1
                    self.nested[stage] = self.nested.get(stage, 0) + int(frame[1])

        return timed

    def corrected(self, inside: float, outside: float) -> dict[str, float]:
        """Seconds per stage less the timers' own cost: ``inside`` per call of the stage (what
        a timed no-op records), ``outside`` per stage call nested in it (the rest of a timer's
        cost, which lands in the caller's exclusive time)."""
        return {
            s: max(0.0, v - self.calls[s] * inside - self.nested[s] * outside)
            for s, v in self.seconds.items()
        }

    @contextlib.contextmanager
    def patched(self, targets: Sequence[tuple[object, str, str]]) -> Iterator[None]:
        saved = []
        for owner, attr, stage in targets:
            if hasattr(owner, attr):
                raw = inspect.getattr_static(owner, attr)
                timed = self.wrap(stage, getattr(owner, attr))
                if isinstance(raw, classmethod | staticmethod):
                    timed = staticmethod(timed)  # the class's attribute was already bound
                saved.append((owner, attr, raw))
                setattr(owner, attr, timed)
        try:
            yield
        finally:
            for owner, attr, raw in reversed(saved):
                setattr(owner, attr, raw)


def timer_cost() -> tuple[float, float]:
    """(inside, outside): what one timed call adds, as :meth:`Stages.corrected` takes it."""
    stages = Stages(("cal",))

    def noop() -> None:
        pass

    timed = stages.wrap("cal", noop)
    n = 50_000
    best_plain = best_timed = float("inf")
    for _ in range(3):
        started = time.process_time()
        for _ in range(n):
            noop()
        best_plain = min(best_plain, time.process_time() - started)
        stages.seconds["cal"] = 0.0
        started = time.process_time()
        for _ in range(n):
            timed()
        best_timed = min(best_timed, time.process_time() - started)
    inside = stages.seconds["cal"] / n
    total = (best_timed - best_plain) / n
    return inside, max(0.0, total - inside)


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


# --- per message -------------------------------------------------------------------------------

MSG_STAGES = (
    "headers",
    "decode",
    "check",
    "intake",
    "ledger",
    "add",
    "take",
    "tensor",
    "result",
    "settle",
)
"""``headers``: ChunkHeaders.from_attributes; ``decode``: the rest of decode_chunk; ``check``:
the binding's per-message check; ``intake``: the rest of Intake.rows (limits, MessageRows);
``ledger``: Ledger.open; ``add``: Batcher.add; ``take``: Batcher.ready/drain (batch building);
``tensor``: build_inputs (only with --tensor); ``result``: the pipeline's result rows;
``settle``: Ledger.written per segment."""


class NullSink:
    """Stores nothing: the sink's own cost is per row, not per message."""

    async def open(self, table: TableSpec) -> None:
        pass

    async def write(self, rows: ResultRows) -> None:
        pass

    async def delete_chunks(self, chunk_ids: list[str]) -> None:
        pass

    async def close(self) -> None:
        pass


def run_messages(
    kind: str, deliveries: Sequence[Delivery], *, instrument: bool, tensor: bool, profile: bool
) -> tuple[float, Stages, pstats.Stats | None]:
    """(total CPU s, stages, profile) for the pipeline over ``deliveries`` with a null sink and
    a model that answers at once."""
    from wire import chunks as wire  # noqa: PLC0415 - patched below

    spec = TEXT_MODEL if kind == "text" else NUMERIC_MODEL
    binding = BINDINGS[kind]
    stages = Stages(MSG_STAGES)
    check = service.make_check(spec, binding, {"id": ColumnType.parse("int64")})
    if instrument:
        check = stages.wrap("check", check)
    answers: dict[int, dict[str, NDArray[Any]]] = {}

    async def run_batch(batch: batcher.Batch) -> dict[str, NDArray[Any]]:
        rows = len(batch)
        if tensor:
            binding_module.build_inputs(spec, binding, batch.columns, batch.nulls)
        if rows not in answers:
            answers[rows] = {
                t.name: np.ones(rows if t.dims == (1,) else (rows, *t.dims), dtype=np.float32)
                for t in spec.outputs
            }
        return answers[rows]

    targets: list[tuple[object, str, str]] = []
    if instrument:
        targets = [
            (wire.ChunkHeaders, "from_attributes", "headers"),
            (intake, "decode_chunk", "decode"),
            (intake.Intake, "rows", "intake"),
            (ledger.Ledger, "open", "ledger"),
            (ledger.Ledger, "written", "settle"),
            (batcher.Batcher, "add", "add"),
            (batcher.Batcher, "ready", "take"),
            (batcher.Batcher, "drain", "take"),
            (binding_module, "build_inputs", "tensor"),
            (pipeline.Pipeline, "_result_rows", "result"),
        ]
    source = ListSource(deliveries)
    with stages.patched(targets):

        async def main() -> float:
            pipe = Pipeline(
                source=source,
                sink=NullSink(),
                intake=Intake(binding.columns, check),
                run_batch=run_batch,
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
                budget=ByteBudget(1 << 40),
                metrics=Metrics(),
            )
            started = time.process_time()
            await pipe.run(asyncio.Event())
            return time.process_time() - started

        with profiled(profile) as profilers:
            total = asyncio.run(main())
    if source.acked != len(deliveries):
        raise AssertionError(f"{source.acked} of {len(deliveries)} messages acked")
    stats = None
    if profilers:
        stats = pstats.Stats(profilers[0])
        stats.add(*profilers[1:])
    return total, stages, stats


def per_message_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    inside, outside = timer_cost()
    results = []
    cols = (*MSG_STAGES, "other")
    print(
        f"CPU us/message, best of {args.repeat} (stages: best instrumented run, less the timers' "
        f"cost of {inside * 1e6:.2f}+{outside * 1e6:.2f} us a call)"
    )
    print(f"{'case':<22}{'total':>7}" + "".join(f"{s:>8}" for s in cols))
    for rows in (int(r) for r in args.sizes.split(",")):
        messages = max(200, args.message_rows // rows)
        for encoding in args.encoding.split(","):
            for kind in args.kind.split(","):
                deliveries = make_deliveries(encoding, kind, messages, rows)
                plain = min(
                    run_messages(
                        kind, deliveries, instrument=False, tensor=args.tensor, profile=False
                    )[0]
                    for _ in range(args.repeat)
                )
                timed = [
                    run_messages(
                        kind, deliveries, instrument=True, tensor=args.tensor, profile=False
                    )
                    for _ in range(args.repeat)
                ]
                _, stages, _ = min(timed, key=lambda r: r[0])
                per_msg = {
                    s: v / messages * 1e6 for s, v in stages.corrected(inside, outside).items()
                }
                total = plain / messages * 1e6
                per_msg["other"] = total - sum(per_msg.values())
                case = f"{encoding}/{kind}/{rows}row"
                print(f"{case:<22}{total:7.1f}" + "".join(f"{per_msg[s]:8.2f}" for s in cols))
                results.append({"case": case, "messages": messages, "total": total, **per_msg})
                if args.profile:
                    _, _, stats = run_messages(
                        kind, deliveries, instrument=False, tensor=args.tensor, profile=True
                    )
                    assert stats is not None
                    print_profile(case + " (per message)", stats, messages, args.profile)
    return results


# --- broker clients --------------------------------------------------------------------------


def broker_costs(messages: Sequence[Delivery], repeat: int) -> dict[str, float]:
    """CPU us per message of the broker clients' receive side, in-process: aiokafka parsing a
    fetched record batch into ``ConsumerRecord`` values plus the Kafka source's conversion to
    a ``Delivery``; the Pub/Sub client parsing a ``StreamingPullResponse`` and wrapping each
    message, plus the Pub/Sub source's conversion to a ``Delivery``."""
    import queue  # noqa: PLC0415

    from aiokafka.record.default_records import (  # noqa: PLC0415
        DefaultRecordBatch,
        DefaultRecordBatchBuilder,
    )
    from aiokafka.structs import ConsumerRecord  # noqa: PLC0415
    from google.cloud.pubsub_v1.subscriber.message import Message  # noqa: PLC0415
    from google.pubsub_v1 import types as pubsub_types  # noqa: PLC0415

    from wire.headers import kafka_headers_to_attributes  # noqa: PLC0415

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 30)
    for i, d in enumerate(messages):
        headers = [(k, v.encode("utf-8")) for k, v in d.attributes.items()]
        builder.append(i, timestamp=1_700_000_000_000, key=None, value=d.payload, headers=headers)
    kafka_batch = bytes(builder.build())
    received = [
        pubsub_types.ReceivedMessage(
            ack_id=f"ack-{i}",
            message=pubsub_types.PubsubMessage(
                data=d.payload, attributes=dict(d.attributes), message_id=str(i)
            ),
            delivery_attempt=1,
        )
        for i, d in enumerate(messages)
    ]
    pull = pubsub_types.StreamingPullResponse.serialize(
        pubsub_types.StreamingPullResponse(received_messages=received)
    )
    requests: queue.Queue[Any] = queue.Queue()

    def kafka() -> None:
        batch = DefaultRecordBatch(bytearray(kafka_batch))
        for rec in batch:
            record = ConsumerRecord(
                "t", 0, rec.offset, rec.timestamp, rec.timestamp_type, rec.key, rec.value,
                None, len(rec.value or b""), -1, rec.headers,
            )  # fmt: skip
            attributes = kafka_headers_to_attributes(record.headers)
            Delivery(
                f"t/0/{record.offset}",
                bytes(record.value or b""),
                attributes,
                record.timestamp / 1000,
                1,
                "t/0",
                bytes(record.key or b"").decode("utf-8", errors="replace"),
                len(record.value or b""),
            )

    def pubsub() -> None:
        response = pubsub_types.StreamingPullResponse.pb().FromString(pull)
        for item in response.received_messages:
            message = Message(item.message, item.ack_id, item.delivery_attempt, requests)
            Delivery(
                str(message.message_id),
                bytes(message.data),
                dict(message.attributes),
                float(message.publish_time.timestamp()),
                int(message.delivery_attempt or 0),
                "sub",
                str(message.ordering_key or ""),
                int(message.size),
            )

    out = {}
    for name, func in (("kafka", kafka), ("pubsub", pubsub)):
        best = float("inf")
        for _ in range(repeat):
            started = time.process_time()
            func()
            best = min(best, time.process_time() - started)
        out[name] = best / len(messages) * 1e6
    return out


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
    parser.add_argument(
        "--per-message", action="store_true", help="us per message of small messages"
    )
    parser.add_argument("--sizes", default="1,16", help="rows per message (--per-message)")
    parser.add_argument(
        "--message-rows", type=int, default=4096, help="rows per run (--per-message)"
    )
    parser.add_argument(
        "--tensor", action="store_true", help="build the input tensors (--per-message)"
    )
    parser.add_argument(
        "--broker", action="store_true", help="broker clients' receive cost (--per-message)"
    )
    args = parser.parse_args()
    if args.per_message:
        results = per_message_table(args)
        if args.broker:
            print("\nbroker clients, receive side, CPU us/message (not in the table above)")
            for rows in (int(r) for r in args.sizes.split(",")):
                for encoding in args.encoding.split(","):
                    deliveries = make_deliveries(encoding, "text", 1000, rows)
                    costs = broker_costs(deliveries, args.repeat)
                    case = f"{encoding}/text/{rows}row"
                    print(f"  {case:<22}" + "".join(f"{k:>8} {v:6.1f}" for k, v in costs.items()))
                    results.append({"case": f"broker/{case}", **costs})
        if args.json is not None:
            args.json.write_text(json.dumps(results, indent=1))
        return

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
