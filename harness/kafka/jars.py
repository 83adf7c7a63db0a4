"""The JVM and the Kafka broker's jars: ``org.apache.kafka:kafka_2.13`` from Maven Central,
fetched once by Maven (about 45 MB) into ``cache_dir()/kafka-<version>/libs``.

Kafka 4.x only (it logs through log4j2; 3.x would need a reload4j binding instead).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Final

from harness.errors import PrerequisiteMissing
from harness.service import cache_dir

KAFKA_VERSION = "4.1.1"
"""The broker every test and the local stack run, unless a launcher names another version."""
LOG4J_VERSION = "2.24.3"
"""The log4j2 that ``kafka_2.13`` 4.1.1 depends on; its slf4j binding is added next to it
(Kafka's published pom brings slf4j-api and log4j-core but no binding, so without
``log4j-slf4j-impl`` the broker would log nothing)."""

SHARE_KAFKA_VERSION = "4.4.0"
"""The broker of the share-group (KIP-932) tests: 4.1.1 has share groups off (its
``share.version=1`` needs an unstable metadata version) and confluent-kafka's ShareConsumer
wants >= 4.2; a fresh 4.4.0 format has ``share.version=2`` with no flag."""
SHARE_LOG4J_VERSION = "2.25.5"
"""The log4j2 that ``kafka-server`` 4.4.0's pom depends on (log4j-api and log4j-core)."""

LOG4J_VERSIONS: Final[Mapping[str, str]] = MappingProxyType(
    {KAFKA_VERSION: LOG4J_VERSION, SHARE_KAFKA_VERSION: SHARE_LOG4J_VERSION}
)
"""The log4j2 each Kafka version that the harness runs depends on; another version gets
:data:`LOG4J_VERSION` unless its caller names one (:func:`kafka_libs`)."""

#: How much of a failed tool's output (mvn, kafka-storage) an error message quotes.
OUTPUT_TAIL_CHARS: Final = 3000

_MVN_TIMEOUT_S = 900.0

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

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # mvn colours its errors even with -B


def _require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise PrerequisiteMissing(
            "java (a JRE >= 17, to run the Kafka broker)",
            "apt-get install -y openjdk-17-jre-headless",
        )
    return java


def broker_runtime(version: str = KAFKA_VERSION) -> tuple[str, Path]:
    """What running the broker takes: the ``java`` executable and the folder of the broker's
    jars (fetched on first use, :func:`kafka_libs`)."""
    java = _require_java()
    return java, kafka_libs(version)


def _libs_complete(libs: Path, version: str) -> bool:
    return (libs / f"kafka_2.13-{version}.jar").is_file() and any(
        libs.glob("log4j-slf4j-impl-*.jar")
    )


def log4j_version_for(version: str) -> str:
    """The log4j2 to put next to Kafka ``version``'s jars (:data:`LOG4J_VERSIONS`)."""
    return LOG4J_VERSIONS.get(version, LOG4J_VERSION)


def kafka_libs(version: str = KAFKA_VERSION, log4j_version: str | None = None) -> Path:
    """The folder of the broker's jars, fetched with Maven on first use. ``log4j_version``:
    the log4j2 whose slf4j binding goes with them (default: :func:`log4j_version_for`); each
    Kafka version has a cache folder of its own, so two versions can run side by side.

    Maven downloads into a temporary folder next to the cache entry, which is then renamed into
    place in one step: a cache folder that exists is complete, and an interrupted download
    leaves nothing that looks like one.
    """
    if log4j_version is None:
        log4j_version = log4j_version_for(version)
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
    return "\n".join(lines)[-OUTPUT_TAIL_CHARS:]
