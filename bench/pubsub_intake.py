"""How fast each Pub/Sub source takes in small messages: ``python -m bench.pubsub_intake``.

Starts the Pub/Sub emulator (or uses ``--host``), publishes a backlog of 1-row messages
(wire-format chunks, ~200 bytes with attributes) to a topic with one subscription per
variant, then drains each subscription in its own process with one variant of the source,
doing nothing but receive and ack (no model, no sink): the streaming source
(``mode = "streaming"``) and the unary-pull source (``mode = "pull"``) on the asyncio client
and on threads. Each drain reports messages/s (first delivery to the last ack confirmed) and
the process's CPU time per message (``time.process_time``: every thread), and the
emulator's CPU per message (from ``/proc``, when it runs here); afterwards the subscription
is checked to be empty (every ack landed). Prints a table and writes JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from google.api_core import exceptions as gexc
from google.pubsub_v1 import types as pstypes
from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisherClient

from bench.help_text import description
from harness.pubsub import DEFAULT_PROJECT, PubSubEndpoint, PubSubService
from harness.service import REPO_ROOT, RunDir
from rowbatch.wire.chunks.encode import encode_chunk

VARIANTS: dict[str, dict[str, Any]] = {
    "streaming": {"mode": "streaming"},
    "pull-asyncio": {"mode": "pull", "client": "asyncio", "pull_concurrency": 2},
    "pull-asyncio-1": {"mode": "pull", "client": "asyncio", "pull_concurrency": 1},
    "pull-threads": {"mode": "pull", "client": "threads", "pull_concurrency": 2},
    "pull-asyncio-4k": {
        "mode": "pull",
        "client": "asyncio",
        "max_messages": 4000,
        "pull_concurrency": 4,
    },
}


def _publish_backlog(endpoint: PubSubEndpoint, topic: str, count: int) -> None:
    publisher = endpoint.publisher()
    api = GapicPublisherClient(transport=publisher.transport)
    rng = np.random.default_rng(1)
    try:
        for start in range(0, count, 1000):
            messages = []
            for i in range(start, min(count, start + 1000)):
                chunk = encode_chunk(
                    "events",
                    {
                        "id": np.array([i], dtype=np.int64),
                        "features": rng.normal(size=(1, 4)).astype(np.float32),
                    },
                    "json",
                    f"b{i}",
                )
                messages.append(
                    pstypes.PubsubMessage(data=chunk.payload, attributes=dict(chunk.attributes))
                )
            api.publish(request=pstypes.PublishRequest(topic=topic, messages=messages), timeout=60)
    finally:
        publisher.transport.close()


def _left_over(endpoint: PubSubEndpoint, subscription: str) -> int:
    """Messages still deliverable on ``subscription`` (pulled within 3 s and not acked)."""
    subscriber = endpoint.subscriber()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            try:
                response = subscriber.pull(
                    request={"subscription": subscription, "max_messages": 1000}, timeout=3
                )
            except gexc.DeadlineExceeded:
                return 0
            if response.received_messages:
                return len(response.received_messages)
            time.sleep(0.2)
        return 0
    finally:
        subscriber.close()


async def _drain(variant: str, subscription: str, expect: int) -> dict[str, Any]:
    """In the child process: receive and ack ``expect`` distinct messages."""
    options = dict(VARIANTS[variant])
    mode = options.pop("mode")
    source: Any
    from rowbatch.consumer.sources.pubsub.settings import PubSubSettings  # noqa: PLC0415

    settings = PubSubSettings(subscription=subscription, mode=mode, **options)
    if mode == "streaming":
        from rowbatch.consumer.sources.pubsub.streaming import PubSubSource  # noqa: PLC0415

        source = PubSubSource(settings)
    else:
        from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource  # noqa: PLC0415

        source = PubSubPullSource(settings)
    seen: set[str] = set()
    deliveries = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    first_at = 0.0
    async for delivery in source.deliveries():
        if not deliveries:
            first_at = time.perf_counter()
        deliveries += 1
        seen.add(delivery.message_id)
        await source.ack(delivery)
        if len(seen) >= expect:
            break
    await source.close()  # pull: every ack sent and answered; streaming: queued acks sent
    wall1, cpu1 = time.perf_counter(), time.process_time()
    return {
        "variant": variant,
        "messages": len(seen),
        "deliveries": deliveries,
        "seconds": wall1 - first_at,
        "seconds_with_start": wall1 - wall0,
        "messages_per_s": len(seen) / (wall1 - first_at),
        "cpu_us_per_message": (cpu1 - cpu0) / len(seen) * 1e6,
        "cpu_share": (cpu1 - cpu0) / (wall1 - wall0),
    }


def _emulator_cpu_s(endpoint: PubSubEndpoint) -> float | None:
    """CPU seconds used so far by the emulator process listening on the endpoint's port (the
    JVM; found by its command line), or ``None`` when it is not on this machine."""
    port = endpoint.host.rsplit(":", 1)[-1]
    ticks = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if f"--port={port}".encode() not in argv or b"java" not in argv[0]:
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        return (int(fields[11]) + int(fields[12])) / ticks
    return None


def _run_child(endpoint: PubSubEndpoint, variant: str, subscription: str, expect: int) -> Any:
    env = {**os.environ, **endpoint.env()}
    argv = [sys.executable, "-m", "bench.pubsub_intake", "--drain", variant]
    argv += ["--subscription", subscription, "--messages", str(expect)]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=600, check=False, cwd=REPO_ROOT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{variant} drain failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(endpoint: PubSubEndpoint, messages: int, variants: list[str]) -> list[dict[str, Any]]:
    unique = uuid.uuid4().hex[:8]
    project = f"projects/{endpoint.project}"
    topic = f"{project}/topics/intake-{unique}"
    subs = {v: f"{project}/subscriptions/intake-{unique}-{v}" for v in variants}
    publisher, subscriber = endpoint.publisher(), endpoint.subscriber()
    try:
        publisher.create_topic(name=topic)
        for sub in subs.values():
            subscriber.create_subscription(
                request=pstypes.Subscription(name=sub, topic=topic, ack_deadline_seconds=60)
            )
    finally:
        publisher.transport.close()
        subscriber.close()
    started = time.monotonic()
    _publish_backlog(endpoint, topic, messages)
    print(f"published {messages:,} 1-row messages in {time.monotonic() - started:.1f} s")
    results = []
    for variant in variants:
        emulator_before = _emulator_cpu_s(endpoint)
        result = _run_child(endpoint, variant, subs[variant], messages)
        emulator_after = _emulator_cpu_s(endpoint)
        result["emulator_cpu_us_per_message"] = (
            None
            if emulator_before is None or emulator_after is None
            else (emulator_after - emulator_before) / messages * 1e6
        )
        result["left_on_subscription"] = _left_over(endpoint, subs[variant])
        results.append(result)
        print(
            f"  {variant:<15} {result['messages_per_s']:>9,.0f} msg/s "
            f"{result['cpu_us_per_message']:>7.1f} us CPU/msg",
            flush=True,
        )
    return results


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        f"{'variant':<15} {'messages':>9} {'deliveries':>10} {'msg/s':>9} "
        f"{'CPU us/msg':>10} {'CPU share':>9} {'emulator us/msg':>15} {'left':>5}"
    ]
    for r in results:
        emulator = r.get("emulator_cpu_us_per_message")
        emulator_text = "-" if emulator is None else f"{emulator:.0f}"
        lines.append(
            f"{r['variant']:<15} {r['messages']:>9,} {r['deliveries']:>10,} "
            f"{r['messages_per_s']:>9,.0f} {r['cpu_us_per_message']:>10.1f} "
            f"{r['cpu_share']:>9.2f} {emulator_text:>15} {r['left_on_subscription']:>5}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.pubsub_intake", description=description(__doc__)
    )
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--host", help="a running emulator (host:port); default: start one")
    parser.add_argument("--project", default=DEFAULT_PROJECT)
    parser.add_argument("--json", type=Path, default=Path(".stack/bench/pubsub_intake.json"))
    parser.add_argument("--drain", help=argparse.SUPPRESS)
    parser.add_argument("--subscription", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.drain:
        result = asyncio.run(_drain(opts.drain, opts.subscription, opts.messages))
        print(json.dumps(result))
        return 0
    variants = [v for v in opts.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant(s) {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    if opts.host:
        results = measure(
            PubSubEndpoint(opts.host, opts.project, "emulator"), opts.messages, variants
        )
    else:
        run = RunDir(REPO_ROOT / ".stack" / "bench-intake" / time.strftime("%Y%m%d-%H%M%S"))
        run.root.mkdir(parents=True, exist_ok=True)
        with PubSubService(run, opts.project) as endpoint:
            results = measure(endpoint, opts.messages, variants)
    print()
    print(table(results))
    opts.json.parent.mkdir(parents=True, exist_ok=True)
    opts.json.write_text(json.dumps({"messages": opts.messages, "results": results}, indent=2))
    print(f"\nJSON: {opts.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
