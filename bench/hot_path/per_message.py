"""CPU per message by stage for small messages: the real ``Pipeline`` with a sink that stores
nothing and a model that answers at once, so what is left is rowbatch's own per-message cost."""

from __future__ import annotations

import argparse
import functools
import pstats
from collections.abc import Sequence
from typing import Any

import numpy as np

from bench.hot_path.fakes import BINDINGS, MODELS, NullSink, make_deliveries
from bench.hot_path.pipeline_run import run_pipeline
from bench.hot_path.timers import Stages, print_profile, timer_cost
from rowbatch.consumer.engine import batcher, decode, ledger, results
from rowbatch.consumer.model import tensors as binding_module
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.handler import BatchRows, OipHandler
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.wire.columns.column_type import ColumnType

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
the binding's per-message check; ``intake``: the rest of MessageDecoder.rows (limits, MessageRows);
``ledger``: Ledger.open; ``add``: Batcher.add; ``take``: Batcher.ready/drain (batch building);
``tensor``: build_inputs (only with --tensor); ``result``: the pipeline's result rows;
``settle``: Ledger.written per segment."""


class _Unused:
    """The inferencer of a handler whose ``run`` answers by itself: never called."""

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        raise AssertionError("InstantModel answers without an inferencer")


def run_messages(
    kind: str,
    deliveries: Sequence[Delivery],
    *,
    instrument: bool,
    tensor: bool,
    profile: bool,
    vector: int = 0,
    tracing: PipelineTracer = NO_TRACING,
) -> tuple[float, Stages, pstats.Stats | None]:
    """(total CPU s, stages, profile) for the pipeline over ``deliveries`` with a null sink and
    a model that answers at once (``tracing``: its spans, bench/tracing_cost.py)."""
    from rowbatch.wire.headers.chunk_headers import ChunkHeaders  # noqa: PLC0415 - patched below

    spec, binding = MODELS[kind], BINDINGS[kind]
    stages = Stages(MSG_STAGES)
    answers: dict[int, Answer] = {}

    class InstantModel(OipHandler):
        """The real handler's check; a run that answers at once (tensors built if asked)."""

        async def run(self, batch: BatchRows) -> Answer:
            rows = len(batch)
            if tensor:
                binding_module.build_inputs(spec, binding, batch.columns, batch.nulls)
            if rows not in answers:
                answers[rows] = Answer(
                    {
                        t.name: np.ones(
                            rows if t.dims == (1,) else (rows, *t.dims), dtype=np.float32
                        )
                        for t in spec.outputs
                    }
                )
            return answers[rows]

    passthrough = {"id": ColumnType.parse("int64")}
    model = InstantModel(_Unused(), spec, binding, passthrough, max(spec.preferred_batch_sizes))
    check = model.check
    if instrument:
        check = stages.wrap("check", check)

    targets: list[tuple[object, str, str]] = []
    if instrument:
        targets = [
            (ChunkHeaders, "from_attributes", "headers"),
            (decode, "decode_chunk", "decode"),
            (decode.MessageDecoder, "rows", "intake"),
            (ledger.Ledger, "open", "ledger"),
            (ledger.Ledger, "written", "settle"),
            (batcher.Batcher, "add", "add"),
            (batcher.Batcher, "ready", "take"),
            (batcher.Batcher, "drain", "take"),
            (binding_module, "build_inputs", "tensor"),
            (results.ResultBuilder, "build", "result"),
        ]
    with stages.patched(targets):
        total, stats = run_pipeline(
            kind,
            deliveries,
            sink=NullSink(),
            check=check,
            model=model,
            profile=profile,
            vector=vector,
            tracing=tracing,
        )
    return total, stages, stats


def per_message_table(args: argparse.Namespace) -> list[dict[str, Any]]:
    inside, outside = timer_cost()
    figures: list[dict[str, Any]] = []
    cols = (*MSG_STAGES, "other")
    mode = f"in vectors of {args.vector}" if args.vector else "one by one"
    print(
        f"CPU us/message, deliveries {mode}, best of {args.repeat} (stages: best instrumented "
        f"run, less the timers' cost of {inside * 1e6:.2f}+{outside * 1e6:.2f} us a call)"
    )
    print(f"{'case':<22}{'total':>7}" + "".join(f"{s:>8}" for s in cols))
    for rows in (int(r) for r in args.sizes.split(",")):
        messages = max(200, args.message_rows // rows)
        for encoding in args.encoding.split(","):
            for kind in args.kind.split(","):
                deliveries = make_deliveries(encoding, kind, messages, rows)
                run = functools.partial(
                    run_messages, kind, deliveries, tensor=args.tensor, vector=args.vector
                )
                plain = min(run(instrument=False, profile=False)[0] for _ in range(args.repeat))
                timed = [run(instrument=True, profile=False) for _ in range(args.repeat)]
                _, stages, _ = min(timed, key=lambda r: r[0])
                per_msg = {
                    s: v / messages * 1e6 for s, v in stages.corrected(inside, outside).items()
                }
                total = plain / messages * 1e6
                per_msg["other"] = total - sum(per_msg.values())
                case = f"{encoding}/{kind}/{rows}row"
                print(f"{case:<22}{total:7.1f}" + "".join(f"{per_msg[s]:8.2f}" for s in cols))
                figures.append({"case": case, "messages": messages, "total": total, **per_msg})
                if args.profile:
                    _, _, stats = run(instrument=False, profile=True)
                    assert stats is not None
                    print_profile(case + " (per message)", stats, messages, args.profile)
    return figures
