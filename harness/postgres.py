"""PostgreSQL from Debian's packages: a throwaway cluster on a free loopback port.

``initdb`` refuses to run as root, so as root the cluster is created and run as the
``postgres`` system user (made by the Debian package). Authentication is ``trust`` on
127.0.0.1 only: this is a test and demo database, never a production one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import psycopg

from harness.errors import PrerequisiteMissing
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.service import ManagedService, RunDir

_READY_TIMEOUT_S = 60.0
_SYSTEM_USER = "postgres"


@dataclass(frozen=True)
class PostgresEndpoint:
    host: str
    port: int
    user: str
    dbname: str

    @property
    def dsn(self) -> str:
        """A libpq URI, e.g. ``postgresql://rowbatch@127.0.0.1:5433/rowbatch``."""
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"


def find_bindir() -> Path:
    """The newest installed server's bin directory (``/usr/lib/postgresql/<major>/bin``)."""
    candidates = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    if candidates:
        return candidates[-1].parent
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(on_path).resolve().parent
    raise PrerequisiteMissing(
        "the PostgreSQL server (initdb/postgres)",
        "apt-get update && apt-get install -y postgresql",
    )


class PostgresService(ManagedService[PostgresEndpoint]):
    name = "postgres"

    def __init__(self, run: RunDir, user: str = "rowbatch", dbname: str = "rowbatch") -> None:
        self._run = run
        self._user = user
        self._dbname = dbname
        self._proc: ServiceProcess | None = None
        self._owned_tmp: Path | None = None

    def _system_user(self) -> str | None:
        """Who runs the server: ourselves, or ``postgres`` when we are root."""
        if os.geteuid() != 0:
            return None
        try:
            import pwd  # noqa: PLC0415 - POSIX-only

            pwd.getpwnam(_SYSTEM_USER)
        except KeyError as exc:
            raise PrerequisiteMissing(
                "the 'postgres' system user (needed to run PostgreSQL as root)",
                "apt-get install -y postgresql (creates it)",
            ) from exc
        return _SYSTEM_USER

    def start(self) -> PostgresEndpoint:
        bindir = find_bindir()
        runner = self._system_user()
        data = self._data_dir(runner)
        pgdata = data / "pgdata"
        sockets = data / "sockets"
        sockets.mkdir(exist_ok=True)
        if runner is not None:
            shutil.chown(sockets, runner)
        if not (pgdata / "PG_VERSION").exists():
            self._initdb(bindir, pgdata, runner)
        port = free_port()
        self._proc = ServiceProcess(
            name="postgres",
            argv=[
                str(bindir / "postgres"),
                "-D", str(pgdata),
                "-h", LOOPBACK,
                "-p", str(port),
                "-k", str(sockets),
                "-c", "fsync=off",  # a throwaway test cluster: durability is not the point
                "-c", "synchronous_commit=off",
                "-c", "full_page_writes=off",
                "-c", "max_connections=200",
            ],
            log_path=self._run.log("postgres"),
            user=runner,
        )  # fmt: skip
        self._proc.start()
        admin = PostgresEndpoint(LOOPBACK, port, self._user, "postgres")
        self._proc.wait_ready(lambda: _answers(admin), timeout_s=_READY_TIMEOUT_S)
        with psycopg.connect(admin.dsn, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self._dbname,)
            ).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{self._dbname}"')
        return PostgresEndpoint(LOOPBACK, port, self._user, self._dbname)

    def _data_dir(self, runner: str | None) -> Path:
        """The cluster's directory. Run as another user, it lives in a fresh /tmp directory
        that user owns, since the checkout may sit under a home the user cannot enter."""
        if runner is None:
            return self._run.data("postgres")
        if self._owned_tmp is None:
            self._owned_tmp = Path(tempfile.mkdtemp(prefix="rowbatch-pg-"))
            shutil.chown(self._owned_tmp, runner)
        return self._owned_tmp

    def _initdb(self, bindir: Path, pgdata: Path, runner: str | None) -> None:
        argv = [
            str(bindir / "initdb"),
            "-D", str(pgdata),
            "-U", self._user,
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        ]  # fmt: skip
        if runner is not None:
            argv = ["runuser", "-u", runner, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PrerequisiteMissing(
                f"a working initdb ({' '.join(argv)} failed: {done.stderr.strip()[-800:]})",
                "check the PostgreSQL installation (apt-get install -y postgresql)",
            )

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None
        if self._owned_tmp is not None:
            shutil.rmtree(self._owned_tmp, ignore_errors=True)
            self._owned_tmp = None


def _answers(endpoint: PostgresEndpoint) -> bool:
    try:
        with psycopg.connect(endpoint.dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True
