"""The README's main job (``scripts/demo.sh``, ``python -m harness demo``) on both brokers,
against the session's real services, at a small size."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.demo import Broker, DemoSettings, run_demo
from harness.kafka import KafkaEndpoint
from harness.postgres import PostgresEndpoint
from harness.pubsub import PubSubEndpoint
from harness.stack import StackEndpoints
from harness.triton import TritonEndpoint


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("broker", "sink"), [("pubsub", "sqlite"), ("kafka", "postgres")])
def test_the_demo_writes_every_valid_row_and_dead_letters_the_malformed_messages(
    broker: Broker,
    sink: str,
    kafka: KafkaEndpoint,
    pubsub: PubSubEndpoint,
    triton: TritonEndpoint,
    postgres: PostgresEndpoint,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for key, value in pubsub.env().items():
        monkeypatch.setenv(key, value)  # run_demo sets them; restored after the test
    stack = StackEndpoints(kafka, pubsub, triton, postgres, startup_s={})
    settings = DemoSettings(
        rows=6_000,
        chunk_rows=200,
        malformed=0.1,
        sink=sink,
        broker=broker,
        sqlite_dir=tmp_path,
    )
    result = run_demo(stack, settings)
    out = capsys.readouterr().out
    assert result.malformed_messages >= 2
    assert result.rows_written == result.valid_rows == 6_000 - 200 * result.malformed_messages
    assert result.dead_lettered == result.malformed_messages
    assert "rows written" in out
    assert ("Kafka" in out) == (broker == "kafka")
