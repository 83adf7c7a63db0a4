"""Apache Kafka for tests and the local stack: one real broker, KRaft mode, single node.

The broker is the real ``kafka.Kafka`` from Maven Central (``org.apache.kafka:kafka_2.13``),
run on the JVM with its jars cached under ``cache_dir()/kafka-<version>/libs`` (fetched once by
Maven, about 45 MB). One process is both controller and broker, with a static voter set of
itself; it listens on two free loopback ports (clients, controller) and keeps its data under
``<run dir>/kafka/`` (its ``server.properties`` too) and its log in
``<run dir>/logs/kafka.log``. Readiness is a real metadata call through aiokafka's admin
client.

Settings chosen for tests (see :func:`server_properties`):

- ``auto.create.topics.enable=false``: topics exist only when a test creates them (with
  :func:`create_topic`), so a typo or a race fails loudly instead of creating a one-off topic
  with default settings. Internal topics (``__consumer_offsets``) are still created on demand.
- ``num.partitions=6``; ``offsets.topic.num.partitions=6`` and
  ``transaction.state.log.num.partitions=6`` (instead of 50) so the first consumer group and the
  first transactional producer do not wait for 50 partitions to be created;
- ``group.initial.rebalance.delay.ms=0``: a group's first join completes at once;
- ``broker.session.timeout.ms=4000`` (9 s by default): a broker restarted after a crash
  registers again after ~4 s instead of ~9 s;
- replication factor 1 / min ISR 1 for every internal topic (one broker).

Kafka 4.x only (it logs through log4j2, configured by ``kafka-log4j2.properties`` next to this
module; 3.x would need a reload4j binding instead).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from harness.errors import PrerequisiteMissing, ServiceFailed
from harness.proc import LOOPBACK, ServiceProcess, free_port, port_open
from harness.service import ManagedService, RunDir, cache_dir

KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
"""The log4j2 that ``kafka_2.13`` 4.1.1 depends on; its slf4j binding is added next to it
(Kafka's published pom brings slf4j-api and log4j-core but no binding, so without
``log4j-slf4j-impl`` the broker would log nothing)."""

LOG4J_CONFIG = Path(__file__).with_name("kafka-log4j2.properties")

_READY_TIMEOUT_S = 60.0
_STOP_GRACE_S = 15.0
_MVN_TIMEOUT_S = 900.0
_FORMAT_TIMEOUT_S = 120.0
_OUTPUT_TAIL_CHARS = 3000

# The broker: 512 MB heap; the serial collector suits a small heap on a 2-core machine (no GC
# threads competing with the tests). C1-only (-XX:TieredStopAtLevel=1) would start it ~0.4 s
# sooner (measured: ready in 1.6 s instead of 2.0-2.3 s) but slows it for good; C2 stays on.
_BROKER_JVM_OPTS = ("-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
# The storage formatter runs for half a second: C1 only saves ~0.1 s of it (0.53 vs 0.65 s).
_TOOL_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rowbatch</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka_version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j_version}</version>
    </dependency>
  </dependencies>
</project>
"""

T = TypeVar("T")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # mvn colours its errors even with -B


@dataclass(frozen=True)
class KafkaEndpoint:
    """Where the broker listens. ``pid`` is the JVM's; a restart gives a new endpoint with the
    same address and log dir but a new pid."""

    bootstrap_servers: str
    """``127.0.0.1:PORT``, the PLAINTEXT listener; the value for ``bootstrap_servers``."""
    log_dir: Path
    """The broker's data (``log.dirs``): partitions, the metadata log, ``meta.properties``."""
    pid: int


# --- jars ------------------------------------------------------------------------------------


def _require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise PrerequisiteMissing(
            "java (a JRE >= 17, to run the Kafka broker)",
            "apt-get install -y openjdk-17-jre-headless",
        )
    return java


