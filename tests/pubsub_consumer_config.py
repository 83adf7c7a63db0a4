"""A consumer configuration with a Pub/Sub source whose model server is never reached
(``127.0.0.1:1``, no start-up wait): for tests of what happens before the source starts."""

from __future__ import annotations

from pathlib import Path


def pubsub_consumer_config(tmp_path: Path, project: str) -> Path:
    """Writes ``consumer.toml`` for subscription ``projects/<project>/subscriptions/rows-sub``
    into ``tmp_path`` and returns its path."""
    path = tmp_path / "consumer.toml"
    path.write_text(
        f"""
[source]
kind = "pubsub"
subscription = "projects/{project}/subscriptions/rows-sub"
topic = "projects/{project}/topics/rows"
dead_letter_topic = "projects/{project}/topics/rows-dlq"

[model]
url = "127.0.0.1:1"
name = "scorer"
startup_wait_s = 0

[binding]
inputs = {{ FEATURES = "features" }}
outputs = {{ SCORE = "score" }}

[sink]
kind = "sqlite"
path = "{tmp_path / "out.sqlite"}"
table = "scores"
"""
    )
    return path
