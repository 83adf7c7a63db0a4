"""Section ``per_message``: what one 1-row message costs the consumer, and where it goes
(issue 24's CPU targets), measured three ways in one run:

- **real process**: one consumer drains a Kafka backlog of 1-row Arrow messages (an int64 and a
  float32[16] per row) through ``noop_numeric`` (answers at once) into PostgreSQL; its CPU
  (user + system, every thread, ``/proc``) from the first row written to the last, per message;
- **where it goes**: the same drain again under ``py-spy`` (``bench/profile.py``), the
  samples by stage (not timed: py-spy takes CPU of its own);
- **in-process**: the pipeline over the same kind of messages with a null sink and a model that
  answers at once (``bench/hot_path``, vectors of 256 as the Kafka source hands them over), and
  beside it the Kafka client's own receive cost for the same messages (aiokafka parsing a record
  batch, and the conversion to a ``Delivery``): the ratio of the two is the issue's "in-process
  profile <= 5x the raw client".

Targets: real process <= 30 us a message; in-process <= 5x the raw Kafka client."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.hot_path.broker import broker_costs
from bench.hot_path.fakes import make_deliveries
from bench.hot_path.per_message import run_messages
from bench.procs import ConsumerProcess, consumers, wait_ready
from bench.profile import STAGES, breakdown, recording
from bench.report import Table, Target
from bench.stack import (
    NOOP_NUMERIC_BINDING,
    Bench,
    backlog,
    consumer_config,
    count_rows,
    create_feed,
    publish,
    remove_table,
    unique,
)
from harness.service import REPO_ROOT
from rowbatch.wire.headers.fields import Encoding

MESSAGES = 150_000
QUICK_MESSAGES = 5_000
IN_PROCESS_MESSAGES = 4_096
VECTOR = 256
REPEAT = 3
TARGET_US = 30.0
TARGET_RATIO = 5.0
DRAIN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Drained:
    """One consumer process draining the backlog, from its first row written to its last."""

    messages: int
    seconds: float
    cpu_s: float

    @property
    def us_per_message(self) -> float:
        return self.cpu_s / self.messages * 1e6 if self.messages else 0.0

    @property
    def messages_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class PerMessageResult:
    messages: int
    real: Drained
    in_process_us: float
    """The pipeline in-process, best of ``REPEAT``, per message."""
    kafka_client_us: float
    """aiokafka's record parsing and the conversion to a ``Delivery``, best of ``REPEAT``."""
    profile_samples: int
    profile_share: dict[str, float] = field(default_factory=dict)
    """Stage -> share of the consumer's samples in the profiled drain (``bench/profile.py``)."""
    profile_error: str | None = None

    @property
    def ratio(self) -> float:
        return self.in_process_us / self.kafka_client_us if self.kafka_client_us else 0.0

    def table(self) -> Table:
        r = self.real
        notes = [
            f"real process: one consumer, Kafka (6 partitions), {self.messages:,} 1-row Arrow "
            "messages queued before it starts, noop_numeric, PostgreSQL; CPU (user + system, "
            "all threads) from the first row written to the last, per message.",
            f"in-process: bench/hot_path's pipeline, null sink, vectors of {VECTOR}, best of "
            f"{REPEAT}; Kafka client: aiokafka parsing a record batch of the same messages and "
            "the conversion to a Delivery, best of 3.",
        ]
        if self.profile_error is not None:
            notes.append(f"profile: unavailable ({self.profile_error})")
        else:
            shares = "  ".join(f"{s} {self.profile_share.get(s, 0.0):.0%}" for s in STAGES)
            notes.append(
                f"where it goes (py-spy of a second drain, {self.profile_samples} samples): "
                + shares
            )
        return Table(
            "Per message: what a 1-row message costs the consumer (CPU us)",
            (
                "real process",
                "msgs/s",
                "in-process",
                "Kafka client",
                "in-process / client",
            ),
            (
                (
                    f"{r.us_per_message:.1f}",
                    f"{r.messages_per_s:,.0f}",
                    f"{self.in_process_us:.1f}",
                    f"{self.kafka_client_us:.1f}",
                    f"{self.ratio:.1f}x",
                ),
            ),
            tuple(notes),
        )

    def targets(self) -> list[Target]:
        return [
            Target(
                "per message, real process (kafka, 1-row): consumer CPU",
                f"<= {TARGET_US:.0f} us",
                f"{self.real.us_per_message:.1f} us",
                self.real.us_per_message <= TARGET_US,
            ),
            Target(
                "per message, in-process vs the raw Kafka client",
                f"<= {TARGET_RATIO:.0f}x",
                f"{self.ratio:.1f}x ({self.in_process_us:.1f} / {self.kafka_client_us:.1f} us)",
                self.ratio <= TARGET_RATIO,
            ),
        ]


