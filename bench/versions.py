"""The versions a figure depends on, for the report header and the JSON."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from importlib import metadata

import numpy as np
import tritonclient.grpc as grpcclient

from harness.kafka import KAFKA_VERSION
from harness.pubsub import EMULATOR_BIN, PSTEST_VERSION
from harness.stack import StackEndpoints
from rowbatch.consumer import __version__ as rowbatch_version


def _package(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _triton(url: str) -> str:
    client = grpcclient.InferenceServerClient(url)
    try:
        return str(client.get_server_metadata(as_json=True).get("version", "?"))
    finally:
        with contextlib.suppress(Exception):
            client.close()


def _emulator(stack: StackEndpoints) -> str:
    if stack.pubsub.kind == "pstest":
        return f"pstest {PSTEST_VERSION}"
    jars = sorted((EMULATOR_BIN.parent.parent / "lib").glob("cloud-pubsub-emulator-*.jar"))
    name = (
        jars[-1].stem.removeprefix("cloud-pubsub-emulator-").removesuffix("-all") if jars else "?"
    )
    return f"emulator {name}"


def collect(stack: StackEndpoints) -> dict[str, str]:
    return {
        "rowbatch": rowbatch_version,
        "triton": _triton(stack.triton.grpc_url),
        "kafka": KAFKA_VERSION,
        "pubsub": _emulator(stack),
        "postgresql": _postgres(stack),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": _package("pyarrow"),
        "tritonclient": _package("tritonclient"),
        "aiokafka": _package("aiokafka"),
        "google-cloud-pubsub": _package("google-cloud-pubsub"),
        "psycopg": _package("psycopg"),
        "cpus": str(os.cpu_count()),
        "platform": f"{sys.platform} {platform.machine()}",
    }


def _postgres(stack: StackEndpoints) -> str:
    import psycopg  # noqa: PLC0415

    with psycopg.connect(stack.postgres.dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]).split()[0] if row else "?"
