"""Google Cloud Pub/Sub for tests and the local stack.

Prefers Google's official emulator (Debian package ``google-cloud-cli-pubsub-emulator``); when
that binary is absent it falls back to Google's Go fake ``pstest``, built once from the Go module
proxy into the cache. ``PubSubEndpoint.kind`` says which one ran. Force one with
``ROWBATCH_PUBSUB=emulator|pstest``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc
from google.api_core import exceptions as gexc
from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from harness.errors import PrerequisiteMissing, ServiceFailed
from harness.proc import LOOPBACK, ServiceProcess, free_port
from harness.service import ManagedService, RunDir, cache_dir

EMULATOR_BIN = Path("/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator")
PSTEST_MODULE = "cloud.google.com/go/pubsub/v2"
PSTEST_VERSION = "v2.9.0"
DEFAULT_PROJECT = "rowbatch-local"
_READY_TIMEOUT_S = 60.0

PubSubKind = Literal["emulator", "pstest"]

_PSTEST_MAIN = """package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"cloud.google.com/go/pubsub/v2/pstest"
)

func main() {
	srv := pstest.NewServerWithAddress(os.Args[1])
	fmt.Println("pstest listening on", srv.Addr)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
	_ = srv.Close()
}
"""


@dataclass(frozen=True)
class PubSubEndpoint:
    """Where the Pub/Sub service listens; clients find it through ``PUBSUB_EMULATOR_HOST``."""

    host: str
    """``127.0.0.1:PORT``; the value for ``PUBSUB_EMULATOR_HOST``."""
    project: str
    """Project id to create topics and subscriptions in (any name of 3+ characters works)."""
    kind: PubSubKind
    """Which implementation runs: Google's official emulator, or the Go ``pstest`` fake."""

    def env(self) -> dict[str, str]:
        return {"PUBSUB_EMULATOR_HOST": self.host, "PUBSUB_PROJECT_ID": self.project}

    def publisher(self) -> pubsub_v1.PublisherClient:
        """A publisher bound to this endpoint, whatever the process environment says."""
        transport = PublisherGrpcTransport(channel=self._channel())
        return pubsub_v1.PublisherClient(transport=transport)

    def subscriber(self) -> pubsub_v1.SubscriberClient:
        transport = SubscriberGrpcTransport(channel=self._channel())
        return pubsub_v1.SubscriberClient(transport=transport)

    def _channel(self) -> grpc.Channel:
        # No 4 MiB cap: streaming-pull responses carry up to ~10 MB of messages.
        return grpc.insecure_channel(
            self.host,
            options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)],
        )


def _choose_kind() -> PubSubKind:
    forced = os.environ.get("ROWBATCH_PUBSUB", "").strip().lower()
    if forced in ("emulator", "pstest"):
        return "emulator" if forced == "emulator" else "pstest"
    if forced:
        raise ValueError(f"ROWBATCH_PUBSUB must be 'emulator' or 'pstest', not {forced!r}")
    return "emulator" if EMULATOR_BIN.exists() else "pstest"


def _build_pstest() -> Path:
    """Build the pstest server once into the cache (needs Go and the Go module proxy)."""
    target = cache_dir() / f"pstest-{PSTEST_VERSION}" / "pstest-server"
    if target.exists():
        return target
    go = shutil.which("go")
    if go is None:
        raise PrerequisiteMissing(
            "the Pub/Sub emulator (google-cloud-cli-pubsub-emulator), or Go for pstest",
            "install the Debian package google-cloud-cli-pubsub-emulator, or Go from go.dev",
        )
    with tempfile.TemporaryDirectory(prefix="pstest-build-") as tmp:
        src = Path(tmp)
        (src / "main.go").write_text(_PSTEST_MAIN)
        steps = [
            [go, "mod", "init", "rowbatch/pstest"],
            [go, "get", f"{PSTEST_MODULE}@{PSTEST_VERSION}"],
            [go, "mod", "tidy"],
            [go, "build", "-o", str(src / "pstest-server"), "."],
        ]
        for argv in steps:
            done = subprocess.run(argv, cwd=src, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise PrerequisiteMissing(
                    f"a pstest build ({' '.join(argv[1:])} failed: {done.stderr.strip()[-800:]})",
                    "reach the Go module proxy, or install google-cloud-cli-pubsub-emulator",
                )
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_suffix(".tmp")
        shutil.copy2(src / "pstest-server", staged)
        staged.replace(target)
    return target


class PubSubService(ManagedService[PubSubEndpoint]):
    name = "pubsub"

    def __init__(self, run: RunDir, project: str = DEFAULT_PROJECT, heap: str = "512m") -> None:
        """``heap`` is the emulator JVM's -Xmx: 512m suits tests; a benchmark that publishes
        millions of messages over an hour passes more (the emulator keeps every topic's
        messages in memory until it is deleted)."""
        if not re.fullmatch(r"[1-9][0-9]*[mg]", heap):
            raise ValueError(f"heap {heap!r}: a JVM size such as 512m or 2g")
        self._run = run
        self._project = project
        self._heap = heap
        self._proc: ServiceProcess | None = None

    def _argv(self, kind: PubSubKind, port: int) -> list[str]:
        if kind == "emulator":
            if shutil.which("java") is None:
                raise PrerequisiteMissing(
                    "java (the Pub/Sub emulator runs on the JVM)",
                    "apt-get install -y openjdk-17-jre-headless",
                )
            return [str(EMULATOR_BIN), f"--host={LOOPBACK}", f"--port={port}"]
        return [str(_build_pstest()), f"{LOOPBACK}:{port}"]

    def start(self) -> PubSubEndpoint:
        kind = _choose_kind()
        port = free_port()
        endpoint = PubSubEndpoint(host=f"{LOOPBACK}:{port}", project=self._project, kind=kind)
        data = self._run.data("pubsub")
        self._proc = ServiceProcess(
            name=f"pubsub ({kind})",
            argv=self._argv(kind, port),
            log_path=self._run.log("pubsub"),
            cwd=data,
            env={**os.environ, "JAVA_TOOL_OPTIONS": f"-Xmx{self._heap}"},
        )
        self._proc.start()
        self._proc.wait_ready(lambda: _answers(endpoint), timeout_s=_READY_TIMEOUT_S)
        return endpoint

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.stop()
            self._proc = None


def _answers(endpoint: PubSubEndpoint) -> bool:
    """Ready when a real ListTopics call answers."""
    client = endpoint.publisher()
    try:
        list(client.list_topics(request={"project": f"projects/{endpoint.project}"}, timeout=2))
    except (gexc.GoogleAPICallError, gexc.RetryError):
        return False
    finally:
        client.transport.close()
    return True


__all__ = ["PubSubEndpoint", "PubSubService", "ServiceFailed"]
