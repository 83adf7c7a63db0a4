"""``rowbatch-consumer dlq stats|show|replay --config FILE [filters]``: the dead-letter tools of
rowbatch/consumer/dlq on the dead-letter queue of a consumer configuration (its ``[source]``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rowbatch.consumer.dlq.queue import DeadLetterQueue, DeadLetterQueueError
from rowbatch.consumer.dlq.replay import (
    DEFAULT_IN_FLIGHT,
    DEFAULT_MAX_REPLAYS,
    ReplayPlan,
    ReplaySummary,
    replay,
)
from rowbatch.consumer.dlq.selection import Selection, SelectionError, parse_moment
from rowbatch.consumer.dlq.show import collect, describe, to_json
from rowbatch.consumer.dlq.stats import Stats
from rowbatch.consumer.service.config import ConfigError, ConsumerConfig, load_config
from rowbatch.consumer.sources.base import SourceConfigError
from rowbatch.consumer.sources.kafka.settings import KafkaSettings
from rowbatch.consumer.sources.kafka_share.settings import KafkaShareSettings
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.table.settings import TableSettings

EXIT_FAILED = 1
"""The broker refused or stopped answering midway (a replay's summary says what was done)."""
EXIT_CONFIG = 2
EXIT_UNREACHABLE = 4

EPILOG = """\
filters (each given must match; repeat one to allow several values):
  --reason undecodable|schema-mismatch|rejected-by-model|too-many-attempts|rejected-by-sink
  --code CODE, --table NAME, --chunk-id ID, --source TOPIC/PARTITION or SUBSCRIPTION
  --since, --until: an ISO 8601 time (UTC unless it names an offset) or an age: 30m, 2h, 7d

reading consumes nothing: Kafka's dead-letter topic (kind "kafka" or "kafka-share") is read
by offsets (no consumer group); Pub/Sub's dead-letter subscription is pulled, held while the
command runs, and nacked at the end (a command killed midway hides what it held for --lease
seconds).

replay publishes each selected letter (payload, key and attributes as the producer sent them,
plus rowbatch-replayed-from and rowbatch-replay-count), waits for the confirmation, then
removes it from the dead-letter queue; a rerun after a crash may publish one again, and the
chunk id keeps its rows from being written twice.

copies of one letter (dead-lettered again after a redelivery: the same chunk id, reason,
code, replay count and payload) count once in stats, show once ("seen N times"), and replay
publishes one and removes every copy once that publish is confirmed.

exit codes: 0 done; 1 the broker failed midway (replay: the summary says what was replayed,
the rest is still in the queue); 2 bad configuration or arguments; 4 the broker did not answer
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rowbatch-consumer dlq",
        description="Inspect and replay the dead letters of a consumer configuration.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "action",
        choices=["stats", "show", "replay"],
        help="stats: counts by reason, table, source, version; show: a few, with their rows; "
        "replay: publish the selected ones back, then remove them",
    )
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="the consumer's TOML (its [source])"
    )
    for name, what in (
        ("reason", "the reason class (rowbatch-dlq-reason)"),
        ("code", "the fine reason code (rowbatch-dlq-code)"),
        ("table", "the chunk's table (rowbatch-table)"),
        ("chunk-id", "the chunk id (rowbatch-chunk-id)"),
        ("source", "where the consumer read it (rowbatch-dlq-source)"),
    ):
        parser.add_argument(
            f"--{name}", action="append", default=[], metavar="VALUE", help=f"{what}; repeatable"
        )
    parser.add_argument("--since", metavar="TIME", help="dead-lettered at or after TIME")
    parser.add_argument("--until", metavar="TIME", help="dead-lettered before TIME")
    parser.add_argument(
        "--limit", type=int, metavar="N", help="show: at most N (default 10); replay: at most N"
    )
    parser.add_argument(
        "--rows", type=int, default=3, metavar="N", help="show: rows to preview (default 3)"
    )
    parser.add_argument("--json", action="store_true", help="stats, show: JSON on stdout")
    parser.add_argument("--to", metavar="TOPIC", help="replay: the topic (default: the source's)")
    parser.add_argument("--dry-run", action="store_true", help="replay: only count what it would")
    parser.add_argument(
        "--max-replays",
        type=int,
        default=DEFAULT_MAX_REPLAYS,
        metavar="N",
        help="replay: hold back letters replayed N times already (default %(default)s)",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=DEFAULT_IN_FLIGHT,
        metavar="N",
        help="replay: letters published and not yet removed at once; each is removed only "
        "after its own publish is confirmed (default %(default)s)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        metavar="PER_SECOND",
        help="replay: start at most this many letters per second (default: no limit)",
    )
    parser.add_argument(
        "--lease",
        type=int,
        default=60,
        metavar="SECONDS",
        help="Pub/Sub: the ack deadline held letters get, renewed while the command runs; a "
        "command killed midway hides them this long (10-600, default %(default)s)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, metavar="SECONDS", help="per broker call"
    )
    return parser


def selection_of(args: argparse.Namespace, now: datetime) -> Selection:
    return Selection(
        reasons=frozenset(args.reason),
        codes=frozenset(args.code),
        tables=frozenset(args.table),
        chunk_ids=frozenset(args.chunk_id),
        sources=frozenset(args.source),
        since=parse_moment(args.since, now=now, option="--since") if args.since else None,
        until=parse_moment(args.until, now=now, option="--until") if args.until else None,
    )


def open_queue(config: ConsumerConfig, timeout_s: float, lease_s: int = 60) -> DeadLetterQueue:
    source = config.source
    if isinstance(source, KafkaSettings):
        from rowbatch.consumer.dlq.kafka_queue import KafkaDeadLetterQueue  # noqa: PLC0415

        return KafkaDeadLetterQueue(source, timeout_s=timeout_s)
    if isinstance(source, KafkaShareSettings):
        # An ordinary topic, read (and replayed to the share group's topic) as the classic
        # source's, with the same brokers, SASL and TLS.
        from rowbatch.consumer.dlq.kafka_queue import KafkaDeadLetterQueue  # noqa: PLC0415

        return KafkaDeadLetterQueue(source.classic_view(), timeout_s=timeout_s)
    if isinstance(source, PubSubSettings):
        if source.dead_letter_topic is None:
            raise ConfigError(
                "[source] names no dead_letter_topic: the consumer nacks poison until the "
                "subscription's own dead-letter policy moves it; set dead_letter_topic (and "
                "dead_letter_subscription) to use the dlq commands"
            )
        from rowbatch.consumer.dlq.pubsub_queue import PubSubDeadLetterQueue  # noqa: PLC0415

        return PubSubDeadLetterQueue(source, timeout_s=timeout_s, lease_s=lease_s)
    from rowbatch.consumer.dlq.table_queue import TableDeadLetterQueue  # noqa: PLC0415

    return TableDeadLetterQueue(source)


async def _stats(queue: DeadLetterQueue, selection: Selection, args: argparse.Namespace) -> int:
    stats = Stats()
    async for letter in queue.letters():
        stats.read += 1
        if selection.matches(letter):
            stats.add(letter)
    if args.json:
        print(json.dumps(stats.to_json(), indent=2))
    else:
        print(f"{queue.where}: {selection.describe()}")
        print("\n".join(stats.lines()))
    return 0


async def _show(queue: DeadLetterQueue, selection: Selection, args: argparse.Namespace) -> int:
    limit = 10 if args.limit is None else args.limit
    shown = await collect(queue.letters(), selection, limit)
    if args.json:
        print(
            json.dumps(
                [to_json(one.letter, args.rows, copies=one.copies) for one in shown], indent=2
            )
        )
        return 0
    copies = sum(len(one.copies) for one in shown)
    collapsed = f", {copies} duplicate{'' if copies == 1 else 's'} collapsed" if copies else ""
    print(f"{queue.where}: {selection.describe()}; {len(shown)} shown (--limit {limit}){collapsed}")
    for one in shown:
        print()
        print("\n".join(describe(one.letter, args.rows, copies=one.copies)))
    return 0


async def _replay(queue: DeadLetterQueue, selection: Selection, args: argparse.Namespace) -> int:
    target = args.to or queue.default_target
    print(
        f"replaying from {queue.where}: {selection.describe()} -> {target}"
        + (" (dry run)" if args.dry_run else ""),
        file=sys.stderr,
    )

    def progress(summary: ReplaySummary) -> None:
        print(f"  {summary.replayed} replayed of {summary.read} read", file=sys.stderr)

    plan = ReplayPlan(
        target=target,
        limit=args.limit,
        dry_run=args.dry_run,
        max_replays=args.max_replays,
        in_flight=args.in_flight,
        rate=args.rate,
    )
    summary = await replay(queue, selection, plan, progress=progress)
    print("\n".join(summary.lines()))
    return EXIT_FAILED if summary.failed else 0


_ACTIONS: dict[str, Callable[[DeadLetterQueue, Selection, argparse.Namespace], Any]] = {
    "stats": _stats,
    "show": _show,
    "replay": _replay,
}


async def _run(config: ConsumerConfig, selection: Selection, args: argparse.Namespace) -> int:
    if args.action == "replay" and isinstance(config.source, TableSettings):
        raise ConfigError(
            "replay: a table run's dead letters are not replayed by publishing; mend the "
            "cause and run the table again with --new-run"
        )
    queue = open_queue(config, args.timeout, args.lease)
    try:
        code: int = await _ACTIONS[args.action](queue, selection, args)
        return code
    finally:
        await queue.close()


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.limit is not None and args.limit < 0:
        parser.error("--limit must be >= 0")
    if args.rows < 0:
        parser.error("--rows must be >= 0")
    if args.in_flight < 1:
        parser.error("--in-flight must be >= 1")
    if args.rate is not None and not args.rate > 0:
        parser.error("--rate must be > 0")
    if not 10 <= args.lease <= 600:
        parser.error("--lease must be within 10-600 seconds (Pub/Sub's ack deadline range)")
    try:
        selection = selection_of(args, datetime.now(UTC))
        config = load_config(args.config)
        return asyncio.run(_run(config, selection, args))
    except (ConfigError, SelectionError, SourceConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except DeadLetterQueueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE


__all__ = ["main", "open_queue"]
