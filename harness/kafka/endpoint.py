"""Where a harness Kafka broker listens: the value its launcher returns and topic helpers take."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class KafkaEndpoint:
    """Where the broker listens. ``pid`` is the JVM's; a restart gives a new endpoint with the
    same address and log dir but a new pid."""

    bootstrap_servers: str
    """``127.0.0.1:PORT``, the PLAINTEXT listener; the value for ``bootstrap_servers``."""
    log_dir: Path
    """The broker's data (``log.dirs``): partitions, the metadata log, ``meta.properties``."""
    pid: int
