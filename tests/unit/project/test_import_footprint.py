"""Start-up footprint: the consumer's entry point imports neither broker's client library; the
configured source imports its own (the Pub/Sub client alone is ~28 MiB of RSS, aiokafka ~10),
so a Kafka consumer never carries Google's client and the other way round (docs/memory.md).
The Pub/Sub pull source (the default mode) talks to Pub/Sub on a channel of its own and
imports none of google-cloud-pubsub's client layers (~22 MiB of RSS at start-up).
Nor does it import table mode's readers and pyarrow's compute, CSV and JSON modules (~9 MiB
together), which the ``table`` command imports when it runs. Checked in a fresh interpreter,
since this one's test modules have imported them already."""

from __future__ import annotations

import subprocess
import sys

BROKER_CLIENTS = ("google.cloud.pubsub_v1", "aiokafka", "psycopg")
TABLE_MODE = (
    "pyarrow.compute",
    "pyarrow.csv",
    "pyarrow.json",
    "rowbatch.tables",
    "rowbatch.consumer.sources.table.source",
)


def loaded(modules: tuple[str, ...], *imports: str) -> str:
    """Which of ``modules`` a fresh interpreter has loaded once it imported ``imports``."""
    probe = (
        f"import sys, {', '.join(imports)}\n"
        f"print(','.join(m for m in {modules!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.strip()


def test_the_consumer_cli_imports_no_broker_client() -> None:
    assert loaded(BROKER_CLIENTS, "rowbatch.consumer.service.cli") == ""


def test_the_cli_and_the_parquet_sink_import_nothing_of_table_mode() -> None:
    assert (
        loaded(TABLE_MODE, "rowbatch.consumer.service.cli", "rowbatch.consumer.sinks.parquet.sink")
        == ""
    )


GOOGLE_CLIENT_LAYERS = (
    "google.cloud.pubsub_v1",
    "google.pubsub_v1",
    "proto",
    "google.api_core.retry",
    "google.api_core.grpc_helpers_async",
    "google.auth.transport.requests",
)


def test_the_pubsub_pull_source_imports_none_of_the_client_librarys_layers() -> None:
    assert loaded(GOOGLE_CLIENT_LAYERS, "rowbatch.consumer.sources.pubsub.pull") == ""
