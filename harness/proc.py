"""One native service process: start, wait for readiness, keep its log, stop it by pid."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from harness.errors import ServiceFailed

LOOPBACK = "127.0.0.1"
_LOG_TAIL_CHARS = 4000


_HANDED_OUT: set[int] = set()
"""Every port :func:`free_port` has given in this process: the kernel may give the same
ephemeral port to two binds in a row once the first socket is closed (a stack start once gave
Triton one port for both HTTP and gRPC), so a port is never handed out twice."""


def free_port(bind: Callable[[], int] | None = None) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now and that this process has
    not handed out before. ``bind``: what asks the kernel for a port (tests)."""
    ask = bind or _ephemeral_port
    for _ in range(1000):
        port = ask()
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise ServiceFailed("no free TCP port on 127.0.0.1 that was not handed out already")


def _ephemeral_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
        return True
    return False


def log_tail(path: Path, chars: int = _LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return text[-chars:]


@dataclass
class ServiceProcess:
    """A child process in its own session (so its whole group can be stopped by our pid)."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: Mapping[str, str] | None = None
    cwd: Path | None = None
    user: str | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        argv = list(self.argv)
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        self._proc = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(self.env) if self.env is not None else None,
            cwd=self.cwd,
            start_new_session=True,
        )

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def fail(self, why: str) -> ServiceFailed:
        """A ServiceFailed naming the service, the reason, and the tail of its log."""
        return ServiceFailed(
            f"{self.name}: {why}\n--- last lines of {self.log_path} ---\n{log_tail(self.log_path)}"
        )

    def wait_ready(
        self,
        check: Callable[[], bool],
        timeout_s: float,
        interval_s: float = 0.2,
    ) -> None:
        """Poll ``check`` until it returns True; raise (quoting the log) if the process dies or
        the deadline passes. ``check`` makes a real client call and returns False on failure."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.running():
                code = self._proc.returncode if self._proc else None
                raise self.fail(f"exited with code {code} before it was ready")
            if check():
                return
            if time.monotonic() > deadline:
                raise self.fail(f"not ready after {timeout_s:.0f} s")
            time.sleep(interval_s)

    def kill(self) -> None:
        """SIGKILL the whole process group (the server and any workers or stubs it started), as
        a crash would, then reap it and close the log."""
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGKILL)
        self.stop()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group we started (by our child's pid), SIGKILL after grace."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop_group(self, grace_s: float = 10.0) -> None:
        """:meth:`stop`, then SIGKILL whatever of the process group outlived our child (a worker
        or helper process it started and left behind)."""
        pgid = self.pid
        self.stop(grace_s)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)


class ProcessGroupService:
    """The ``pid``, ``stop`` and ``kill`` of a service that runs as one :class:`ServiceProcess`
    (kept in ``_process`` while it runs) whose process group outlives it: a server whose
    workers, or helpers such as multiprocessing's resource tracker, may be left behind."""

    _process: ServiceProcess | None = None

    @property
    def pid(self) -> int | None:
        """The server process's pid (its process group's id too), while it runs."""
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL after a grace period, then SIGKILL
        whatever of the group outlived the server (:meth:`ServiceProcess.stop_group`)."""
        process, self._process = self._process, None
        if process is not None:
            process.stop_group()

    def kill(self) -> None:
        """SIGKILL the server's process group (the server and its workers), as a crash would."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
