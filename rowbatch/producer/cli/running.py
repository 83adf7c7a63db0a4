"""What both subcommands share: publishing what a feed submits through a window of messages in
flight, counting the acknowledged ones for the progress bar and the summary, and the outcome of
a run (or of one stopped by an error)."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from rowbatch.producer.loadgen.manifest import Manifest
from rowbatch.producer.publishers.base import Publisher
from rowbatch.producer.publishers.errors import PublishError
from rowbatch.producer.publishers.messages import Message, PublishedChunk
from rowbatch.producer.publishers.window import PublishWindow
from rowbatch.progress import Progress, Summary
from rowbatch.tables.errors import InputError
from rowbatch.timing import Clock

Submit = Callable[[Message, int | None], Awaitable[None]]


class UsageError(Exception):
    """A bad combination of options (exit status 2)."""


class RunFailed(Exception):
    """A run stopped by ``cause`` (an InputError or PublishError) after it had started
    publishing; ``outcome`` is what it did until then."""

    def __init__(self, cause: InputError | PublishError, outcome: Outcome) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.outcome = outcome


@dataclass
class Tally:
    """Acknowledged messages, for the progress bar and the summary. The summary's seconds run
    from ``started`` (before the input is opened) to ``ended``, less ``connect_s`` (the
    publisher's start: connecting, checking the topic)."""

    progress: Progress
    started: float
    rows: int = 0
    chunks: int = 0
    bytes: int = 0
    connect_s: float = 0.0
    ended: float | None = None

    @property
    def seconds(self) -> float:
        ended = self.ended if self.ended is not None else self.started
        return max(ended - self.started - self.connect_s, 0.0)

    def done(self, published: PublishedChunk) -> None:
        self.rows += published.rows
        self.chunks += 1
        self.bytes += published.bytes
        self.progress.add(rows=published.rows, nbytes=published.bytes)


@dataclass
class Outcome:
    """What a run did: the summary, and the load generator's manifest."""

    summary: Summary
    manifest: Manifest | None = None
    error: str | None = None


async def publish_all(
    publisher: Publisher,
    tally: Tally,
    feed: Callable[[Submit], Awaitable[None]],
    *,
    clock: Clock,
    max_in_flight: int,
    ordering_key: str | None,
) -> None:
    """Starts the publisher, runs ``feed(submit)`` and waits for every acknowledgement. When
    the input turns out bad part way (``InputError``), what was submitted before it is still
    confirmed before the error is raised, so the partial summary counts exactly what the
    broker has (cancelling it would leave chunks published or not, unknown); a failure to
    publish cancels what is in flight."""
    before = clock()
    await publisher.start()
    tally.connect_s = clock() - before
    window = PublishWindow(publisher, max_in_flight=max_in_flight, on_done=tally.done)

    async def submit(message: Message, rows: int | None = None) -> None:
        await window.submit(message, key=ordering_key, rows=rows)

    try:
        try:
            await feed(submit)
        except InputError:
            await window.drain()
            await publisher.flush()
            raise
        await window.drain()
        await publisher.flush()
    except BaseException:
        await window.cancel()
        raise
    finally:
        tally.ended = clock()
        tally.progress.finish()


async def run_to_outcome(
    publisher: Publisher,
    tally: Tally,
    feed: Callable[[Submit], Awaitable[None]],
    opts: argparse.Namespace,
    prefix: str,
    *,
    clock: Clock,
    manifest: Callable[[], Manifest | None] = lambda: None,
) -> Outcome:
    """:func:`publish_all` with the options' window and ordering key: the run's outcome, or
    ``RunFailed`` with what it did until an ``InputError`` or ``PublishError`` stopped it.
    ``manifest`` gives the load generator's manifest once the run ends."""
    try:
        await publish_all(
            publisher,
            tally,
            feed,
            clock=clock,
            max_in_flight=opts.max_in_flight,
            ordering_key=opts.ordering_key,
        )
    except (InputError, PublishError) as exc:
        partial = Outcome(summarize(tally, publisher, opts, prefix, complete=False), manifest())
        raise RunFailed(exc, partial) from exc
    return Outcome(summarize(tally, publisher, opts, prefix, complete=True), manifest())


def summarize(
    tally: Tally, publisher: Publisher, opts: argparse.Namespace, prefix: str, complete: bool
) -> Summary:
    return Summary(
        broker=publisher.broker,
        topic=publisher.topic,
        encoding=opts.encoding,
        rows=tally.rows,
        chunks=tally.chunks,
        bytes=tally.bytes,
        seconds=tally.seconds,
        id_prefix=prefix,
        complete=complete,
    )


__all__ = [
    "Outcome",
    "RunFailed",
    "Submit",
    "Tally",
    "UsageError",
    "publish_all",
    "run_to_outcome",
    "summarize",
]
