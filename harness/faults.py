"""Service faults for the chaos campaign (``python -m bench chaos``): Triton and PostgreSQL that
can be stopped (with the signal a fault calls for) and started again on the same ports and data
directory, and the whole local stack built from them.

The launchers in ``harness/triton.py`` and ``harness/postgres.py`` pick free ports at start;
these subclasses keep the argv of the first start and reuse it, so clients that hold the old
address (the consumer's gRPC channel, its PostgreSQL DSN) reconnect to the same place.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import psycopg

from harness.kafka import KafkaService
from harness.oip_ready import ReadyCheck
from harness.postgres import PostgresEndpoint, PostgresService
from harness.proc import ServiceProcess
from harness.pubsub import PubSubService
from harness.service import ManagedService, RunDir
from harness.stack import StackEndpoints
from harness.triton import READY_TIMEOUT_S, TritonEndpoint, TritonService

_EXIT_TIMEOUT_S = 60.0
T = TypeVar("T")


def _signal_and_wait(proc: ServiceProcess, sig: signal.Signals, group: bool) -> float:
    """Send ``sig`` to the process (or its whole group) and wait for it to exit; whatever of
    its group is left afterwards (e.g. Triton's Python-backend stubs) is SIGKILLed. Returns
    the seconds until the main process exited."""
    popen = proc._proc  # the harness's own process handle
    if popen is None or popen.poll() is not None:
        return 0.0
    started = time.monotonic()
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(popen.pid, sig)
        else:
            os.kill(popen.pid, sig)
    try:
        popen.wait(_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(popen.pid, signal.SIGKILL)
        popen.wait(_EXIT_TIMEOUT_S)
    took = time.monotonic() - started
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, signal.SIGKILL)
    proc.stop()  # closes the log file
    return took


def _again(proc: ServiceProcess) -> ServiceProcess:
    """A new process with the same argv (ports, data dir), environment and log."""
    fresh = ServiceProcess(
        proc.name, proc.argv, proc.log_path, env=proc.env, cwd=proc.cwd, user=proc.user
    )
    fresh.start()
    return fresh


class RestartableTriton(TritonService):
    """``TritonService`` that can be stopped with a signal and started on the same ports."""

    def __init__(self, run: RunDir) -> None:
        super().__init__(run)
        self.endpoint: TritonEndpoint | None = None

    def start(self) -> TritonEndpoint:
        self.endpoint = super().start()
        return self.endpoint

    def interrupt(self, sig: signal.Signals) -> float:
        """SIGTERM: to the server only, as an orchestrator stops a container's main process
        (it unloads its models and exits); SIGKILL: to its whole process group."""
        assert self._process is not None
        return _signal_and_wait(self._process, sig, group=sig is signal.SIGKILL)

    def resume(self) -> float:
        """Start again on the same ports; the seconds until every model is ready."""
        assert self._process is not None and self.endpoint is not None
        started = time.monotonic()
        self._process = _again(self._process)
        models = sorted(p.parent.name for p in self.model_repository.glob("*/config.pbtxt"))
        self._process.wait_ready(ReadyCheck(self.endpoint.grpc_url, models), READY_TIMEOUT_S, 0.25)
        return time.monotonic() - started


class RestartablePostgres(PostgresService):
    """``PostgresService`` that can be stopped (fast shutdown) and started again on the same
    port and data directory."""

    def __init__(self, run: RunDir) -> None:
        super().__init__(run)
        self.endpoint: PostgresEndpoint | None = None

    def start(self) -> PostgresEndpoint:
        self.endpoint = super().start()
        return self.endpoint

    def interrupt(self, sig: signal.Signals = signal.SIGINT) -> float:
        """SIGINT is PostgreSQL's fast shutdown: clients are disconnected, then it exits."""
        assert self._proc is not None
        return _signal_and_wait(self._proc, sig, group=True)

    def resume(self) -> float:
        assert self._proc is not None and self.endpoint is not None
        started = time.monotonic()
        self._proc = _again(self._proc)
        dsn = self.endpoint.dsn

        def answers() -> bool:
            try:
                with psycopg.connect(dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
            except psycopg.OperationalError:
                return False
            return True

        self._proc.wait_ready(answers, 60.0, 0.2)
        return time.monotonic() - started


@dataclass(frozen=True)
class FaultStack:
    endpoints: StackEndpoints
    triton: RestartableTriton
    postgres: RestartablePostgres


@contextlib.contextmanager
def fault_stack(run: RunDir) -> Iterator[FaultStack]:
    """Kafka, Pub/Sub, a restartable Triton and a restartable PostgreSQL, started side by
    side; every one that started is stopped by pid when the block ends."""
    kafka, pubsub = KafkaService(run), PubSubService(run)
    triton, postgres = RestartableTriton(run), RestartablePostgres(run)
    services = (kafka, pubsub, triton, postgres)
    timings: dict[str, float] = {}

    def timed(svc: ManagedService[T]) -> Callable[[], T]:
        def run_it() -> T:
            started = time.monotonic()
            endpoint = svc.start()
            timings[svc.name] = time.monotonic() - started
            return endpoint

        return run_it

    try:
        with ThreadPoolExecutor(max_workers=len(services)) as pool:
            k = pool.submit(timed(kafka))
            p = pool.submit(timed(pubsub))
            t = pool.submit(timed(triton))
            g = pool.submit(timed(postgres))
            endpoints = StackEndpoints(
                kafka=k.result(),
                pubsub=p.result(),
                triton=t.result(),
                postgres=g.result(),
                startup_s=timings,
            )
        yield FaultStack(endpoints, triton, postgres)
    finally:
        for svc in services:
            svc.stop()
