"""What the consumer's command loads before it knows its config: not table mode's readers and
not pyarrow's compute, CSV and JSON modules (~9 MiB of RSS together), nor a broker client,
which the sources and sinks that need them import themselves. Checked in a fresh interpreter,
since this one's test modules have imported them already."""

from __future__ import annotations

import subprocess
import sys

NOT_AT_START = (
    "pyarrow.compute",
    "pyarrow.csv",
    "pyarrow.json",
    "rowbatch.wire.readers",
    "rowbatch.consumer.sources.table.source",
    "aiokafka",
    "google.cloud.pubsub_v1",
    "psycopg",
)


def test_the_command_line_loads_only_what_every_command_needs() -> None:
    code = (
        "import sys, rowbatch.consumer.service.cli, rowbatch.consumer.sinks.parquet.sink\n"
        f"print(sorted(m for m in {NOT_AT_START!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
