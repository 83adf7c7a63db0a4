"""What tracing costs the consumer, CPU per message, side by side
(``python -m bench.tracing_cost``).

The real ``Pipeline`` over small messages (the hot-path profile's per-message rig: a list
source giving vectors, a model that answers at once, a sink that stores nothing), each message
carrying a producer ``traceparent``, run in alternation:

- ``off``: no ``PipelineTracing`` (the default; the path every consumer without ``[tracing]``
  takes);
- ``on``: tracing on, every message sampled (its producer's flag says so): a ``process`` span
  per message, an ``infer`` span per request with a link per message, a ``write`` span per
  sink write, all through the SDK's batch processor into an exporter that encodes them to OTLP
  protobuf as the real one does and drops the bytes (no collector needed, no network time);
- ``unsampled``: tracing on, producers' flag not sampled and ratio 0: spans are made but not
  recorded.

CPU is the process's (all threads, the exporter's included: the provider is flushed inside the
timed part). Reported: median and range over ``--repeat`` alternations, and ``on - off`` per
message. A table, and JSON with ``--json``.

``--base DIR`` (a checkout of the commit before tracing, e.g. ``git worktree add /tmp/base
355775b``) adds the off path against that code: ``bench.hot_path --per-message`` run from each
checkout in turn (a subprocess each, ``PYTHONPATH`` naming the checkout), the same cases.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanContext, TraceFlags

import rowbatch.tracing
from bench.hot_path.fakes import make_deliveries
from bench.hot_path.per_message import run_messages
from bench.machine import describe, finish
from rowbatch.consumer.observe.tracing import NO_TRACING, PipelineTracer, PipelineTracing
from rowbatch.consumer.sources.delivery import Delivery
from rowbatch.tracing import traceparent_of

MODES = ("off", "on", "unsampled")


class EncodingExporter(SpanExporter):
    """Encodes each batch to OTLP protobuf bytes, as the OTLP exporter does, and drops them."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.bytes += len(encode_spans(spans).SerializeToString())
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def traced(deliveries: Sequence[Delivery], sampled: bool) -> list[Delivery]:
    """The deliveries, each with a producer context of its own."""
    flags = TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT)
    return [
        dataclasses.replace(
            d,
            attributes={
                **d.attributes,
                "traceparent": traceparent_of(SpanContext(n + 1, n + 1, True, flags)),
            },
        )
        for n, d in enumerate(deliveries)
    ]


class Switch:
    """The process's tracer provider (installed once) and the ratio its sampler uses."""

    def __init__(self) -> None:
        self.exporter = EncodingExporter()
        self.ratio = TraceIdRatioBased(1.0)
        self.provider = TracerProvider(sampler=ParentBased(_Ratio(self)))
        self.processor = BatchSpanProcessor(self.exporter, max_queue_size=1 << 16)
        self.provider.add_span_processor(self.processor)
        trace.set_tracer_provider(self.provider)


class _Ratio(TraceIdRatioBased):
    """A root sampler whose ratio the bench changes between modes."""

    def __init__(self, switch: Switch) -> None:
        super().__init__(1.0)
        self._switch = switch

    def should_sample(self, *args: Any, **kwargs: Any) -> Any:
        return self._switch.ratio.should_sample(*args, **kwargs)


def run_mode(mode: str, switch: Switch, cases: dict[str, list[Delivery]], vector: int) -> float:
    """CPU seconds of one run (the exporter's flush included)."""
    deliveries = cases["unsampled" if mode == "unsampled" else "sampled"]
    rowbatch.tracing._active = mode != "off"
    switch.ratio = TraceIdRatioBased(0.0 if mode == "unsampled" else 1.0)
    tracing: PipelineTracer = (
        NO_TRACING if mode == "off" else PipelineTracing(system="kafka", model="m", sink="null")
    )
    started = time.process_time()
    run_messages(
        "text",
        deliveries,
        instrument=False,
        tensor=False,
        profile=False,
        vector=vector,
        tracing=tracing,
    )
    switch.provider.force_flush()
    return time.process_time() - started


