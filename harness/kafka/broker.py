"""The broker process: one real ``kafka.Kafka`` on the JVM, KRaft mode, both controller and
broker with a static voter set of itself, on two free loopback ports (clients, controller).

It keeps its data and ``server.properties`` under ``<run dir>/kafka/`` and its log in
``<run dir>/logs/kafka.log`` (logging configured by ``harness/kafka-log4j2.properties``).
Readiness is a real metadata call through aiokafka's admin client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from harness.errors import ServiceFailed
from harness.kafka.admin import broker_answers
from harness.kafka.config import random_cluster_id, server_properties, write_properties
from harness.kafka.endpoint import KafkaEndpoint
from harness.kafka.jars import KAFKA_VERSION, OUTPUT_TAIL_CHARS, broker_runtime
from harness.proc import LOOPBACK, ServiceProcess, free_port, port_open
from harness.service import ManagedService, RunDir

LOG4J_CONFIG = Path(__file__).parent.parent / "kafka-log4j2.properties"

_READY_TIMEOUT_S = 60.0
_STOP_GRACE_S = 15.0
_FORMAT_TIMEOUT_S = 120.0

# The broker: 512 MB heap; the serial collector suits a small heap on a 2-core machine (no GC
# threads competing with the tests). C1-only (-XX:TieredStopAtLevel=1) would start it ~0.4 s
# sooner (measured: ready in 1.6 s instead of 2.0-2.3 s) but slows it for good; C2 stays on.
_BROKER_JVM_OPTS = ("-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
# The storage formatter runs for half a second: C1 only saves ~0.1 s of it (0.53 vs 0.65 s).
_TOOL_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")

T = TypeVar("T")


class KafkaService(ManagedService[KafkaEndpoint]):
    """A single-node KRaft broker; ``start`` returns once a metadata call lists the broker.

    ``stop`` then ``start`` (or :meth:`restart`) brings the same broker back on the same ports
    with its data. ``overrides`` replaces or adds ``server.properties`` entries;
    ``format_args`` go to ``kafka-storage format`` (e.g. ``--add-scram
    'SCRAM-SHA-256=[name=u,password=p]'``). ``name`` selects the data dir and log
    (``run.data(name)``, ``run.log(name)``), so a test can run a second broker in the same run
    dir.
    """

    name = "kafka"

    def __init__(
        self,
        run: RunDir,
        version: str = KAFKA_VERSION,
        *,
        overrides: Mapping[str, str] | None = None,
        name: str = "kafka",
        format_args: Sequence[str] = (),
    ) -> None:
        self._run = run
        self._version = version
        self._overrides = dict(overrides or {})
        self._format_args = tuple(format_args)
        self.name = name
        self._ports: tuple[int, int] | None = None
        self._proc: ServiceProcess | None = None
        self._endpoint: KafkaEndpoint | None = None

    @property
    def endpoint(self) -> KafkaEndpoint | None:
        """The running broker's endpoint, or None when it is not running."""
        return self._endpoint

    def start(self) -> KafkaEndpoint:
        if self._proc is not None and self._proc.running():
            raise RuntimeError(f"{self.name}: already running (pid {self._proc.pid})")
        java, libs = broker_runtime(self._version)
        if self._ports is None:
            port = free_port()
            controller_port = free_port()
            while controller_port == port:
                controller_port = free_port()
            self._ports = (port, controller_port)
        port, controller_port = self._ports

        data = self._run.data(self.name)
        log_dir = data / "kraft-combined-logs"
        props_path = data / "server.properties"
        write_properties(
            props_path, server_properties(port, controller_port, log_dir, self._overrides)
        )
        log_path = self._run.log(self.name)
        classpath = f"{libs}/*"
        logging_opt = f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"
        if not (log_dir / "meta.properties").exists():
            self._format(java, classpath, logging_opt, props_path, log_path)

        proc = ServiceProcess(
            name=self.name,
            argv=[
                java,
                *_BROKER_JVM_OPTS,
                logging_opt,
                "-cp",
                classpath,
                "kafka.Kafka",
                str(props_path),
            ],
            log_path=log_path,
            cwd=data,
            env=dict(os.environ),
        )
        self._proc = proc
        bootstrap = f"{LOOPBACK}:{port}"
        log_offset = log_path.stat().st_size if log_path.exists() else 0
        proc.start()
        try:
            proc.wait_ready(lambda: _ready(bootstrap, port), timeout_s=_READY_TIMEOUT_S)
        except ServiceFailed as exc:
            self.stop()
            first = _first_error(log_path, log_offset)
            if first is None:
                raise
            raise ServiceFailed(f"{exc}\n--- first error since this start ---\n{first}") from None
        except BaseException:
            self.stop()
            raise
        assert proc.pid is not None
        self._endpoint = KafkaEndpoint(bootstrap_servers=bootstrap, log_dir=log_dir, pid=proc.pid)
        return self._endpoint

    def _format(
        self, java: str, classpath: str, logging_opt: str, props: Path, log_path: Path
    ) -> None:
        """``kafka-storage format`` with a fresh cluster id; static voters need no
        ``--standalone``. ``-g`` skips a dir that is already formatted."""
        argv = [
            java,
            *_TOOL_JVM_OPTS,
            logging_opt,
            "-cp",
            classpath,
            "kafka.tools.StorageTool",
            "format",
            "-t",
            random_cluster_id(),
            "-c",
            str(props),
            "-g",
            *self._format_args,
        ]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise ServiceFailed(
                f"{self.name}: storage format did not finish in {_FORMAT_TIMEOUT_S:.0f} s"
            ) from exc
        output = (done.stdout + done.stderr).strip()
        with log_path.open("a", encoding="utf-8") as log:
            log.write(f"--- kafka-storage format (exit {done.returncode}) ---\n{output}\n")
        if done.returncode != 0:
            raise ServiceFailed(
                f"{self.name}: kafka-storage format failed (exit {done.returncode}):\n"
                f"{output[-OUTPUT_TAIL_CHARS:]}"
            )

    def stop(self) -> None:
        """Stop the broker (SIGTERM: a controlled shutdown; SIGKILL after 15 s). Data and
        ports are kept for a later ``start``."""
        if self._proc is not None:
            self._proc.stop(grace_s=_STOP_GRACE_S)
            self._proc = None
        self._endpoint = None

    def kill(self) -> None:
        """Crash the broker (SIGKILL, no controlled shutdown); ``start`` recovers its logs."""
        proc = self._proc
        if proc is not None and proc.pid is not None and proc.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.stop()

    def restart(self, *, crash: bool = False) -> KafkaEndpoint:
        """Stop the broker (``crash``: SIGKILL instead of a controlled shutdown) and start it
        again on the same ports with the same data; returns once it answers again. Blocks for
        a few seconds: from async code use ``await asyncio.to_thread(service.restart)``."""
        if self._ports is None:
            raise RuntimeError(f"{self.name}: restart() before start()")
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()


def _first_error(log_path: Path, offset: int, lines_after: int = 3) -> str | None:
    """The first ERROR line the broker logged after ``offset`` (its exception follows on the
    next lines): the cause, which the log's tail (shutdown chatter) usually misses."""
    try:
        with log_path.open("rb") as log:
            log.seek(offset)
            lines = log.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for i, line in enumerate(lines):
        if "] ERROR " in line:
            return "\n".join(lines[i : i + 1 + lines_after])
    return None


def _run_in_fresh_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a new event loop in a worker thread, so the blocking
    launcher also works when called from async code (a test that restarts the broker)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-harness") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def _ready(bootstrap_servers: str, port: int) -> bool:
    """A real metadata call answers and lists the broker. The port probe first keeps aiokafka
    from logging a connection error for every early poll."""
    if not port_open(port):
        return False
    return _run_in_fresh_loop(lambda: broker_answers(bootstrap_servers))
