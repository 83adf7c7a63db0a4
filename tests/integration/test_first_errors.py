"""The errors a new user hits first, through the real command lines: without Google credentials
and without PUBSUB_EMULATOR_HOST the producer and the consumer (run, check, admin ensure) exit
2 with one line naming what to set, never google-auth's traceback; with an emulator host that
nothing answers on, the errors name that host:port, not Google's endpoint.

Each command runs with an empty HOME (no gcloud credentials file), no GOOGLE_* or PUBSUB_*
variables, and google-auth's metadata-server lookup turned off and pointed at a closed port on
127.0.0.1, so nothing leaves the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.proc import free_port
from rowbatch.consumer.sources.pubsub.errors import PubSubUnreachable
from rowbatch.consumer.sources.pubsub.pull import PubSubPullSource
from rowbatch.consumer.sources.pubsub.settings import PubSubSettings
from rowbatch.consumer.sources.pubsub.streaming import PubSubSource
from tests.pubsub_consumer_config import pubsub_consumer_config

pytestmark = pytest.mark.timeout(180)

BIN = Path(sys.executable).parent
PROJECT = "first-errors"
SUBSCRIPTION = f"projects/{PROJECT}/subscriptions/rows-sub"
_DROPPED = ("GOOGLE_", "PUBSUB_", "CLOUDSDK_", "GCE_", "ROWBATCH_", "KAFKA_")


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    return free_port()


@pytest.fixture
def bare_env(tmp_path: Path, closed_port: int) -> Iterator[dict[str, str]]:
    """The environment of a machine that was never given Google credentials."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env.update(
        HOME=str(home),
        NO_GCE_CHECK="true",
        GCE_METADATA_HOST=f"127.0.0.1:{closed_port}",
        GCE_METADATA_IP=f"127.0.0.1:{closed_port}",
        GCE_METADATA_TIMEOUT="1",
    )
    env.pop("XDG_CONFIG_HOME", None)
    yield env


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return pubsub_consumer_config(tmp_path, PROJECT)


def run(
    command: list[str], env: dict[str, str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / command[0]), *command[1:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


def producer_args(command: str, tmp_path: Path) -> list[str]:
    if command == "publish":
        data = tmp_path / "rows.csv"
        data.write_text("id,text\n1,a\n2,b\n")
        first = ["publish", "--file", str(data)]
    else:
        first = ["loadgen", "--rows", "10"]
    return ["rowbatch-producer", *first, "--broker", "pubsub", "--project", PROJECT]


@pytest.mark.parametrize(
    "command",
    ["producer publish", "producer loadgen", "consumer run", "consumer check", "admin ensure"],
)
def test_without_credentials_one_line_names_what_to_set(
    command: str, bare_env: dict[str, str], config: Path, tmp_path: Path
) -> None:
    side, sub = command.split()
    if side == "producer":
        argv = [*producer_args(sub, tmp_path), "--topic", "rows"]
        prefix = f"rowbatch-producer {sub}: error: "
    else:
        action = ["admin", "ensure"] if side == "admin" else [sub]
        argv = ["rowbatch-consumer", *action, "--config", str(config)]
        prefix = "error: "
    done = run(argv, bare_env, tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith(f"{prefix}no Google Cloud credentials for Pub/Sub project '{PROJECT}'")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line
    assert "PUBSUB_EMULATOR_HOST" in line
    assert done.stdout == ""


def test_producer_names_an_unreachable_emulator(
    bare_env: dict[str, str], closed_port: int, tmp_path: Path
) -> None:
    emulator = f"127.0.0.1:{closed_port}"
    argv = [*producer_args("loadgen", tmp_path), "--topic", "rows", "--connect-timeout", "1"]
    done = run(argv, {**bare_env, "PUBSUB_EMULATOR_HOST": emulator}, tmp_path)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"cannot reach Pub/Sub at {emulator}" in lines[0]
    assert "googleapis" not in done.stderr


def test_admin_ensure_names_an_unreachable_emulator(
    bare_env: dict[str, str], closed_port: int, config: Path, tmp_path: Path
) -> None:
    emulator = f"127.0.0.1:{closed_port}"
    argv = ["rowbatch-consumer", "admin", "ensure", "--config", str(config), "--timeout", "1"]
    done = run(argv, {**bare_env, "PUBSUB_EMULATOR_HOST": emulator}, tmp_path)
    assert done.returncode == 4, done.stderr  # the broker did not answer
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"error: Pub/Sub at {emulator} did not answer within 1 s")
    assert "googleapis" not in done.stderr


@pytest.mark.parametrize("mode", ["pull", "streaming"])
async def test_the_sources_check_names_an_unreachable_emulator(
    mode: str, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator = f"127.0.0.1:{closed_port}"
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator)
    source: PubSubPullSource | PubSubSource
    if mode == "pull":
        source = PubSubPullSource(PubSubSettings(subscription=SUBSCRIPTION, check_timeout_s=1.0))
    else:
        source = PubSubSource(PubSubSettings(subscription=SUBSCRIPTION, check_timeout_s=1.0))
    try:
        assert source.host == emulator
        with pytest.raises(PubSubUnreachable) as caught:
            await source.check()
    finally:
        await source.close()
    message = str(caught.value)
    assert message.startswith(f"Pub/Sub at {emulator} did not answer within 1 s"), message
    assert "googleapis" not in message
