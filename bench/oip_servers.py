"""``python -m bench oip_servers``: rows/s of the ``scorer`` formula on each Open Inference
Protocol server, with 2, 4 and 8 requests of 256 rows in flight, side by side in one run: the
figures behind each server's recommended ``model.max_in_flight`` (docs/model-servers.md).

Each server is started from its own venv with the harness's launcher; one asyncio
``tritonclient`` client in this process keeps exactly N requests in flight (one inputs object
per slot, built once) for ``--seconds`` per setting, after a warm-up, in ``--rounds``
interleaved rounds (2, 4, 8, 2, 4, 8...: drift on a shared machine hits every setting alike);
the median round is reported. Answers are checked against the reference formula first.

    python -m bench oip_servers [--servers mlserver,mlserver-unbatched] [--seconds 4]
        [--rounds 2] [--in-flight 2,4,8] [--out FILE]

Adding a server: a launcher yielding its gRPC URL, and one :class:`ServerCase` in
:data:`CASES`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcaio

from bench.help_text import description
from bench.report import Table
from harness.reference_models import score
from harness.service import REPO_ROOT, RunDir

BATCH_ROWS = 256
WARMUP_S = 1.0
RESULTS_DIR = REPO_ROOT / "bench-results"

Launcher = Callable[[RunDir], contextlib.AbstractContextManager[str]]
"""Starts a server serving the ``scorer`` formula and yields its gRPC URL (``host:port``)."""


@contextlib.contextmanager
def _mlserver(run: RunDir, **overrides: Any) -> Iterator[str]:
    from harness.mlserver import MLServerService  # noqa: PLC0415 - only for this server

    model = {"scorer": overrides} if overrides else None
    with MLServerService(run, model_overrides=model) as endpoint:
        yield endpoint.grpc_url


@contextlib.contextmanager
def _kserve(run: RunDir) -> Iterator[str]:
    from harness.kserve import KServeService  # noqa: PLC0415 - only for this server

    with KServeService(run, log_level="WARNING") as endpoint:  # no log line per call
        yield endpoint.grpc_url


@dataclass(frozen=True)
class ServerCase:
    """One server setup to measure."""

    name: str
    server: str
    """The server and version, as the table shows it."""
    setup: str
    """What matters about its configuration (its batching)."""
    launch: Launcher
    model: str = "scorer"


CASES: dict[str, ServerCase] = {
    case.name: case
    for case in (
        ServerCase(
            "mlserver",
            "MLServer 1.7.1",
            "adaptive batching: up to 8 requests, 2 ms",
            _mlserver,
        ),
        ServerCase(
            "mlserver-unbatched",
            "MLServer 1.7.1",
            "adaptive batching off (max_batch_size 1)",
            lambda run: _mlserver(run, max_batch_size=1),
        ),
        ServerCase("kserve", "KServe 0.21.0", "no batching: one request at a time", _kserve),
    )
}


@dataclass(frozen=True)
class Measured:
    """One server at one in-flight setting (the median of its rounds)."""

    case: str
    server: str
    setup: str
    in_flight: int
    rows_per_s: float
    rounds_rows_per_s: tuple[float, ...]
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class OipServersResult:
    batch_rows: int
    seconds: float
    rounds: int
    cpu_count: int
    measured: tuple[Measured, ...]

    def table(self) -> Table:
        settings = sorted({m.in_flight for m in self.measured})
        by = {(m.case, m.in_flight): m for m in self.measured}
        rows = []
        for name in dict.fromkeys(m.case for m in self.measured):
            first = by[(name, settings[0])]
            best = max(settings, key=lambda n: by[(name, n)].rows_per_s)
            cells = [
                f"{by[(name, n)].rows_per_s:,.0f} ({by[(name, n)].p50_ms:.1f} ms)" for n in settings
            ]
            rows.append((f"{first.server}: {first.setup}", *cells, str(best)))
        return Table(
            f"rows/s (median request latency) with N requests of {self.batch_rows} rows in flight",
            ("server", *(f"{n} in flight" for n in settings), "best"),
            tuple(rows),
            (
                f"{self.seconds:g} s per setting x {self.rounds} interleaved rounds (median); "
                f"one asyncio client in the bench process; {self.cpu_count} CPUs shared by "
                "the client and the server",
            ),
        )


def _requests(rows: int, seed: int) -> tuple[list[Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, 16)).astype(np.float32)
    count = rng.integers(0, 1000, size=(rows, 1)).astype(np.int64)
    f = grpcaio.InferInput("FEATURES", [rows, 16], "FP32")
    f.set_data_from_numpy(features)
    c = grpcaio.InferInput("COUNT", [rows, 1], "INT64")
    c.set_data_from_numpy(count)
    return [f, c], features, count


async def _check_answers(client: Any, model: str) -> None:
    inputs, features, count = _requests(BATCH_ROWS, seed=1)
    answer = await client.infer(model, inputs)
    want_score, want_label = score(features, count)
    if not (
        np.array_equal(answer.as_numpy("SCORE"), want_score)
        and np.array_equal(answer.as_numpy("LABEL"), want_label)
    ):
        raise AssertionError(f"model {model!r} does not answer the scorer formula exactly")


async def _drive(
    client: Any, model: str, in_flight: int, seconds: float
) -> tuple[int, list[float]]:
    """Keep ``in_flight`` requests going for ``seconds``; rows answered and each latency."""
    slots = [_requests(BATCH_ROWS, seed=10 + i)[0] for i in range(in_flight)]
    latencies: list[float] = []
    answered = 0
    deadline = time.monotonic() + seconds

    async def slot(inputs: list[Any]) -> None:
        nonlocal answered
        while time.monotonic() < deadline:
            sent = time.monotonic()
            await client.infer(model, inputs)
            latencies.append(time.monotonic() - sent)
            answered += BATCH_ROWS

    await asyncio.gather(*(slot(inputs) for inputs in slots))
    return answered, latencies


async def _measure_case(
    case: ServerCase, url: str, settings: Sequence[int], seconds: float, rounds: int
) -> list[Measured]:
    client = grpcaio.InferenceServerClient(url)
    try:
        await _check_answers(client, case.model)
        await _drive(client, case.model, max(settings), WARMUP_S)
        rates: dict[int, list[float]] = {n: [] for n in settings}
        latencies: dict[int, list[float]] = {n: [] for n in settings}
        for _ in range(rounds):
            for n in settings:
                started = time.monotonic()
                rows, lat = await _drive(client, case.model, n, seconds)
                rates[n].append(rows / (time.monotonic() - started))
                latencies[n] += lat
    finally:
        await client.close()
    out = []
    for n in settings:
        ms = sorted(x * 1e3 for x in latencies[n])
        out.append(
            Measured(
                case=case.name,
                server=case.server,
                setup=case.setup,
                in_flight=n,
                rows_per_s=round(statistics.median(rates[n]), 1),
                rounds_rows_per_s=tuple(round(r, 1) for r in rates[n]),
                p50_ms=round(ms[len(ms) // 2], 2),
                p99_ms=round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 2),
            )
        )
    return out


def run(
    cases: Sequence[ServerCase],
    settings: Sequence[int] = (2, 4, 8),
    seconds: float = 4.0,
    rounds: int = 2,
    run_dir: RunDir | None = None,
) -> OipServersResult:
    """Start each server in turn, measure it, stop it."""
    run = run_dir or RunDir(Path(tempfile.mkdtemp(prefix="rowbatch-oip-bench-")))
    measured: list[Measured] = []
    for case in cases:
        with case.launch(run) as url:
            measured += asyncio.run(_measure_case(case, url, settings, seconds, rounds))
    return OipServersResult(BATCH_ROWS, seconds, rounds, os.cpu_count() or 1, tuple(measured))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench oip_servers", description=description(__doc__)
    )
    parser.add_argument(
        "--servers",
        default=",".join(CASES),
        help=f"comma-separated servers to measure (default all: {','.join(CASES)})",
    )
    parser.add_argument("--in-flight", default="2,4,8", help="requests in flight to compare")
    parser.add_argument("--seconds", type=float, default=4.0, help="per setting and round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (median)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write")
    args = parser.parse_args(argv)
    names = [s.strip() for s in args.servers.split(",") if s.strip()]
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        parser.error(f"unknown servers {unknown}; choose from {', '.join(CASES)}")
    settings = [int(n) for n in args.in_flight.split(",") if n.strip()]
    if not settings or min(settings) < 1 or args.seconds <= 0 or args.rounds < 1:
        parser.error("--in-flight needs numbers >= 1; --seconds > 0; --rounds >= 1")
    result = run([CASES[n] for n in names], settings, args.seconds, args.rounds)
    print(result.table().render())
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out: Path = args.out or RESULTS_DIR / f"oip-servers-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"command": " ".join(["python -m bench oip_servers", *(argv or sys.argv[1:])])}
    out.write_text(json.dumps(record | asdict(result), indent=2) + "\n")
    print(f"\nwritten {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
