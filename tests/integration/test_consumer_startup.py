"""A consumer process waiting at start-up (no inference server answers yet): it is alive for
a liveness probe (``/healthz`` 200) but not ready (``/readyz`` 503), and SIGTERM ends it at
once with exit 0 instead of after the start-up wait (``model.startup_wait_s``, 300 s here).
No broker or model server is needed: the wait comes before either is used."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from harness.consumer_process import ConsumerProcess, to_toml
from harness.proc import free_port

_WAIT_S = 30.0


def _poll(proc: ConsumerProcess, path: str, want: int) -> None:
    deadline = time.monotonic() + _WAIT_S
    while proc._get(path)[0] != want:
        proc.check_alive(f"{path} answering {want}")
        assert time.monotonic() < deadline, f"{path} never answered {want}:\n{proc.log()}"
        time.sleep(0.1)


def test_waiting_for_the_model_server_is_alive_not_ready_and_stops_at_once(
    tmp_path: Path,
) -> None:
    port = free_port()
    config = {
        "source": {"kind": "pubsub", "subscription": "projects/p/subscriptions/never-read"},
        "model": {"url": f"127.0.0.1:{free_port()}", "name": "scorer", "startup_wait_s": 300},
        "binding": {"inputs": {"x": "X"}, "outputs": {"Y": "y"}},
        "sink": {"kind": "sqlite", "path": str(tmp_path / "r.sqlite"), "table": "t"},
        "server": {"port": port},
        "log_format": "text",
    }
    config_path = tmp_path / "consumer.toml"
    config_path.write_text(to_toml(config))
    # The source is never reached (the model server is waited for first), but the Pub/Sub
    # credentials are checked up front: an emulator address needs none.
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROWBATCH_")}
    env["PUBSUB_EMULATOR_HOST"] = f"127.0.0.1:{free_port()}"
    proc = ConsumerProcess("waiting", config_path, tmp_path / "consumer.log", port, env=env)
    proc.start()
    try:
        _poll(proc, "/healthz", 200)
        assert proc._get("/readyz")[0] == 503
        assert "still unavailable" not in proc.log()  # it is waiting, not given up
        proc.send(signal.SIGTERM)
        sent = time.monotonic()
        assert proc.wait(_WAIT_S) == 0, proc.log()
        assert time.monotonic() - sent < 10, proc.log()
        assert "stopped during start-up" in proc.log()
    finally:
        proc.stop()