def _watch(proc: ConsumerProcess, total: int) -> Drained:
    """Poll ``proc``'s rows written until ``total``; the window starts at the first poll that
    saw rows (those rows left out) and its CPU is read at both ends."""
    first: tuple[float, float, float] | None = None
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:
        written = proc.rows_written()
        now = time.monotonic()
        if written > 0 and first is None:
            first = (now, written, proc.cpu().total_s)
        if written >= total and first is not None:
            cpu = proc.cpu().total_s
            return Drained(int(total - first[1]), now - first[0], cpu - first[2])
        proc.check_alive(f"{total:,} rows written ({written:,.0f} so far)")
        if now > deadline:
            raise TimeoutError(f"{written:,.0f} of {total:,} rows written in {DRAIN_TIMEOUT_S} s")
        time.sleep(0.05)


def _drain(bench: Bench, messages: int, profile_to: Path | None) -> tuple[Drained, list[str]]:
    feed = create_feed(bench.stack, "kafka")
    table = unique("per_message")
    sink = {"kind": "postgres", "dsn": bench.stack.postgres.dsn, "table": table}
    config = consumer_config(bench.stack, feed, "noop_numeric", NOOP_NUMERIC_BINDING, sink)
    publish(bench.stack, feed, backlog("numeric", messages, 1, Encoding.ARROW, prefix=unique("pm")))
    errors: list[str] = []
    with consumers(bench.dir("per_message"), table, config) as procs:
        wait_ready(procs)
        if profile_to is None:
            drained = _watch(procs[0], messages)
        else:
            with recording(procs[0].pid, profile_to) as errors:
                drained = _watch(procs[0], messages)
        procs[0].terminate()
    written = count_rows(bench, "postgres", table)
    remove_table(bench, "postgres", table)
    if written != messages:
        raise RuntimeError(f"per_message: {written:,} of {messages:,} rows in the sink")
    return drained, errors


def in_process() -> tuple[float, float]:
    """(pipeline, Kafka client) CPU us per 1-row Arrow message, in this process."""
    deliveries = make_deliveries("arrow", "numeric", IN_PROCESS_MESSAGES, 1)
    best = min(
        run_messages(
            "numeric", deliveries, instrument=False, tensor=False, profile=False, vector=VECTOR
        )[0]
        for _ in range(REPEAT)
    )
    client = broker_costs(deliveries, REPEAT)["kafka"]
    return best / len(deliveries) * 1e6, client


def run(bench: Bench, profile: bool = True) -> PerMessageResult:
    messages = QUICK_MESSAGES if bench.quick else MESSAGES
    pipeline_us, client_us = in_process()
    real, _ = _drain(bench, messages, None)
    share: dict[str, float] = {}
    samples, error = 0, None
    if not profile:
        error = "skipped (--no-profile)"
    else:
        out = bench.dir("profile") / f"per_message_{unique('p')}.txt"
        _, errors = _drain(bench, messages, out)
        if errors:
            error = "; ".join(errors)
        else:
            counts = breakdown(out.read_text(), str(REPO_ROOT))
            samples = sum(counts.values())
            share = {k: v / samples for k, v in counts.items()} if samples else {}
    return PerMessageResult(messages, real, pipeline_us, client_us, samples, share, error)
