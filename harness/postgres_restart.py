"""A PostgreSQL cluster that can be stopped and started again on the same port and data
directory, as a database restart or failover looks to a client (for the sink fault tests).

Use a :class:`~harness.service.RunDir` of the test's own, so the session's shared cluster is
never touched.
"""

from __future__ import annotations

import os
import signal

from harness.postgres import PostgresEndpoint, PostgresService, _answers
from harness.proc import ServiceProcess
from harness.service import RunDir

_READY_TIMEOUT_S = 60.0


class RestartablePostgresService(PostgresService):
    """``start`` once (a free port), then ``stop_server`` / ``start_server`` any number of
    times: the same port, data directory and log; ``stop`` ends it for good."""

    name = "postgres-restartable"

    def __init__(self, run: RunDir, user: str = "rowbatch", dbname: str = "rowbatch") -> None:
        super().__init__(run, user, dbname)
        self._endpoint: PostgresEndpoint | None = None
        self._template: ServiceProcess | None = None

    def start(self) -> PostgresEndpoint:
        self._endpoint = super().start()
        self._template = self._proc
        return self._endpoint

    def stop_server(self) -> None:
        """A fast shutdown (SIGINT: clients are disconnected at once), keeping the data."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.pid is not None and proc.running():
            os.killpg(proc.pid, signal.SIGINT)
        proc.stop(grace_s=30.0)

    def start_server(self) -> None:
        """The same server again, on the same port; returns once it answers queries."""
        template, endpoint = self._template, self._endpoint
        if template is None or endpoint is None:
            raise RuntimeError("start() the service first")
        if self._proc is not None:
            return
        proc = ServiceProcess(
            name=template.name,
            argv=list(template.argv),
            log_path=template.log_path,
            user=template.user,
        )
        proc.start()
        self._proc = proc
        proc.wait_ready(lambda: _answers(endpoint), timeout_s=_READY_TIMEOUT_S)
