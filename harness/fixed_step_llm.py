"""A fixed-step generative server for benchmarks of a consumer's concurrency window: it imitates
a continuous-batching LLM server (vLLM) over the OpenAI-compatible HTTP API, with every step
taking a fixed wall time, so what a bench measures is the consumer's window, not a model.

``python -m harness.fixed_step_llm --port P --slots N --step-ms S --max-waiting Q`` serves:

- ``N`` slots. A scheduler ticks every ``S`` ms on the monotonic clock, at deadlines on a fixed
  grid (no drift: late ticks run back to back to catch up; it sleeps while nothing runs or
  waits). At each tick every running request generates one token; a request that has its
  completion length (the request's ``max_tokens``, at most ``--tokens``; ``--tokens`` when
  absent) finishes and frees its slot; then waiting requests are admitted into the free slots,
  first come first served (continuous batching). A request that arrives between ticks waits
  for the next one, as in vLLM's engine loop, so ``T`` tokens take between ``T`` and ``T + 1``
  steps.
- A waiting queue of ``Q`` beyond the slots: a request that finds ``N + Q`` requests already
  running or waiting is answered at once with HTTP 429, an OpenAI-style error body and
  ``Retry-After: 1``. A completions request of several prompts is all of them or none.
- ``POST /v1/chat/completions``, ``/v1/completions`` (``prompt`` a string or a list: one engine
  request per prompt, answered when all are done), ``/v1/embeddings`` (one tick per input, a
  deterministic unit vector of ``--dim``), ``GET /v1/models``, ``GET /health``. The text is
  ``"x"`` per token, ``finish_reason`` is ``"length"``, and ``usage`` counts
  ``len(prompt) // 4 + 1`` prompt tokens per prompt.
- ``GET /metrics`` (Prometheus text, vLLM's names: ``vllm:num_requests_running``,
  ``vllm:num_requests_waiting``, ``vllm:request_success_total``...) and
  ``rowbatch_fixed_step_rejected_total`` (the 429s).
- ``GET /stats`` (JSON, for the bench; ``POST /stats/reset`` starts it again): ticks, the slot
  occupancy between the first admitted request and the last finished one, the waiting queue's
  length at each tick of that window (p50, p90, p99, max), requests served, 429s, how late the
  ticks ran and the process's CPU time.

Not a correctness fixture: no tokenizer, no sampling. ``model`` (another name: 404),
``max_tokens`` (or ``max_completion_tokens``), ``prompt``/``messages``/``input`` are read,
``stream`` and ``n`` > 1 refused (400), other fields ignored. A client that disconnects does not
abort its request (its slot stays busy until it finishes). HTTP/1.1 with keep-alive and
``Content-Length`` bodies (no chunked requests), one request at a time per connection; stdlib,
numpy and orjson only, one thread.

Its own ceiling (2-core machine, slots 256, step 1 ms, tokens 1, a closed-loop C client on the
other core): about 44,000-48,000 chat requests/s with the process at 100 % of one core, about
21 us of CPU per request, plus about 45 us per tick while anything runs (4-5 % of a core at
1 ms steps). Ticks run late by ~0.6 ms on average when lightly loaded (the event loop sleeps in
whole milliseconds; ~10 % of 1 ms ticks are over a step late, so prefer steps of 5 ms or more
where timing matters) and by more than a step once the process nears its ceiling: /stats reports
both (``tick_lag_ms``, ``late_ticks``), so a bench sees when the server, not the client, is the
limit. An httpx client process tops out at ~400-800 requests/s, far below it.

:class:`FixedStepLlmService` runs it as a child process on 127.0.0.1 for tests and benches.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import math
import os
import signal
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

import numpy as np
import orjson

from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.service import REPO_ROOT, ManagedService, RunDir

log = logging.getLogger(__name__)

DEFAULT_MODEL: Final = "fixed-step"
DEFAULT_TOKENS: Final = 16
DEFAULT_DIM: Final = 8
READY_TIMEOUT_S: Final = 30.0
#: Percentiles of the waiting queue's length that /stats reports.
QUEUE_PERCENTILES: Final = (50, 90, 99)

_MAX_HEAD_BYTES: Final = 64 * 1024
_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
#: Ticks caught up in one go before the loop gets to read sockets again.
_MAX_CATCH_UP: Final = 16
#: Further behind than this, the missed ticks are dropped (counted), not run: the process was
#: stopped or starved, and a burst of ticks would not imitate anything.
_MAX_BEHIND_S: Final = 1.0


# --- the scheduler: pure, driven by explicit tick() calls -------------------------------------


class Job:
    """One engine request: ``tokens`` steps in a slot. ``on_done`` is called by the driver (not
    by the scheduler) once :meth:`Scheduler.tick` returns the job as finished."""

    __slots__ = ("admitted_tick", "finished_tick", "on_done", "tokens")

    def __init__(self, tokens: int, on_done: Callable[[Job], None] | None = None) -> None:
        if tokens < 1:
            raise ValueError(f"a job runs for at least one tick, not {tokens}")
        self.tokens = tokens
        self.on_done = on_done
        self.admitted_tick = -1
        self.finished_tick = -1

    def __repr__(self) -> str:
        return (
            f"Job(tokens={self.tokens}, admitted={self.admitted_tick}, "
            f"finished={self.finished_tick})"
        )


def histogram_percentile(histogram: Mapping[int, int], percent: float) -> int:
    """The nearest-rank percentile of samples given as ``{value: count}``: the smallest value
    with at least ``percent`` % of the samples at or below it (numpy's ``inverted_cdf``).
    0 for no samples."""
    total = sum(histogram.values())
    if total == 0:
        return 0
    rank = max(1, math.ceil(round(percent * total / 100, 9)))
    seen = 0
    for value in sorted(histogram):
        seen += histogram[value]
        if seen >= rank:
            return value
    return max(histogram)


@dataclass(frozen=True)
class SchedulerStats:
    """What the scheduler saw since its last reset.

    The window runs from the tick that admitted the first request (or the reset, if requests
    were running then) to the tick at which the last request finished; ``window_ticks`` steps.
    ``occupancy`` is ``occupied_slot_ticks / (slots * window_ticks)`` (None before a request
    finished). ``waiting_histogram`` is the waiting queue's length after each tick's admissions
    for each step of the window, ``{length: steps}``."""

    slots: int
    max_waiting: int
    ticks: int
    window_ticks: int
    occupied_slot_ticks: int
    occupancy: float | None
    waiting_histogram: Mapping[int, int]
    served: int
    rejected: int
    running: int
    waiting: int

    def waiting_percentile(self, percent: float) -> int:
        return histogram_percentile(self.waiting_histogram, percent)

    @property
    def waiting_max(self) -> int:
        return max(self.waiting_histogram, default=0)


class Scheduler:
    """Continuous batching over ``slots`` slots with a waiting queue of ``max_waiting`` beyond
    them. No clock: each :meth:`tick` is one step, for the caller to time.

    A tick, in order: every running job generates one token (the step that ends at this tick);
    jobs with all their tokens finish and free their slots; waiting jobs are admitted FIFO into
    the free slots (they generate their first token at the next tick). A job admitted at tick
    ``a`` finishes at tick ``a + tokens``."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        if slots < 1 or max_waiting < 0:
            raise ValueError(f"slots >= 1 and max_waiting >= 0, not {slots} and {max_waiting}")
        self.slots = slots
        self.max_waiting = max_waiting
        self.tick_index = 0  # ticks since start (never reset): admission and finish times
        self._waiting: deque[Job] = deque()
        self._finishing: dict[int, list[Job]] = {}  # finish tick -> jobs
        self._running = 0
        # Monotonic totals (Prometheus counters).
        self.served_total = 0
        self.rejected_total = 0
        self.tokens_total = 0
        self._reset_window()

    def _reset_window(self) -> None:
        self._ticks = 0
        self._busy = 0  # occupied slot-ticks since the reset
        self._served = 0
        self._rejected = 0
        self._first_tick: int | None = None
        self._busy_at_first = 0
        self._last_finish_tick: int | None = None
        self._busy_at_last_finish = 0
        self._histogram: dict[int, int] = {}  # committed: steps up to the last finish
        self._pending: dict[int, int] = {}  # steps since the last finish

    @property
    def running(self) -> int:
        return self._running

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def idle(self) -> bool:
        return self._running == 0 and not self._waiting

    def room(self) -> int:
        """Jobs :meth:`submit` would take now."""
        return self.slots + self.max_waiting - self._running - len(self._waiting)

    def submit(self, jobs: Sequence[Job]) -> bool:
        """Queue ``jobs`` (all or none) for admission at the next tick; False, and one more
        rejection, when they do not all fit within the slots plus the waiting queue."""
        if len(jobs) > self.room():
            self.rejected_total += 1
            self._rejected += 1
            return False
        self._waiting.extend(jobs)
        return True

    def tick(self) -> list[Job]:
        """One step; the jobs that finished at it."""
        self.tick_index += 1
        now = self.tick_index
        self._ticks += 1
        self._busy += self._running
        self.tokens_total += self._running
        finished = self._finishing.pop(now, None) or []
        if finished:
            self._running -= len(finished)
            self._served += len(finished)
            self.served_total += len(finished)
            for job in finished:
                job.finished_tick = now
            if self._first_tick is not None:
                self._last_finish_tick = now
                self._busy_at_last_finish = self._busy
                for length, count in self._pending.items():
                    self._histogram[length] = self._histogram.get(length, 0) + count
                self._pending.clear()
        free = self.slots - self._running
        if free and self._waiting:
            admitted = min(free, len(self._waiting))
            for _ in range(admitted):
                job = self._waiting.popleft()
                job.admitted_tick = now
                self._finishing.setdefault(now + job.tokens, []).append(job)
            self._running += admitted
            if self._first_tick is None:
                self._first_tick = now
                self._busy_at_first = self._busy
        if self._first_tick is not None:
            length = len(self._waiting)
            self._pending[length] = self._pending.get(length, 0) + 1
        return finished

    def skip_idle(self, ticks: int) -> None:
        """Account for ``ticks`` ticks with nothing running, without running them (the driver
        sleeps while idle). Jobs submitted meanwhile arrived after those ticks."""
        if ticks <= 0:
            return
        if self._running:
            raise RuntimeError(f"skip_idle with {self._running} jobs running")
        self.tick_index += ticks
        self._ticks += ticks
        if self._first_tick is not None:
            self._pending[0] = self._pending.get(0, 0) + ticks

    def reset_stats(self) -> None:
        """Start the stats again (not the totals); requests running now open the window."""
        self._reset_window()
        if self._running:
            self._first_tick = self.tick_index

    def stats(self) -> SchedulerStats:
        window = occupied = 0
        occupancy = None
        if self._first_tick is not None and self._last_finish_tick is not None:
            window = self._last_finish_tick - self._first_tick
            occupied = self._busy_at_last_finish - self._busy_at_first
            occupancy = occupied / (self.slots * window) if window else None
        return SchedulerStats(
            slots=self.slots,
            max_waiting=self.max_waiting,
            ticks=self._ticks,
            window_ticks=window,
            occupied_slot_ticks=occupied,
            occupancy=occupancy,
            waiting_histogram=dict(self._histogram),
            served=self._served,
            rejected=self._rejected,
            running=self._running,
            waiting=len(self._waiting),
        )


# --- the clock: ticks on a fixed grid of the event loop's monotonic clock ----------------------


class LoopClock(Protocol):
    """What the driver needs of an event loop (unit tests give a fake one)."""

    def time(self) -> float: ...

    def call_at(self, when: float, callback: Callable[[], object], /) -> object: ...


class TickDriver:
    """Runs ``scheduler.tick()`` every ``step_s`` on the loop's (monotonic) clock, at
    ``t0 + k * step_s``; sleeps while the scheduler is idle (the skipped ticks are accounted
    for when a job arrives) and calls each finished job's ``on_done``."""

    def __init__(self, scheduler: Scheduler, step_s: float, loop: LoopClock) -> None:
        if step_s <= 0:
            raise ValueError(f"step must be positive, not {step_s}")
        self.scheduler = scheduler
        self.step_s = step_s
        self._loop = loop
        self._t0 = loop.time()
        self._grid = 0  # grid index of the last tick run or skipped
        self._scheduled = False
        self.reset_stats()

    def reset_stats(self) -> None:
        self.late_ticks = 0  # run more than one step after their deadline
        self.dropped_ticks = 0
        self.lag_sum_s = 0.0
        self.lag_max_s = 0.0
        self.lag_ticks = 0

    def submit(self, jobs: Sequence[Job]) -> bool:
        if not self.scheduler.submit(jobs):
            return False
        if not self._scheduled:
            self._wake()
        return True

    def settle(self) -> None:
        """While asleep, account for the idle ticks up to now (before stats are read or
        reset, so that a reset does not inherit the idle time before it)."""
        if self._scheduled:
            return
        current = math.floor((self._loop.time() - self._t0) / self.step_s)
        if current > self._grid:
            self.scheduler.skip_idle(current - self._grid)
            self._grid = current

    def _deadline(self, grid: int) -> float:
        return self._t0 + grid * self.step_s

    def _wake(self) -> None:
        now = self._loop.time()
        due = max(self._grid + 1, math.ceil((now - self._t0) / self.step_s))
        self.scheduler.skip_idle(due - self._grid - 1)
        self._grid = due - 1
        self._scheduled = True
        self._loop.call_at(self._deadline(due), self._on_tick)

    def _on_tick(self) -> None:
        now = self._loop.time()
        behind = now - self._deadline(self._grid + 1)
        if behind > _MAX_BEHIND_S:
            dropped = int(behind / self.step_s)
            self._grid += dropped
            self.dropped_ticks += dropped
        for ran in range(_MAX_CATCH_UP):
            deadline = self._deadline(self._grid + 1)
            if ran and (deadline > now or self.scheduler.idle()):
                break
            lag = max(0.0, now - deadline)
            self.lag_sum_s += lag
            self.lag_ticks += 1
            self.lag_max_s = max(self.lag_max_s, lag)
            if lag > self.step_s:
                self.late_ticks += 1
            self._grid += 1
            for job in self.scheduler.tick():
                if job.on_done is not None:
                    try:
                        job.on_done(job)
                    except Exception:  # one answer's failure must not stop the clock
                        log.exception("answering a finished request failed")
        if self.scheduler.idle():
            self._scheduled = False
            return
        self._loop.call_at(self._deadline(self._grid + 1), self._on_tick)


# --- the OpenAI-compatible API -----------------------------------------------------------------


@dataclass(frozen=True)
class ServerConfig:
    slots: int
    step_ms: float
    max_waiting: int
    tokens: int = DEFAULT_TOKENS
    model: str = DEFAULT_MODEL
    dim: int = DEFAULT_DIM


class ApiError(Exception):
    """An error answered with an OpenAI-style body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.kind,
                    "param": None,
                    "code": self.code,
                }
            }
        )


Respond = Callable[[int, bytes, bytes, bytes], None]
"""``respond(status, body, content_type, extra_headers)``: answer the connection's request."""

_JSON: Final = b"application/json"
_PROMETHEUS: Final = b"text/plain; version=0.0.4; charset=utf-8"
_RETRY_AFTER: Final = b"Retry-After: 1\r\n"


def prompt_tokens(text: str) -> int:
    return len(text) // 4 + 1


def _text_of(content: Any) -> str:
    """A chat message's content: a string, or a list of parts with ``text``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _prompts(value: Any, field: str) -> list[str]:
    """A ``prompt`` or ``input``: a string, a list of strings, a list of token ids (one prompt)
    or a list of such lists; each prompt as text (token ids as one character each)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return list(value)
        if all(isinstance(v, int) for v in value):
            return ["t" * len(value)]
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return ["t" * len(v) for v in value]
    raise ApiError(400, f"'{field}' must be a string or a non-empty list of strings")


def embedding(text: str, dim: int) -> list[float]:
    """A deterministic unit vector for ``text``."""
    rng = np.random.default_rng(zlib.crc32(text.encode()))
    vector = rng.standard_normal(dim)
    vector /= float(np.linalg.norm(vector)) or 1.0
    return cast(list[float], vector.tolist())


class App:
    """Routes a parsed request to its handler; generation goes through the tick driver."""

    def __init__(self, config: ServerConfig, driver: TickDriver) -> None:
        self.config = config
        self.driver = driver
        self.scheduler = driver.scheduler
        self._ids = itertools.count(1)
        self._created = int(time.time())
        self.prompt_tokens_total = 0
        self.http_served = 0
        self._stats_since = time.monotonic()
        self._cpu_since = time.process_time()
        self._routes: dict[tuple[str, str], Callable[[bytes, Respond], None]] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._completions,
            ("POST", "/v1/embeddings"): self._embeddings,
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/stats"): self._stats,
            ("POST", "/stats/reset"): self._reset,
        }
        self._paths = {path for _, path in self._routes}

    def handle(self, method: str, target: str, body: bytes, respond: Respond) -> None:
        path = target.split("?", 1)[0]
        if len(path) > 1:
            path = path.rstrip("/")
        route = self._routes.get((method, path))
        if route is None:
            if path in self._paths:
                error = ApiError(405, f"{method} is not allowed on {path}")
            else:
                error = ApiError(404, f"no route {method} {path}", "not_found_error")
            respond(error.status, error.body(), _JSON, b"")
            return
        try:
            route(body, respond)
        except ApiError as exc:
            headers = _RETRY_AFTER if exc.status == 429 else b""
            respond(exc.status, exc.body(), _JSON, headers)
        except Exception as exc:  # a bug answers 500; it must not kill the server
            log.exception("%s %s failed", method, path)
            error = ApiError(500, f"{type(exc).__name__}: {exc}", "internal_server_error")
            respond(500, error.body(), _JSON, b"")

    # -- generation

    def _request(self, body: bytes) -> dict[str, Any]:
        try:
            request = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ApiError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(request, dict):
            raise ApiError(400, "the body must be a JSON object")
        model = request.get("model")
        if model is not None and model != self.config.model:
            raise ApiError(
                404, f"The model `{model}` does not exist.", "NotFoundError", "model_not_found"
            )
        if request.get("stream"):
            raise ApiError(400, "stream is not supported by this server")
        if request.get("n", 1) != 1:
            raise ApiError(400, "n must be 1 on this server")
        return request

    def _completion_tokens(self, request: Mapping[str, Any]) -> int:
        limit = request.get("max_tokens")
        if limit is None:
            limit = request.get("max_completion_tokens")
        if limit is None:
            return self.config.tokens
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ApiError(400, f"max_tokens must be a positive integer, not {limit!r}")
        return min(limit, self.config.tokens)

    def _run(self, jobs: int, tokens: int, finish: Callable[[], None]) -> None:
        """Submit ``jobs`` jobs of ``tokens`` ticks; ``finish()`` once all are done."""
        left = [jobs]

        def done(_: Job) -> None:
            left[0] -= 1
            if left[0] == 0:
                finish()

        if not self.driver.submit([Job(tokens, done) for _ in range(jobs)]):
            raise ApiError(
                429,
                f"the server is full: {self.scheduler.slots} slots and "
                f"{self.scheduler.max_waiting} waiting; retry later",
                "rate_limit_error",
                "rate_limit_exceeded",
            )

    @staticmethod
    def _usage(prompt: int, completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _chat(self, body: bytes, respond: Respond) -> None:
        request = self._request(body)
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list")
        text = "".join(_text_of(m.get("content")) for m in messages if isinstance(m, dict))
        prompt = prompt_tokens(text)
        tokens = self._completion_tokens(request)
        ident = f"chatcmpl-{next(self._ids):x}"

        def finish() -> None:
            self.prompt_tokens_total += prompt
            self.http_served += 1
            answer = {
                "id": ident,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.config.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "x" * tokens},
                        "logprobs": None,
                        "finish_reason": "length",
                    }
                ],
                "usage": self._usage(prompt, tokens),
            }
            respond(200, orjson.dumps(answer), _JSON, b"")

        self._run(1, tokens, finish)

    def _completions(self, body: bytes, respond: Respond) -> None:
        request = self._request(body)
        prompts = [prompt_tokens(p) for p in _prompts(request.get("prompt"), "prompt")]
        tokens = self._completion_tokens(request)
        ident = f"cmpl-{next(self._ids):x}"

        def finish() -> None:
            prompt = sum(prompts)
            self.prompt_tokens_total += prompt
            self.http_served += 1
            text = "x" * tokens
            answer = {
                "id": ident,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.config.model,
                "choices": [
                    {"index": i, "text": text, "logprobs": None, "finish_reason": "length"}
                    for i in range(len(prompts))
                ],
                "usage": self._usage(prompt, tokens * len(prompts)),
            }
            respond(200, orjson.dumps(answer), _JSON, b"")

        self._run(len(prompts), tokens, finish)

    def _embeddings(self, body: bytes, respond: Respond) -> None:
        request = self._request(body)
        inputs = _prompts(request.get("input"), "input")
        dim = self.config.dim

        def finish() -> None:
            prompt = sum(prompt_tokens(p) for p in inputs)
            self.prompt_tokens_total += prompt
            self.http_served += 1
            answer = {
                "id": f"embd-{next(self._ids):x}",
                "object": "list",
                "created": int(time.time()),
                "model": self.config.model,
                "data": [
                    {"object": "embedding", "index": i, "embedding": embedding(text, dim)}
                    for i, text in enumerate(inputs)
                ],
                "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
            }
            respond(200, orjson.dumps(answer), _JSON, b"")

        self._run(len(inputs), 1, finish)

    # -- the rest

    def _models(self, _: bytes, respond: Respond) -> None:
        model = {
            "id": self.config.model,
            "object": "model",
            "created": self._created,
            "owned_by": "rowbatch",
            "root": self.config.model,
            "parent": None,
            "max_model_len": 1 << 20,
        }
        respond(200, orjson.dumps({"object": "list", "data": [model]}), _JSON, b"")

    def _health(self, _: bytes, respond: Respond) -> None:
        respond(200, b"", _JSON, b"")

    def metrics_text(self) -> str:
        scheduler = self.scheduler
        label = f'model_name="{self.config.model}"'
        families: list[tuple[str, str, str, Iterable[tuple[str, float]]]] = [
            (
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                [(label, scheduler.running)],
            ),
            (
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                [(label, scheduler.waiting)],
            ),
            (
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                [(f'finished_reason="length",{label}', scheduler.served_total)],
            ),
            (
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                [(label, self.prompt_tokens_total)],
            ),
            (
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                [(label, scheduler.tokens_total)],
            ),
            (
                "rowbatch_fixed_step_rejected_total",
                "counter",
                "Requests answered 429 because the waiting queue was full.",
                [(label, scheduler.rejected_total)],
            ),
        ]
        lines = []
        for name, kind, help_text, samples in families:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{{{labels}}} {float(value)}" for labels, value in samples)
        return "\n".join(lines) + "\n"

    def _metrics(self, _: bytes, respond: Respond) -> None:
        respond(200, self.metrics_text().encode(), _PROMETHEUS, b"")

    def stats(self) -> dict[str, Any]:
        self.driver.settle()
        s = self.scheduler.stats()
        driver = self.driver
        queue: dict[str, int] = {f"p{p}": s.waiting_percentile(p) for p in QUEUE_PERCENTILES}
        queue["max"] = s.waiting_max
        queue["samples"] = sum(s.waiting_histogram.values())
        elapsed = time.monotonic() - self._stats_since
        cpu = time.process_time() - self._cpu_since
        return {
            "model": self.config.model,
            "slots": s.slots,
            "step_ms": self.config.step_ms,
            "max_waiting": s.max_waiting,
            "tokens": self.config.tokens,
            "ticks": s.ticks,
            "window_ticks": s.window_ticks,
            "occupied_slot_ticks": s.occupied_slot_ticks,
            "occupancy": s.occupancy,
            "waiting_queue": queue,
            "requests_served": s.served,
            "http_served": self.http_served,
            "rejected": s.rejected,
            "running": s.running,
            "waiting": s.waiting,
            "tick_lag_ms": {
                "mean": 1e3 * driver.lag_sum_s / driver.lag_ticks if driver.lag_ticks else 0.0,
                "max": 1e3 * driver.lag_max_s,
            },
            "late_ticks": driver.late_ticks,
            "dropped_ticks": driver.dropped_ticks,
            "elapsed_s": elapsed,
            "cpu_s": cpu,
        }

    def _stats(self, _: bytes, respond: Respond) -> None:
        respond(200, orjson.dumps(self.stats()), _JSON, b"")

    def reset_stats(self) -> None:
        self.driver.settle()
        self.scheduler.reset_stats()
        self.driver.reset_stats()
        self.http_served = 0
        self._stats_since = time.monotonic()
        self._cpu_since = time.process_time()

    def _reset(self, _: bytes, respond: Respond) -> None:
        self.reset_stats()
        respond(200, b'{"reset":true}', _JSON, b"")


