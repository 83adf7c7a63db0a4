"""Start-up footprint: the consumer's entry point imports neither broker's client library; the
configured source imports its own (the Pub/Sub client alone is ~28 MiB of RSS, aiokafka ~10),
so a Kafka consumer never carries Google's client and the other way round (docs/memory.md)."""

from __future__ import annotations

import subprocess
import sys

BROKER_CLIENTS = ("google.cloud.pubsub_v1", "aiokafka")


def test_the_consumer_cli_imports_no_broker_client() -> None:
    probe = (
        "import sys, rowbatch.consumer.service.cli\n"
        f"print(','.join(m for m in {BROKER_CLIENTS!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == ""
