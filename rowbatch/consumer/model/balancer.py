"""Several model servers behind one inferencer. Each request goes to the healthy endpoint with
the fewest requests outstanding, within that endpoint's own in-flight limit. An endpoint that
fails (UNAVAILABLE, a connection error, NOT_FOUND for the model it served, a timeout) is taken
out and probed back with backoff, and the request is sent again at once to another one;
RESOURCE_EXHAUSTED halves that endpoint's limit and cools it down briefly. With ``admission``,
each endpoint's limit is a window that follows its server's own queue (Triton's statistics,
:mod:`rowbatch.consumer.model.admission`) below that ceiling. Only when no
endpoint is left to try does the failure reach the caller (a :class:`RetryingInferencer`,
which backs off and pauses intake), and the retries then go to the endpoints that are out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from rowbatch.consumer.model.admission import AdmissionSettings, QueueFollower, StatsClient
from rowbatch.consumer.model.answer import Answer
from rowbatch.consumer.model.endpoint_probe import HealthTiming, Prober, Reference
from rowbatch.consumer.model.endpoint_state import (
    Endpoint,
    EndpointClient,
    EndpointMeter,
    Health,
    NoMeter,
    choose,
)
from rowbatch.consumer.model.inference.errors import (
    InferenceError,
    RetryableInferenceError,
    error_kind,
    is_exhausted,
)
from rowbatch.consumer.model.spec import ModelSpec
from rowbatch.consumer.model.window import Window
from rowbatch.timing import SYSTEM_CLOCKS, Clocks

log = logging.getLogger(__name__)

UNREAD_RESET = 3
"""Failed readings of a server's statistics in a row after which its window is back at the
endpoint's limit."""


def _ignore(_: InferenceError) -> None:
    return None


def _no_meter(_: str) -> EndpointMeter:
    return NoMeter()