# --- a minimal HTTP/1.1 server -----------------------------------------------------------------

_REASONS: Final = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    411: b"Length Required",
    413: b"Content Too Large",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class HttpRequest:
    method: str
    target: str
    body: bytes
    keep_alive: bool
    expect_continue: bool


def parse_request(buffer: bytearray) -> tuple[HttpRequest, int] | None:
    """The first request in ``buffer`` and the bytes it takes, or None while it is incomplete
    (the request without its body when it expects ``100 Continue``: its size is then 0)."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > _MAX_HEAD_BYTES:
            raise HttpError(431, "request head too large")
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise HttpError(400, f"bad request line {lines[0][:200]!r}")
    method, target, version = parts
    length, keep_alive, expect = _headers(lines[1:], keep_alive=version == "HTTP/1.1")
    start = end + 4
    if len(buffer) < start + length:
        if expect and len(buffer) == start:
            return HttpRequest(method, target, b"", keep_alive, expect_continue=True), 0
        return None
    body = bytes(buffer[start : start + length])
    return HttpRequest(method, target, body, keep_alive, expect_continue=False), start + length


def _headers(lines: Iterable[str], *, keep_alive: bool) -> tuple[int, bool, bool]:
    """The body's length, whether the connection stays open, and whether the client expects
    ``100 Continue``, from the header lines."""
    length = 0
    expect = False
    for line in lines:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        if name == "content-length":
            length = _content_length(value)
        elif name == "connection":
            tokens = value.lower()
            if "close" in tokens:
                keep_alive = False
            elif "keep-alive" in tokens:
                keep_alive = True
        elif name == "transfer-encoding":
            raise HttpError(411, "chunked request bodies are not supported: send Content-Length")
        elif name == "expect" and value.strip().lower() == "100-continue":
            expect = True
    return length, keep_alive, expect


def _content_length(value: str) -> int:
    try:
        length = int(value)
    except ValueError:
        raise HttpError(400, f"bad Content-Length {value.strip()!r}") from None
    if length < 0:
        raise HttpError(400, "negative Content-Length")
    if length > _MAX_BODY_BYTES:
        raise HttpError(413, f"body over {_MAX_BODY_BYTES} bytes")
    return length


def _response(status: int, body: bytes, content_type: bytes, extra: bytes, close: bool) -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s%s\r\n" % (
        status,
        _REASONS.get(status, b"Unknown"),
        content_type,
        len(body),
        extra,
        b"Connection: close\r\n" if close else b"",
    )
    return head + body


class HttpConnection(asyncio.Protocol):
    """One client connection: requests are parsed from the buffer and answered in order, one at
    a time (the next is read once the current one's response is written)."""

    def __init__(self, app: App) -> None:
        self._app = app
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._busy = False  # a request is being answered
        self._draining = False
        self._closed = False
        self._keep_alive = True
        self._continued = False
        self._eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._transport = None

    def eof_received(self) -> bool:
        """A client that shut its side after its requests still gets their answers; then the
        connection closes."""
        self._eof = True
        return self._busy

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._busy:
            self._drain()

    def _drain(self) -> None:
        self._draining = True
        try:
            while not self._busy and not self._closed and self._buffer:
                try:
                    parsed = parse_request(self._buffer)
                except HttpError as exc:
                    self._keep_alive = False
                    self._busy = True
                    error = ApiError(exc.status, str(exc))
                    self._respond(exc.status, error.body(), _JSON, b"")
                    return
                if parsed is None:
                    return
                request, size = parsed
                if request.expect_continue:
                    if not self._continued and self._transport is not None:
                        self._continued = True
                        self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    return
                self._continued = False
                del self._buffer[:size]
                self._keep_alive = request.keep_alive
                self._busy = True
                self._app.handle(request.method, request.target, request.body, self._respond)
        finally:
            self._draining = False
            self._close_at_eof()

    def _close_at_eof(self) -> None:
        if self._eof and not self._busy and not self._closed and self._transport is not None:
            self._closed = True
            self._transport.close()

    def _respond(self, status: int, body: bytes, content_type: bytes, extra: bytes) -> None:
        transport = self._transport
        if self._closed or transport is None:
            return
        transport.write(_response(status, body, content_type, extra, not self._keep_alive))
        if not self._keep_alive:
            self._closed = True
            transport.close()
            return
        self._busy = False
        if not self._draining:
            self._drain()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m harness.fixed_step_llm",
        description=(
            "A fixed-step imitation of a continuous-batching LLM server (vLLM's OpenAI-compatible "
            "API) for benchmarks of a client's concurrency window: N slots, one token per slot "
            "per step of a fixed wall time, a bounded waiting queue answered with 429 when full."
        ),
    )
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on (%(default)s)")
    parser.add_argument("--port", type=int, required=True, help="TCP port to listen on")
    parser.add_argument("--slots", type=int, required=True, help="requests generated at once")
    parser.add_argument(
        "--step-ms", type=float, required=True, help="wall time of one step (one token per slot)"
    )
    parser.add_argument(
        "--max-waiting",
        type=int,
        required=True,
        help="requests that may wait beyond the slots; more are answered 429",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=DEFAULT_TOKENS,
        help="tokens per completion, and the most a request's max_tokens gets (%(default)s)",
    )
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help="the model name served (%(default)s)"
    )
    parser.add_argument(
        "--dim", type=int, default=DEFAULT_DIM, help="embedding dimension (%(default)s)"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    config = ServerConfig(
        slots=args.slots,
        step_ms=args.step_ms,
        max_waiting=args.max_waiting,
        tokens=args.tokens,
        model=args.model,
        dim=args.dim,
    )
    if config.slots < 1 or config.max_waiting < 0 or config.tokens < 1 or config.dim < 1:
        raise SystemExit("--slots, --tokens and --dim must be >= 1, --max-waiting >= 0")
    if not config.step_ms > 0:
        raise SystemExit("--step-ms must be positive")
    return config


async def serve(config: ServerConfig, host: str, port: int) -> None:
    """Serve until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    driver = TickDriver(Scheduler(config.slots, config.max_waiting), config.step_ms / 1e3, loop)
    app = App(config, driver)
    server = await loop.create_server(
        lambda: HttpConnection(app), host, port, reuse_address=True, backlog=4096
    )
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(
        f"fixed_step_llm listening on http://{host}:{port}: model {config.model}, "
        f"{config.slots} slots, step {config.step_ms} ms, max waiting {config.max_waiting}, "
        f"{config.tokens} tokens",
        flush=True,
    )
    async with server:
        await stop.wait()
    print("fixed_step_llm stopped", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config = config_from_args(args)
    asyncio.run(serve(config, args.host, args.port))
    return 0


# --- the launcher ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FixedStepLlmEndpoint:
    """Where a running fixed-step server listens, and how it is set up."""

    url: str  # "http://127.0.0.1:PORT"
    model: str
    slots: int
    step_ms: float
    max_waiting: int = 0
    tokens: int = DEFAULT_TOKENS

    @property
    def base_url(self) -> str:
        """``<url>/v1``: what the OpenAI SDK's ``base_url`` wants."""
        return f"{self.url}/v1"


def _lists_model(url: str, model: str) -> bool:
    """Ready when a real ``GET /v1/models`` lists ``model``."""
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as response:  # noqa: S310 - our own http://127.0.0.1 URL
            listed = orjson.loads(response.read())
    except (urllib.error.URLError, OSError, orjson.JSONDecodeError):
        return False
    return isinstance(listed, dict) and any(
        isinstance(m, dict) and m.get("id") == model for m in listed.get("data", [])
    )


class FixedStepLlmService(ManagedService[FixedStepLlmEndpoint]):
    """``with FixedStepLlmService(run, slots=8, step_ms=20, max_waiting=16) as endpoint:`` runs
    the fixed-step server (this module, with this interpreter) on 127.0.0.1 until the block
    ends, in a process group of its own, stopped by its pid."""

    name = "fixed_step_llm"

    def __init__(
        self,
        run: RunDir,
        *,
        slots: int,
        step_ms: float,
        max_waiting: int,
        tokens: int = DEFAULT_TOKENS,
        model: str = DEFAULT_MODEL,
        dim: int = DEFAULT_DIM,
        name: str | None = None,
    ) -> None:
        if name is not None:
            self.name = name
        self.run = run
        self.config = ServerConfig(slots, step_ms, max_waiting, tokens, model, dim)
        self.port: int | None = None
        self._process: ServiceProcess | None = None

    def start(self) -> FixedStepLlmEndpoint:
        config = self.config
        self.port = free_port()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        argv = [
            sys.executable,
            "-m",
            "harness.fixed_step_llm",
            "--port",
            str(self.port),
            "--slots",
            str(config.slots),
            "--step-ms",
            str(config.step_ms),
            "--max-waiting",
            str(config.max_waiting),
            "--tokens",
            str(config.tokens),
            "--model",
            config.model,
            "--dim",
            str(config.dim),
        ]
        self._process = ServiceProcess(
            self.name, argv, self.run.log(self.name), env=env, cwd=self.run.data(self.name)
        )
        url = f"http://{LOOPBACK}:{self.port}"
        started = time.monotonic()
        self._process.start()
        self._process.wait_ready(lambda: _lists_model(url, config.model), READY_TIMEOUT_S, 0.05)
        log.info("fixed_step_llm ready in %.2f s on %s", time.monotonic() - started, url)
        return FixedStepLlmEndpoint(
            url=url,
            model=config.model,
            slots=config.slots,
            step_ms=config.step_ms,
            max_waiting=config.max_waiting,
            tokens=config.tokens,
        )

    @property
    def pid(self) -> int | None:
        """The server's pid (its process group's id too), while it runs."""
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        """SIGTERM the server's process group (by its pid), SIGKILL after a grace period."""
        process, self._process = self._process, None
        if process is not None:
            process.stop(grace_s=5.0)

    def kill(self) -> None:
        """SIGKILL the server's process group, as a crash would."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()


__all__ = [
    "ApiError",
    "App",
    "FixedStepLlmEndpoint",
    "FixedStepLlmService",
    "HttpConnection",
    "HttpError",
    "HttpRequest",
    "Job",
    "LoopClock",
    "Scheduler",
    "SchedulerStats",
    "ServerConfig",
    "TickDriver",
    "build_parser",
    "embedding",
    "histogram_percentile",
    "main",
    "parse_request",
    "prompt_tokens",
    "serve",
]


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