def hot_path(checkout: Path, sizes: str, vector: int) -> dict[str, float]:
    """``bench.hot_path --per-message`` from ``checkout``: CPU us/message by case."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.hot_path",
                "--per-message",
                "--sizes",
                sizes,
                "--vector",
                str(vector),
                "--repeat",
                "3",
                "--kind",
                "text",
                "--encoding",
                "json",
                "--json",
                str(out),
            ],
            cwd=checkout,
            env={**os.environ, "PYTHONPATH": str(checkout)},
            check=True,
            capture_output=True,
        )
        return {row["case"]: float(row["total"]) for row in json.loads(out.read_text())}


def against_base(base: Path, sizes: str, vector: int, repeat: int) -> dict[str, Any]:
    """The off path here against ``base``, alternating."""
    here = Path(__file__).resolve().parent.parent
    runs: dict[str, dict[str, list[float]]] = {"base": {}, "current": {}}
    for _ in range(repeat):
        for side, checkout in (("base", base), ("current", here)):
            for case, total in hot_path(checkout, sizes, vector).items():
                runs[side].setdefault(case, []).append(total)
    print(
        f"\noff path against {base} (bench.hot_path --per-message, CPU us/message, "
        "median [min-max])"
    )
    print(f"{'case':<20}{'base':>22}{'current':>22}{'ratio':>8}")
    out: dict[str, Any] = {}
    for case in runs["base"]:
        b, c = runs["base"][case], runs["current"][case]
        ratio = statistics.median(c) / statistics.median(b)
        print(
            f"{case:<20}{statistics.median(b):>8.1f} [{min(b):5.1f}-{max(b):5.1f}]"
            f"{statistics.median(c):>8.1f} [{min(c):5.1f}-{max(c):5.1f}]{ratio:>8.2f}"
        )
        out[case] = {"base": b, "current": c, "ratio_of_medians": ratio}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,16", help="rows per message")
    parser.add_argument("--messages", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=7, help="alternations of the modes")
    parser.add_argument("--vector", type=int, default=256, help="deliveries per vector")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--base", type=Path, help="a checkout of the code before tracing")
    args = parser.parse_args()
    switch = Switch()
    machine = describe()
    print(machine.header())
    results: list[dict[str, Any]] = []
    print(
        f"tracing cost, CPU us/message (median [min-max] of {args.repeat} alternating runs), "
        f"{args.messages} messages in vectors of {args.vector}, json/text"
    )
    print(f"{'rows/msg':>8}" + "".join(f"{m:>22}" for m in MODES) + f"{'on - off':>12}")
    for rows in (int(r) for r in args.sizes.split(",")):
        plain = make_deliveries("json", "text", args.messages, rows)
        cases = {"sampled": traced(plain, True), "unsampled": traced(plain, False)}
        runs: dict[str, list[float]] = {m: [] for m in MODES}
        run_mode("on", switch, cases, args.vector)  # warm-up (imports, first spans)
        for _ in range(args.repeat):
            for mode in MODES:
                runs[mode].append(run_mode(mode, switch, cases, args.vector) / args.messages * 1e6)
        medians = {m: statistics.median(v) for m, v in runs.items()}
        cells = "".join(
            f"{medians[m]:>8.1f} [{min(runs[m]):5.1f}-{max(runs[m]):5.1f}]" for m in MODES
        )
        print(f"{rows:>8}{cells}{medians['on'] - medians['off']:>12.1f}")
        results.append(
            {
                "rows_per_message": rows,
                "messages": args.messages,
                "us_per_message": runs,
                "median": medians,
                "on_minus_off": medians["on"] - medians["off"],
            }
        )
    rowbatch.tracing._active = False
    print(f"spans exported: {switch.exporter.spans}, {switch.exporter.bytes} bytes of OTLP")
    base = None
    if args.base is not None:
        base = against_base(args.base, args.sizes, args.vector, args.repeat)
    if args.json is not None:
        record = {
            "off_against_base": base,
            "machine": dataclasses.asdict(finish(machine)),
            "vector": args.vector,
            "cases": results,
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
