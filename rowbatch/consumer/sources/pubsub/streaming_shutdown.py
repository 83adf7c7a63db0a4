"""How the streaming-pull source (``streaming.py``) shuts down: it ends google-cloud-pubsub's
streaming pull (half-close first, cancel if the server does not end it) and only then nacks
its unsettled messages, with the plain ModifyAckDeadline(0) RPC on their ack ids.

Cancelling the stream stops the client's reader, waits for running callbacks (the source
passes ``await_callbacks_on_shutdown=True``), nacks messages still on hold, lets the
dispatcher send the acks/nacks already queued, and stops the leaser. Nacking through
``Message.nack`` while the stream is open makes Pub/Sub hand the messages straight back to
the closing stream, and whatever is in transit when it closes only comes back after its ack
deadline (up to 600 s).

The stream is first *half-closed* (the client ends its request stream, the server then ends
the call) and cancelled only if the server has not ended it within ``_HALF_CLOSE_WAIT_S``.
The official emulator (0.8.20) never notices a cancelled stream (its grpc-netty fails in
``onRstStreamRead``): the dead stream keeps pulling messages, nacked ones included, and sends
them nowhere, so they came back only after the stream's ack deadline (60 s by default), once
per round it wins."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1

_LOG = logging.getLogger(__name__)

_SHUTDOWN_TIMEOUT_S = 60.0
_HALF_CLOSE_WAIT_S = 2.0
"""How long to wait for the server to end the streaming pull after half-closing it, before
cancelling it."""
_NACK_CHUNK = 500
"""Ack ids per ModifyAckDeadline request (the request size limit is 512 KB)."""

StreamingPullFuture = Any
"""``google.cloud.pubsub_v1.subscriber.futures.StreamingPullFuture`` (the library ships no
type information)."""


async def stop_streaming_pull(streaming: StreamingPullFuture, subscription: str) -> None:
    """Half-close the streaming pull, cancel it, and wait (bounded) until it is down."""
    if half_close(streaming, subscription):
        outcome = await asyncio.to_thread(stream_result, streaming, _HALF_CLOSE_WAIT_S)
        _LOG.debug("streaming pull on %s after half-close: %s", subscription, outcome)
    streaming.cancel()  # a no-op once the stream has ended
    # Not asyncio.wrap_future: a cancelled StreamingPullFuture reports cancelled() at once,
    # while result() waits for the shutdown to finish.
    outcome = await asyncio.to_thread(stream_result, streaming, _SHUTDOWN_TIMEOUT_S)
    if outcome == "timeout":
        _LOG.warning(
            "streaming pull on %s did not stop within %g s", subscription, _SHUTDOWN_TIMEOUT_S
        )
    else:
        _LOG.debug("streaming pull on %s ended: %s", subscription, outcome)


def half_close(streaming: StreamingPullFuture, subscription: str) -> bool:
    """End the streaming pull's request stream, so that the server ends the call (rather
    than have it cancelled). The client library has no public way to do this: it ends
    its request generator when ``None`` is queued on the RPC's request queue (what
    ``BidiRpc.close`` does, right after cancelling). False when the library's internals
    are not what this expects (the stream is then only cancelled)."""
    manager = getattr(streaming, "_StreamingPullFuture__manager", None)
    rpc = getattr(manager, "_rpc", None)
    requests = getattr(rpc, "_request_queue", None)
    if requests is None or not hasattr(requests, "put"):
        _LOG.debug("cannot half-close the streaming pull on %s: cancelling it", subscription)
        return False
    requests.put(None)
    return True


def stream_result(streaming: StreamingPullFuture, timeout: float) -> str:
    """Blocking; waits for the streaming pull's shutdown and says how it ended (never
    raises: its error, if any, was reported when it happened)."""
    try:
        streaming.result(timeout=timeout)
    except TimeoutError:
        return "timeout"
    except Exception as exc:  # noqa: BLE001 - StopIteration when the server ended it
        return f"ended ({type(exc).__name__})"
    return "ended"


def nack_after_close(
    subscriber: pubsub_v1.SubscriberClient, subscription: str, ack_ids: list[str]
) -> None:
    """Blocking; runs in a worker thread after the stream is down. One ModifyAckDeadline(0)
    per ``_NACK_CHUNK`` ack ids, each with a 10 s deadline; a failed one is logged."""
    started = time.monotonic()
    for start in range(0, len(ack_ids), _NACK_CHUNK):
        chunk = ack_ids[start : start + _NACK_CHUNK]
        try:
            subscriber.modify_ack_deadline(
                request={
                    "subscription": subscription,
                    "ack_ids": chunk,
                    "ack_deadline_seconds": 0,
                },
                timeout=10.0,
            )
        except gexc.GoogleAPIError as exc:
            _LOG.warning(
                "could not nack %d message(s) on %s (%s): they come back when their ack "
                "deadline lapses",
                len(chunk),
                subscription,
                exc,
            )
    _LOG.info(
        "nacked %d unsettled message(s) on %s at close (ModifyAckDeadline 0, answered in %.2f s)",
        len(ack_ids),
        subscription,
        time.monotonic() - started,
    )
