"""Session fixtures: each real service is started once, on first use, and stopped at the end
(also when tests fail). Logs stay under ``.stack/test-runs/<session>/logs/`` for debugging."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.service import REPO_ROOT, RunDir

# No test, and no process a test starts (they inherit this environment), may look for Google
# credentials on the GCE metadata server (169.254.169.254): only loopback is ever a target.
# Tests that need credentials use the emulator (PUBSUB_EMULATOR_HOST) instead.
os.environ.setdefault("NO_GCE_CHECK", "true")
os.environ.setdefault("GCE_METADATA_HOST", "127.0.0.1:9")
os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")

if TYPE_CHECKING:
    from harness.jaeger import JaegerEndpoint
    from harness.kafka import KafkaEndpoint
    from harness.llama import LlamaEndpoint
    from harness.postgres import PostgresEndpoint
    from harness.pubsub import PubSubEndpoint
    from harness.s3 import S3Endpoint
    from harness.triton import TritonEndpoint


_KEEP_RUNS = 5


def _session_alive(run_name: str) -> bool:
    """Whether the test session that made ``<time>-<pid>`` is still running."""
    pid = run_name.rpartition("-")[2]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="session")
def run_dir() -> Iterator[RunDir]:
    """A directory of this test session's own (two sessions at once never share one); the
    last few sessions' logs are kept under ``.stack/test-runs/``."""
    runs = REPO_ROOT / ".stack" / "test-runs"
    runs.mkdir(parents=True, exist_ok=True)
    for old in sorted(runs.iterdir())[:-_KEEP_RUNS]:
        if not _session_alive(old.name):  # never a running session's (its Kafka's data...)
            shutil.rmtree(old, ignore_errors=True)
    root = runs / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    root.mkdir()
    yield RunDir(root)
    # Data dirs go; logs stay for debugging a failed run.
    for child in root.iterdir():
        if child.name != "logs":
            shutil.rmtree(child, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka(run_dir: RunDir) -> Iterator[KafkaEndpoint]:
    from harness.kafka import KafkaService

    with KafkaService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def pubsub(run_dir: RunDir) -> Iterator[PubSubEndpoint]:
    from harness.pubsub import PubSubService

    with PubSubService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def triton(run_dir: RunDir) -> Iterator[TritonEndpoint]:
    from harness.triton import TritonService

    with TritonService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def postgres(run_dir: RunDir) -> Iterator[PostgresEndpoint]:
    from harness.postgres import PostgresService

    with PostgresService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def s3(run_dir: RunDir) -> Iterator[S3Endpoint]:
    from harness.s3 import S3Service

    with S3Service(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def jaeger(run_dir: RunDir) -> Iterator[JaegerEndpoint]:
    from harness.jaeger import JaegerService

    with JaegerService(run_dir) as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def llama(run_dir: RunDir) -> Iterator[LlamaEndpoint]:
    """llama-cpp-python's OpenAI-compatible server on a tiny local model (harness/llama.py);
    its first use on a machine waits for the llama venv's build (scripts/test.sh starts it)."""
    from harness.llama import LlamaService

    with LlamaService(run_dir) as endpoint:
        yield endpoint


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent.name == "integration":
            item.add_marker(pytest.mark.integration)
    # The tests on the llama server run last: on a fresh machine its venv is still compiling
    # in the background (scripts/test.sh) while the others run.
    items.sort(key=lambda item: "llama" in getattr(item, "fixturenames", ()))