def _libs_complete(libs: Path, version: str) -> bool:
    return (libs / f"kafka_2.13-{version}.jar").is_file() and any(
        libs.glob("log4j-slf4j-impl-*.jar")
    )


def kafka_libs(version: str = KAFKA_VERSION, log4j_version: str = LOG4J_VERSION) -> Path:
    """The folder of the broker's jars, fetched with Maven on first use.

    Maven downloads into a temporary folder next to the cache entry, which is then renamed into
    place in one step: a cache folder that exists is complete, and an interrupted download
    leaves nothing that looks like one.
    """
    target = cache_dir() / f"kafka-{version}" / "libs"
    if _libs_complete(target, version):
        return target
    if target.exists():  # not ours to trust: an old layout or a hand-made folder
        shutil.rmtree(target)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise PrerequisiteMissing(
            f"mvn (Maven, to fetch the Kafka {version} jars from Maven Central once)",
            "apt-get install -y maven",
        )
    _require_java()  # Maven itself runs on the JVM
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
        work = Path(tmp)
        (work / "pom.xml").write_text(
            _POM.format(kafka_version=version, log4j_version=log4j_version), encoding="utf-8"
        )
        staged = work / "libs"
        argv = [
            mvn,
            "-q",
            "-B",
            "-Dstyle.color=never",
            "-f",
            str(work / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staged}",
        ]
        try:
            done = subprocess.run(
                argv,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=_MVN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise PrerequisiteMissing(
                f"the Kafka {version} jars (mvn did not finish in {_MVN_TIMEOUT_S:.0f} s)",
                "reach Maven Central (https://repo.maven.apache.org) or a mirror set in "
                "~/.m2/settings.xml",
            ) from exc
        if done.returncode != 0 or not _libs_complete(staged, version):
            output = _mvn_errors(done.stdout + done.stderr)
            raise PrerequisiteMissing(
                f"the Kafka {version} jars: `mvn dependency:copy-dependencies` failed "
                f"(exit {done.returncode}); cannot reach Maven Central, or no such version? "
                f"mvn said:\n{output}",
                "reach Maven Central (https://repo.maven.apache.org) or a mirror set in "
                f"~/.m2/settings.xml, or copy the jars of a Kafka {version} release into {target}",
            )
        try:
            staged.rename(target)
        except OSError:
            # Another process finished the same download first; theirs is as good as ours.
            if not _libs_complete(target, version):
                raise
    return target


def _mvn_errors(output: str) -> str:
    """mvn's output without colours and without its generic "re-run with -X" advice."""
    boilerplate = ("-e switch", "-X switch", "For more information", "[Help 1] http")
    lines = [
        line
        for line in _ANSI.sub("", output).splitlines()
        if line.strip() not in ("", "[ERROR]") and not any(b in line for b in boilerplate)
    ]
    return "\n".join(lines)[-_OUTPUT_TAIL_CHARS:]


# --- configuration ---------------------------------------------------------------------------


def server_properties(
    port: int,
    controller_port: int,
    log_dir: Path,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The broker's ``server.properties``: single-node KRaft with a static voter, on loopback."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
        "listeners": f"PLAINTEXT://{LOOPBACK}:{port},CONTROLLER://{LOOPBACK}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(log_dir),
        "num.partitions": "6",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "6",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "6",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # After a crash (SIGKILL) the new broker process can only register once the old one's
        # session has expired: 4 s instead of 9 s. Heartbeats every 0.5 s (default 2 s) keep
        # that well clear of a busy 2-core machine.
        "broker.session.timeout.ms": "4000",
        "broker.heartbeat.interval.ms": "500",
    }
    props.update(overrides or {})
    return props


def _write_properties(path: Path, props: Mapping[str, str]) -> None:
    lines = ["# Written by harness/kafka.py; rewritten on every start."]
    lines += [f"{key}={value}" for key, value in props.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def random_cluster_id() -> str:
    """What ``kafka-storage random-uuid`` prints (Kafka's ``Uuid.randomUuid().toString()``:
    16 random bytes, URL-safe base64 without padding, never starting with ``-``), made here to
    save a JVM start."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        if not text.startswith("-"):
            return text


# --- client calls ----------------------------------------------------------------------------


def _run_in_fresh_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion on a new event loop in a worker thread, so the blocking
    launcher also works when called from async code (a test that restarts the broker)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-harness") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def admin_client(bootstrap_servers: str, request_timeout_ms: int = 10_000) -> Any:
    """An (unstarted) aiokafka admin client for the broker; ``await client.start()``, and
    ``await client.close()`` when done."""
    return AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id="rowbatch-harness",
        request_timeout_ms=request_timeout_ms,
    )


async def _broker_answers(bootstrap_servers: str) -> bool:
    admin = admin_client(bootstrap_servers, request_timeout_ms=3000)
    try:
        async with asyncio.timeout(5):
            await admin.start()
            cluster = await admin.describe_cluster()
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        await admin.close()
    return bool(cluster.get("brokers"))


async def create_topic(
    endpoint: KafkaEndpoint,
    name: str,
    partitions: int = 6,
    *,
    configs: Mapping[str, str] | None = None,
    exist_ok: bool = False,
    timeout_s: float = 30.0,
) -> None:
    """Create a topic (replication factor 1) and wait until every partition has a leader, so
    producing to it right away cannot race the creation. ``configs``: topic configs, e.g.
    ``{"retention.ms": "60000"}``. ``exist_ok``: an existing topic with the same partition
    count is fine (with another count it is a ``ValueError``)."""
    admin = admin_client(endpoint.bootstrap_servers)
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            topic = NewTopic(name, partitions, 1, topic_configs=dict(configs or {}))
            response = await admin.create_topics([topic], timeout_ms=int(timeout_s * 1000))
            for entry in response.topic_errors:
                code = int(entry[1])
                if code == 0 or (exist_ok and code == TopicAlreadyExistsError.errno):
                    continue
                message = entry[2] if len(entry) > 2 and entry[2] else ""
                raise for_code(code)(f"creating topic {entry[0]!r}: {message}".rstrip(": "))
            # The broker's metadata cache learns of the topic (all its partitions at once: one
            # metadata batch) a moment after the controller answers; poll it, a few ms a call.
            while True:
                led = await _partitions_led(admin, name)
                if led is not None:
                    break
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise TimeoutError(
            f"creating topic {name!r} on {endpoint.bootstrap_servers}: "
            f"not done in {timeout_s:.0f} s"
        ) from None
    finally:
        await admin.close()
    if led != partitions:
        raise ValueError(f"topic {name!r} exists with {led} partitions, not {partitions}")


async def _partitions_led(admin: Any, name: str) -> int | None:
    """The topic's partition count once the broker knows it and each partition has a
    leader; None before that."""
    for topic in await admin.describe_topics([name]):
        if topic["topic"] != name or topic["error_code"] != 0:
            return None
        parts = topic["partitions"]
        if parts and all(p["error_code"] == 0 and p["leader"] >= 0 for p in parts):
            return len(parts)
    return None


# --- the service -----------------------------------------------------------------------------


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
        java = _require_java()
        libs = kafka_libs(self._version)
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
        _write_properties(
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
                f"{output[-_OUTPUT_TAIL_CHARS:]}"
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


def _ready(bootstrap_servers: str, port: int) -> bool:
    """A real metadata call answers and lists the broker. The port probe first keeps aiokafka
    from logging a connection error for every early poll."""
    if not port_open(port):
        return False
    return _run_in_fresh_loop(lambda: _broker_answers(bootstrap_servers))


__all__ = [
    "KAFKA_VERSION",
    "KafkaEndpoint",
    "KafkaService",
    "create_topic",
    "kafka_libs",
    "random_cluster_id",
    "server_properties",
]