class Balancer:
    """Least-outstanding-requests balancing with failover over model-server endpoints; an
    :class:`rowbatch.consumer.model.inference.retry.Inferencer`.

    Life cycle: :meth:`track` the addresses found at start (clients come from ``connect``),
    discover their model, then :meth:`start` with the reference spec, the per-endpoint limit
    and what each endpoint answered (the others are probed until they serve the same spec);
    :meth:`update` (or :meth:`follow`) as DNS changes; :meth:`close`.

    ``meter`` gives each endpoint its metrics (forgotten when the endpoint is dropped),
    ``on_error`` sees every failed request (the consumer's error counter); ``clocks`` (its
    monotonic clock, ``sleep`` and jitter ``rng``) is injectable for tests; ``admission``
    (None: fixed limits) makes each endpoint's limit follow its server's queue."""

    def __init__(
        self,
        model: str,
        connect: Callable[[str], EndpointClient],
        *,
        meter: Callable[[str], EndpointMeter] = _no_meter,
        on_error: Callable[[InferenceError], None] = _ignore,
        timing: HealthTiming | None = None,
        clocks: Clocks = SYSTEM_CLOCKS,
        admission: AdmissionSettings | None = None,
    ) -> None:
        self.model = model
        self._admission = admission
        self._connect = connect
        self._meter = meter
        self._on_error = on_error
        self._timing = timing or HealthTiming()
        self._clock = clocks.monotonic
        self._sleep = clocks.sleep
        self._rng = clocks.rng or random.Random()  # noqa: S311 (jitter, not secrets)
        self._prober = Prober(self._timing, self._set_health, sleep=clocks.sleep, rng=self._rng)
        self._endpoints: list[Endpoint] = []
        self._turn = 0
        self._wake = asyncio.Event()
        self._waiting = 0
        self._tasks: set[asyncio.Task[None]] = set()
        """Probes and the DNS follower: cancelled on close."""
        self._closing: set[asyncio.Task[None]] = set()
        """Retired endpoints' clients being closed: awaited on close."""

    # --- membership ---------------------------------------------------------------------------

    @property
    def endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(self._endpoints)

    @property
    def capacity(self) -> int:
        """Requests all endpoints not retired take at once (sum of their limits)."""
        return sum(ep.limit for ep in self._endpoints if ep.health is not Health.RETIRED)

    @property
    def saturated(self) -> bool:
        """Every endpoint that takes requests runs full with requests waiting (admission on): the
        servers, not this consumer, limit the flow; more consumers would only wait there."""
        healthy = [ep for ep in self._endpoints if ep.health is Health.HEALTHY]
        return bool(healthy) and all(
            ep.follower is not None and ep.follower.saturated for ep in healthy
        )

    def track(self, addresses: Iterable[str]) -> None:
        """Add endpoints (pending, not probed) for the addresses not known yet."""
        known = {ep.address for ep in self._endpoints}
        for address in addresses:
            if address not in known:
                known.add(address)
                ep = Endpoint(address, self._connect(address), self._meter(address))
                self._endpoints.append(ep)
                self._admit(ep)

    def start(
        self,
        reference: ModelSpec,
        limit_for: Callable[[ModelSpec], int],
        discovered: Mapping[str, ModelSpec],
    ) -> None:
        """Endpoints in ``discovered`` (address -> the spec it answered, equal to
        ``reference`` where it matters) take requests; the others are probed."""
        first = next((ep.address for ep in self._endpoints if ep.address in discovered), "")
        self._prober.reference = Reference(reference, first, limit_for)
        for ep in self._endpoints:
            spec = discovered.get(ep.address)
            ep.set_limit(limit_for(spec or reference))
            if spec is None:
                log.warning("inference endpoint %s does not answer yet; probing it", ep.address)
                self._set_health(ep, Health.PENDING)
                self._start_probe(ep)
            else:
                ep.spec = spec
                self._set_health(ep, Health.HEALTHY)
            self._watch(ep)

    def update(self, addresses: Sequence[str]) -> None:
        """The endpoints are now ``addresses``: new ones are discovered and join when they
        serve the same spec; missing ones are retired (closed once their requests are
        answered)."""
        wanted = set(addresses)
        self.track(addresses)
        for ep in list(self._endpoints):
            if ep.address not in wanted:
                if ep.health is not Health.RETIRED:
                    log.info("inference endpoint %s is gone; retiring it", ep.address)
                    self._stop_probe(ep)
                    self._set_health(ep, Health.RETIRED)
                    if ep.outstanding == 0:
                        self._drop(ep)
            elif ep.health is Health.RETIRED or (ep.health is Health.PENDING and ep.probe is None):
                if ep.spec is None:
                    reference = self._require_reference()
                    ep.set_limit(reference.limit_for(reference.spec))
                log.info("inference endpoint %s appeared; probing it", ep.address)
                self._set_health(ep, Health.DOWN if ep.spec is not None else Health.PENDING)
                self._start_probe(ep)

    def follow(self, resolve: Callable[[], Awaitable[Sequence[str]]], interval_s: float) -> None:
        """Every ``interval_s``, :meth:`update` to what ``resolve`` answers (unless empty)."""
        self._spawn(self._follow(resolve, interval_s), "rowbatch-endpoints-resolve")

    async def _follow(
        self, resolve: Callable[[], Awaitable[Sequence[str]]], interval_s: float
    ) -> None:
        while True:
            await self._sleep(interval_s)
            try:
                addresses = await resolve()
            except Exception:
                log.warning("resolving the inference endpoints failed", exc_info=True)
                continue
            if addresses:
                self.update(addresses)

    async def any_healthy(self) -> bool:
        """Whether some endpoint takes requests (the readiness probe of the retry loop)."""
        return any(ep.health is Health.HEALTHY for ep in self._endpoints)

    async def close(self) -> None:
        for ep in self._endpoints:
            self._stop_probe(ep)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        closing = [ep.client.close() for ep in self._endpoints]
        self._endpoints.clear()
        await asyncio.gather(*closing, *self._closing, return_exceptions=True)

    # --- requests -----------------------------------------------------------------------------

    async def infer(
        self, inputs: Sequence[Any], outputs: Sequence[str], *, client_timeout: float | None = None
    ) -> Answer:
        """The answer of one endpoint; failing over while another is left to try."""
        tried: list[Endpoint] = []
        last: RetryableInferenceError | None = None
        while True:
            ep = await self._acquire(tried, last)
            try:
                answer = await ep.client.infer(inputs, outputs, client_timeout=client_timeout)
            except InferenceError as exc:
                self._failed(ep, exc)
                if not isinstance(exc, RetryableInferenceError):
                    raise
                tried.append(ep)
                last = exc
                continue
            finally:
                self._release(ep)
            self._answered(ep, answer)
            return answer

    async def _acquire(
        self, tried: list[Endpoint], last: RetryableInferenceError | None
    ) -> Endpoint:
        while True:
            self._turn += 1
            choice = choose(self._endpoints, tried, self._clock(), self._turn)
            if isinstance(choice, Endpoint):
                break
            if choice is None:  # no healthy endpoint left to try
                if last is not None:
                    raise last
                choice = self._fallback()
                break
            if last is not None and not choice.full:  # every one left is cooling down
                raise last
            await self._changed(choice.until)
        choice.outstanding += 1
        if choice.window is not None:
            choice.window.take()
        choice.meter.sent()
        choice.meter.in_flight(choice.outstanding)
        return choice

    def _fallback(self) -> Endpoint:
        """No endpoint is healthy: the least busy of those that are out (the caller is backing
        off between these attempts), so a server back before its probe noticed is used."""
        down = [ep for ep in self._endpoints if ep.health is Health.DOWN]
        if not down:
            states = ", ".join(f"{ep.address} {ep.health.value}" for ep in self._endpoints)
            raise RetryableInferenceError(
                f"model {self.model!r}: no inference endpoint takes requests ({states})",
                model=self.model,
                status="UNAVAILABLE",
            )
        self._turn += 1
        start = self._turn % len(down)
        return min(down[start:] + down[:start], key=lambda ep: ep.outstanding)

    async def _changed(self, until: float | None) -> None:
        """Until an endpoint's state changes, or ``until`` (clock seconds) if given."""
        wake = self._wake
        self._waiting += 1
        try:
            if until is None:
                await wake.wait()
            else:
                await _first(wake.wait(), self._sleep(max(0.0, until - self._clock())))
        finally:
            self._waiting -= 1

    def _notify(self) -> None:
        if self._waiting:
            self._wake.set()
            self._wake = asyncio.Event()

    def _release(self, ep: Endpoint) -> None:
        ep.outstanding -= 1
        if ep.window is not None:
            ep.window.give()
        ep.meter.in_flight(ep.outstanding)
        if ep.health is Health.RETIRED and ep.outstanding == 0:
            self._drop(ep)
        self._notify()

    def _answered(self, ep: Endpoint, answer: Answer) -> None:
        ep.meter.answered(answer.rows())
        if ep.window is not None:
            ep.window.answered()
        elif ep.allowed < ep.limit:
            ep.allow(ep.allowed + 1)
        ep.strikes = ep.exhaustions = 0
        if ep.health is Health.DOWN:
            log.info("inference endpoint %s answered again; sending it requests", ep.address)
            self._stop_probe(ep)
            self._set_health(ep, Health.HEALTHY)

    def _failed(self, ep: Endpoint, exc: InferenceError) -> None:
        self._on_error(exc)
        ep.meter.failed(error_kind(exc))
        if not isinstance(exc, RetryableInferenceError):
            return
        if is_exhausted(exc):
            ep.exhaustions += 1
            if ep.window is not None:
                ep.window.overloaded(self._clock())
            else:
                ep.allow(max(1, ep.allowed // 2))
            ep.cool_until = self._clock() + self._timing.cooldown.wait(ep.exhaustions, self._rng)
            if ep.exhaustions == 1:
                log.warning(
                    "inference endpoint %s is overloaded (%s); sending it less", ep.address, exc
                )
        elif ep.health is Health.HEALTHY:
            ep.strikes += 1
            log.warning(
                "inference endpoint %s taken out (%s); probing it until it answers ready",
                ep.address,
                exc,
            )
            self._set_health(ep, Health.DOWN)
            self._start_probe(ep)

    # --- health -------------------------------------------------------------------------------

    def _set_health(self, ep: Endpoint, health: Health) -> None:
        ep.health = health
        ep.meter.healthy(health is Health.HEALTHY)
        self._notify()

    def _start_probe(self, ep: Endpoint) -> None:
        if ep.probe is None:
            ep.probe = self._spawn(self._prober.run(ep), f"rowbatch-probe-{ep.address}")

    def _stop_probe(self, ep: Endpoint) -> None:
        task, ep.probe = ep.probe, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _require_reference(self) -> Reference:
        if self._prober.reference is None:
            raise RuntimeError("Balancer.start was not called")
        return self._prober.reference

    # --- admission ----------------------------------------------------------------------------

    def _admit(self, ep: Endpoint) -> None:
        """With admission, and a client that reads its server's statistics: ``ep``'s window
        (reset to its limit by ``set_limit``), and the task that reads them (now, in a
        running loop; else from :meth:`start`: :meth:`track` may run before the loop does)."""
        if self._admission is None or not isinstance(ep.client, StatsClient):
            return
        ep.window = Window(ep.limit, ep.limit, on_change=ep.allow, on_room=self._notify)
        ep.follower = QueueFollower(ep.window, ep.meter, self._admission.target_queue_ratio)
        with contextlib.suppress(RuntimeError):  # no running loop: started by start()
            asyncio.get_running_loop()
            self._watch(ep)

    def _watch(self, ep: Endpoint) -> None:
        client, follower = ep.client, ep.follower
        if self._admission is None or follower is None or ep.watch is not None:
            return
        if isinstance(client, StatsClient):
            reading = self._read_queue(ep, client, follower, self._admission.interval_s)
            ep.watch = self._spawn(reading, f"rowbatch-admission-{ep.address}")

    async def _read_queue(
        self, ep: Endpoint, client: StatsClient, follower: QueueFollower, interval_s: float
    ) -> None:
        """Every ``interval_s``, the server's totals to ``ep``'s follower (while it takes
        requests); ends when the server keeps no statistics (its window stays fixed). After
        :data:`UNREAD_RESET` readings in a row fail, whatever the error, the window is back at
        the endpoint's limit (no reading could grow it again) until one succeeds."""
        failures = 0
        while True:
            await self._sleep(interval_s)
            if ep.health is not Health.HEALTHY:
                follower.last = None  # no reading spans an outage
                continue
            try:
                totals = await client.queue_totals(self._clock())
            except Exception as exc:  # noqa: BLE001  # never ends the reading, never stops a request
                failures += 1
                follower.last = None
                if failures == UNREAD_RESET:
                    log.warning(
                        "cannot read the statistics of %s (%s: %s); its window is back at %d "
                        "until a reading succeeds",
                        ep.address,
                        type(exc).__name__,
                        exc,
                        ep.limit,
                    )
                    if ep.window is not None:
                        ep.window.reset(ep.limit)
                continue
            failures = 0
            if totals is None:
                log.info(
                    "inference endpoint %s keeps no model statistics for %r: its window stays "
                    "at %d, moved only by RESOURCE_EXHAUSTED",
                    ep.address,
                    self.model,
                    ep.limit,
                )
                ep.watch = None
                return
            follower.totals(totals)

    # --- tasks --------------------------------------------------------------------------------

    def _drop(self, ep: Endpoint) -> None:
        """A retired endpoint with nothing outstanding: gone, its series with it (a series left
        behind would report it out, ``RowbatchModelEndpointOut``, after every rollout)."""
        self._endpoints.remove(ep)
        if ep.watch is not None:
            ep.watch.cancel()
        ep.meter.forget()
        self._spawn(ep.client.close(), f"rowbatch-close-{ep.address}", self._closing)

    def _spawn(
        self,
        coro: Coroutine[Any, Any, None],
        name: str,
        into: set[asyncio.Task[None]] | None = None,
    ) -> asyncio.Task[None]:
        tasks = self._tasks if into is None else into
        task = asyncio.get_running_loop().create_task(coro, name=name)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task


async def _first(*waits: Awaitable[Any]) -> None:
    """Until the first of ``waits`` is done; the others are cancelled."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)
